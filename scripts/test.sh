#!/usr/bin/env bash
# Runs every test of the workspace: unit, property, integration (real brokers on loopback,
# real RocksDB in temp dirs) and doc tests. Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
# libclang-dev: RocksDB's bindings; mosquitto: the external-broker and crash tests.
need_packages libclang-dev mosquitto
cargo test --release --workspace "$@"
