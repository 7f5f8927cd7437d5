#!/usr/bin/env bash
# The HTTP step of compare.sh once, optionally under `perf record`: BINARY serves a fresh store
# (auth off, loopback, WRITE_BUFFER_MB write buffer) and the shared load.py posts LP_FILE to its
# `/write?precision=ms` (4 workers × 5000 lines). Prints the lines stored, points/s, server CPU
# seconds and wall seconds; with `perf`, leaves OUT/LABEL/perf.data (FREQ Hz, call graphs) and
# OUT/LABEL/script.txt (`perf script`), for per-thread shares.
#
#   bash scripts/peers/profile-http.sh BINARY LABEL LP_FILE [perf]
#
# Environment: OUT (default /tmp/hg-prof), FREQ (default 999), WRITE_BUFFER_MB (default 128, the default),
# PEERS_DIR (default ../shared/peers).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PEERS_DIR=${PEERS_DIR:-$HERE/../../../shared/peers}
BIN=${1:?usage: profile-http.sh BINARY LABEL LP_FILE [perf]}
LABEL=${2:?usage: profile-http.sh BINARY LABEL LP_FILE [perf]}
FILE=${3:?usage: profile-http.sh BINARY LABEL LP_FILE [perf]}
MODE=${4:-}
OUT=${OUT:-/tmp/hg-prof}
FREQ=${FREQ:-999}
WBUF=${WRITE_BUFFER_MB:-128}
. "$HERE/hg_serve.sh"
dir="$OUT/$LABEL"
rm -rf "$dir"; mkdir -p "$dir"
hg_serve "$BIN" "$dir/data" "$dir/serve.log" HOURGLASS_STORAGE__WRITE_BUFFER_MB="$WBUF"
if [[ $MODE == perf ]]; then
  perf record -F "$FREQ" -g -p "$HG_PID" -o "$dir/perf.data" >/dev/null 2>&1 &
  perf_pid=$!
  sleep 1
fi
hg_http_load "$FILE" "$LABEL" "$dir/load.json" 60 >"$dir/load.log" 2>&1
if [[ $MODE == perf ]]; then
  kill -INT "$perf_pid"
  wait "$perf_pid" || true
fi
hg_stop
if [[ $MODE == perf ]]; then
  perf script -i "$dir/perf.data" -F comm,ip,sym >"$dir/script.txt" 2>/dev/null
fi
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], d['lines_ok'], d['points_per_s'], d['run']['server_cpu_s'], d['wall_s'])" \
  "$dir/load.json" "$LABEL"
