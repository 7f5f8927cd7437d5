#!/usr/bin/env bash
# Runs the pipeline with its embedded broker and a simulated fleet. Installs what it needs.
# Extra arguments go to `hourglass demo` (see `--help`).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
# libclang-dev: RocksDB's bindings; libssl-dev, pkg-config: librdkafka's TLS (OpenSSL).
need_packages libclang-dev libssl-dev pkg-config
cargo run --release --bin hourglass -- demo "$@"
