# syntax=docker/dockerfile:1
# Hourglass: build in the Rust image, run in a slim Debian. docker-compose.yml builds this.
# tests/operations/compose.rs checks EXPOSE and the config path against deploy/hourglass.toml.

FROM rust:1-bookworm AS builder
# libclang-dev: bindgen for RocksDB's C++ bindings (RocksDB itself is compiled from source);
# libssl-dev, pkg-config: librdkafka's TLS through the system's OpenSSL.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libclang-dev libssl-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The caches keep the registry and the RocksDB build between image builds (the first one takes
# about 25 minutes on 2 cores).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin hourglass \
    && cp target/release/hourglass /usr/local/bin/hourglass

FROM debian:bookworm-slim
# curl: the compose health check; libssl3: librdkafka's TLS (OpenSSL, linked dynamically).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates curl libssl3 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --home-dir /var/lib/hourglass --shell /usr/sbin/nologin hourglass \
    && install -d -o hourglass -g hourglass /var/lib/hourglass
COPY --from=builder /usr/local/bin/hourglass /usr/local/bin/hourglass
COPY deploy/hourglass.toml /etc/hourglass/hourglass.toml
USER hourglass
VOLUME /var/lib/hourglass
# The query service (http.listen in deploy/hourglass.toml). MQTT goes to the broker service.
EXPOSE 8080
ENTRYPOINT ["hourglass"]
CMD ["serve", "--config", "/etc/hourglass/hourglass.toml"]
