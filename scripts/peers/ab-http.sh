#!/usr/bin/env bash
# A/B of two Hourglass builds on the HTTP step of compare.sh: for each of RUNS rounds, each
# binary in turn (OLD first in odd rounds, NEW first in even ones) serves a fresh store (auth
# off, loopback, WRITE_BUFFER_MB write buffer) and the shared load.py posts the same
# line-protocol file to its `/write?precision=ms` (4 workers × 5000 lines; HTTP_WORKERS and
# HTTP_BATCH change those). Prints points/s and
# server CPU seconds per run, then the medians.
#
#   bash scripts/peers/ab-http.sh OLD_BINARY NEW_BINARY LP_FILE [RUNS]
#
# LP_FILE: the `w.lp` compare.sh records (milliseconds). Environment: OUT (default
# /tmp/hg-ab-http), WRITE_BUFFER_MB (default 128, the default), PEERS_DIR (default ../shared/peers).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PEERS_DIR=${PEERS_DIR:-$HERE/../../../shared/peers}
A=${1:?usage: ab-http.sh OLD NEW LP_FILE [RUNS]}
B=${2:?usage: ab-http.sh OLD NEW LP_FILE [RUNS]}
FILE=${3:?usage: ab-http.sh OLD NEW LP_FILE [RUNS]}
RUNS=${4:-3}
OUT=${OUT:-/tmp/hg-ab-http}
WBUF=${WRITE_BUFFER_MB:-128}
mkdir -p "$OUT"
. "$HERE/hg_serve.sh"

for r in $(seq 1 "$RUNS"); do
  # The order alternates by round: on this machine the second run of a pair tended to win.
  order="a b"; [[ $((r % 2)) == 0 ]] && order="b a"
  for side in $order; do
    bin=$A; [[ $side == b ]] && bin=$B
    dir="$OUT/$side-$r"
    rm -rf "$dir"; mkdir -p "$dir"
    hg_serve "$bin" "$dir/data" "$dir/serve.log" HOURGLASS_STORAGE__WRITE_BUFFER_MB="$WBUF"
    hg_http_load "$FILE" "$side-$r" "$dir/load.json" 60 >"$dir/load.log" 2>&1
    hg_stop
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], d['lines_ok'], d['points_per_s'], d['run']['server_cpu_s'])" \
      "$dir/load.json" "$side-$r"
  done
done | tee "$OUT/runs.txt"
python3 - "$OUT/runs.txt" "$A" "$B" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
for side, binary in (("a", sys.argv[2]), ("b", sys.argv[3])):
    mine = [r for r in rows if r[0].startswith(side + "-")]
    pts = [float(r[2]) for r in mine]
    cpu = [float(r[3]) for r in mine]
    print(f"{side} {binary}: points/s {' · '.join(f'{p:,.0f}' for p in pts)} (median {statistics.median(pts):,.0f}); "
          f"server CPU s median {statistics.median(cpu):.1f}")
PY
