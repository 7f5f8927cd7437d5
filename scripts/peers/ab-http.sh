#!/usr/bin/env bash
# A/B of two Hourglass builds on the HTTP step of compare.sh: for each of RUNS rounds, each
# binary in turn serves a fresh store (auth off, loopback, WRITE_BUFFER_MB write buffer) and the
# shared load.py posts the same line-protocol file to its `/write?precision=ms` (4 workers ×
# 5000 lines). Prints points/s and server CPU seconds per run, then the medians.
#
#   bash scripts/peers/ab-http.sh OLD_BINARY NEW_BINARY LP_FILE [RUNS]
#
# LP_FILE: the `w.lp` compare.sh records (milliseconds). Environment: OUT (default
# /tmp/hg-ab-http), WRITE_BUFFER_MB (default 256), PEERS_DIR (default ../shared/peers).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PEERS_DIR=${PEERS_DIR:-$HERE/../../../shared/peers}
A=${1:?usage: ab-http.sh OLD NEW LP_FILE [RUNS]}
B=${2:?usage: ab-http.sh OLD NEW LP_FILE [RUNS]}
FILE=${3:?usage: ab-http.sh OLD NEW LP_FILE [RUNS]}
RUNS=${4:-3}
OUT=${OUT:-/tmp/hg-ab-http}
WBUF=${WRITE_BUFFER_MB:-256}
mkdir -p "$OUT"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

for r in $(seq 1 "$RUNS"); do
  for side in a b; do
    bin=$A; [[ $side == b ]] && bin=$B
    dir="$OUT/$side-$r"
    rm -rf "$dir"; mkdir -p "$dir"
    http=$(free_port); mqtt=$(free_port)
    HOURGLASS_AUTH__ENABLED=false HOURGLASS_STORAGE__WRITE_BUFFER_MB="$WBUF" "$bin" serve --data-dir "$dir/data" \
      --http-listen "127.0.0.1:$http" --mqtt-listen "127.0.0.1:$mqtt" >"$dir/serve.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do curl -fsS -o /dev/null "http://127.0.0.1:$http/health" 2>/dev/null && break; sleep 0.2; done
    python3 "$PEERS_DIR/load.py" --target http --url "http://127.0.0.1:$http/write?precision=ms" --pid "$pid" \
      --data-dir "$dir/data" --no-flush --no-count --file "$FILE" --batch 5000 --workers 4 --load-max-wait 60 \
      --label "$side-$r" --json "$dir/load.json" >"$dir/load.log" 2>&1
    kill -TERM "$pid"
    wait "$pid" || true
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
