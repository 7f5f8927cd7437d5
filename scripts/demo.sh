#!/usr/bin/env bash
# Runs the pipeline with its embedded broker and a simulated fleet. Installs what it needs.
# Extra arguments go to `hourglass demo` (see `--help`).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
need_packages libclang-dev
cargo run --release --bin hourglass -- demo "$@"
