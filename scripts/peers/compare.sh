#!/usr/bin/env bash
# One workload measured on Hourglass, InfluxDB 1.x and VictoriaMetrics, side by side.
#
#   scripts/peers/compare.sh DEVICES DURATION [RUNS]      e.g.  scripts/peers/compare.sh 1000 1h 3
#
# 1. `hourglass bench record` writes the TSBS IoT workload (10 s interval, 1% missing, 1% late)
#    once, as a recording and as InfluxDB line protocol with its .meta.json.
# 2. Hourglass, RUNS times on a fresh store: `hourglass bench replay` of the recording through
#    MQTT (embedded broker, QoS 1, 4 connections, 100 readings a message) with the store kept,
#    the trucks placed under fleet/{fleet} first, hours closed for roll-ups and a full
#    compaction; then `hourglass serve` on that store and
#    hg_query.py (the peers' query set mapped to Hourglass's HTTP API).
# 2b. With HG_PATHS containing `http`: Hourglass, RUNS times on a fresh store, loaded the way the
#    peers are — `hourglass serve` (auth off, loopback) and the shared load.py posting the same
#    line-protocol file to its InfluxDB write API (`/write?precision=ms`, 4 workers × 5000
#    lines); ingest only (no roll-ups, no queries: those are the MQTT runs'); the data dir is
#    measured after the ordered shutdown and again after `hourglass compact` (the state the
#    peers' bytes per value are read in), and /v1/stats' committed readings are checked
#    against the file's lines.
# 3. Each peer, RUNS times, alone on a fresh data dir, with the shared scripts in
#    ../shared/peers: setup.sh, load.py (line protocol over HTTP, 4 workers × 5000 lines),
#    query.py, teardown.sh.
# 4. table.py writes comparison.md (medians over the runs) from the JSON files.
# The runs go in rounds: run 1 of every system (in the order above), then run 2, and so on.
#
# Environment: OUT (default /tmp/hg-peers/iot-DEVICESxDURATION), HOURGLASS (the binary),
# PEERS ("influxdb victoria-metrics"; empty: none), QUERY_SECONDS (per-query budget, default 15),
# QUIET_WAIT (max wait for a quiet machine before each load/query set, default 30 s),
# WRITE_BUFFER_MB (Hourglass's `storage.write_buffer_mb` for the replay, default 0: off),
# HG_PATHS (Hourglass's ingest paths measured: "mqtt" (default), "http", or "mqtt http").
# Everything listens on 127.0.0.1; the peers keep their data under /tmp/peers-data.
# An OUT holds one workload: a recording of another DEVICES/DURATION there is refused, and the
# results of an earlier invocation are moved to OUT/earlier-TIME (the table is of this one's
# runs). A failing step stops the script, and what it started (a `serve`, a peer) is stopped.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PEERS_DIR=${PEERS_DIR:-$ROOT/../shared/peers}
DEVICES=${1:?usage: compare.sh DEVICES DURATION [RUNS]}
DURATION=${2:?usage: compare.sh DEVICES DURATION [RUNS]}
RUNS=${3:-1}
TAG=iot-${DEVICES}x${DURATION}
OUT=${OUT:-/tmp/hg-peers/$TAG}
HG=${HOURGLASS:-${CARGO_TARGET_DIR:-$HOME/.cache/hourglass-target}/release/hourglass}
PEERS_LIST=${PEERS-"influxdb victoria-metrics"}
QSECS=${QUERY_SECONDS:-15}
WAIT=${QUIET_WAIT:-30}
WBUF=${WRITE_BUFFER_MB:-0}
HG_PATHS=${HG_PATHS:-mqtt}
mkdir -p "$OUT"
log() { echo "== $(date -u +%FT%TZ) $*" | tee -a "$OUT/compare.log" >&2; }

# The shared load.py and query.py need numpy (the peers' setup.sh installs it, but only in the
# peers' step, after Hourglass's HTTP runs have used load.py).
if ! python3 -c 'import numpy' 2>/dev/null; then
  . "$ROOT/scripts/common.sh"
  need_packages python3-numpy
fi

# What a step started, stopped when the script ends early (a failing step, Ctrl-C).
HG_PID=""
PEER_UP=""
cleanup() {
  local rc=$?
  if [[ -n $HG_PID ]] && kill -0 "$HG_PID" 2>/dev/null; then
    kill -TERM "$HG_PID" 2>/dev/null || true
    wait "$HG_PID" 2>/dev/null || true
  fi
  if [[ -n $PEER_UP ]]; then
    PEERS=$PEER_UP bash "$PEERS_DIR/teardown.sh" >>"$OUT/compare.log" 2>&1 || true
  fi
  if [[ $rc -ne 0 ]]; then
    echo "compare.sh failed (exit $rc); what it started is stopped; its logs are in $OUT (compare.log)" >&2
  fi
}
trap cleanup EXIT

# The workload a recording in OUT is of ("DEVICES DURATION_MS", from its record.json), and the
# one asked for.
held_workload() {
  python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))["spec"]; print(s["devices"], s["ticks"] * s["interval_ms"])' \
    "$OUT/record.json"
}
wanted=$(python3 -c '
import re, sys
m = re.fullmatch(r"(\d+)(ms|s|m|h|d)", sys.argv[2])
if not m:
    sys.exit(f"DURATION {sys.argv[2]!r}: use e.g. 10m, 1h")
print(sys.argv[1], int(m[1]) * {"ms": 1, "s": 1000, "m": 60000, "h": 3600000, "d": 86400000}[m[2]])' "$DEVICES" "$DURATION")
if [[ -f $OUT/w.hgwl && -f $OUT/w.lp.meta.json && -f $OUT/record.json ]]; then
  held=$(held_workload)
  if [[ $held != "$wanted" ]]; then
    echo "$OUT holds a recording of another workload (devices and ms: $held, not $wanted): use another OUT" >&2
    exit 2
  fi
else
  log "record $TAG"
  "$HG" bench record --devices "$DEVICES" --duration "$DURATION" --interval 10s \
    --out "$OUT/w.hgwl" --line-protocol "$OUT/w.lp" >"$OUT/record.json"
fi
# table.py reads every result file in OUT: an earlier invocation's go aside.
earlier=$(find "$OUT" -maxdepth 1 \( -name 'load-*.json' -o -name 'query-*.json' -o -name 'disk-*.txt' \
  -o -name 'stats-*.json' -o -name 'compact-*.json' -o -name 'comparison.md' \) | sort)
if [[ -n $earlier ]]; then
  aside="$OUT/earlier-$(date -u +%Y%m%dT%H%M%SZ)"
  mkdir -p "$aside"
  # shellcheck disable=SC2086
  mv $earlier "$aside"/
  log "an earlier invocation's results moved to $aside"
fi

. "$HERE/hg_serve.sh"

# Run r of every system before run r+1 of any: this machine's speed drifts by tens of percent
# within minutes, and systems measured in blocks one after the other took the drift as their own.
hg_mqtt_run() {
  local r=$1
  log "hourglass run $r: load $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf "$OUT/hg-data"
  "$HG" bench replay --file "$OUT/w.hgwl" --driver mqtt --qos 1 --connections 4 --per-message 100 \
    --query-rate 0 --close-hours --place-by-fleet --write-buffer-mb "$WBUF" --data-dir "$OUT/hg-data" --report-dir "$OUT/hourglass-run$r" \
    >"$OUT/load-hourglass-$r.json" 2>"$OUT/load-hourglass-$r.log"
  du -s --block-size=1 "$OUT/hg-data" | cut -f1 >"$OUT/disk-hourglass-$r.txt"
  hg_serve "$HG" "$OUT/hg-data" "$OUT/serve-$r.log"
  log "hourglass run $r: queries"
  python3 "$HERE/hg_query.py" --url "$HG_URL" --meta "$OUT/w.lp.meta.json" \
    --max-seconds "$QSECS" --json "$OUT/query-hourglass-$r.json" | tee -a "$OUT/compare.log"
  hg_stop
}

hg_http_run() {
  local r=$1
  log "hourglass (HTTP line protocol) run $r: load $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf "$OUT/hg-http-data"
  hg_serve "$HG" "$OUT/hg-http-data" "$OUT/serve-http-$r.log" HOURGLASS_STORAGE__WRITE_BUFFER_MB="$WBUF"
  hg_http_load "$OUT/w.lp" "$TAG" "$OUT/load-http-hourglass-$r.json" "$WAIT" >"$OUT/load-http-hourglass-$r.log" 2>&1 ||
    { tail -n 20 "$OUT/load-http-hourglass-$r.log" >&2; return 1; }
  tail -n 2 "$OUT/load-http-hourglass-$r.log" | tee -a "$OUT/compare.log"
  curl -fsS "$HG_URL/v1/stats" >"$OUT/stats-http-hourglass-$r.json"
  hg_stop
  du -s --block-size=1 "$OUT/hg-http-data" | cut -f1 >"$OUT/disk-http-hourglass-$r.txt"
  # Then the store as a long-running one settles (write buffer flushed, every level compacted),
  # the state the peers' bytes per value are read in.
  HOURGLASS_STORAGE__WRITE_BUFFER_MB="$WBUF" "$HG" compact --data-dir "$OUT/hg-http-data" \
    >"$OUT/compact-http-hourglass-$r.json" 2>>"$OUT/serve-http-$r.log"
}

peer_run() {
  local p=$1 r=$2
  log "$p run $r"
  bash "$PEERS_DIR/teardown.sh" >>"$OUT/compare.log" 2>&1 || true
  PEER_UP=$p
  PEERS=$p bash "$PEERS_DIR/setup.sh" >>"$OUT/compare.log" 2>&1
  python3 "$PEERS_DIR/load.py" --target "$p" --file "$OUT/w.lp" --batch 5000 --workers 4 \
    --load-max-wait "$WAIT" --label "$TAG" --json "$OUT/load-$p-$r.json" >"$OUT/load-$p-$r.log" 2>&1 ||
    { tail -n 20 "$OUT/load-$p-$r.log" >&2; return 1; }
  tail -n 3 "$OUT/load-$p-$r.log" | tee -a "$OUT/compare.log"
  python3 "$PEERS_DIR/query.py" --target "$p" --meta "$OUT/w.lp.meta.json" --queries abcde \
    --max-seconds "$QSECS" --load-max-wait "$WAIT" --load-max-wait-each 5 --label "$TAG" \
    --json "$OUT/query-$p-$r.json" 2>&1 | tee -a "$OUT/compare.log"
  PEERS=$p bash "$PEERS_DIR/teardown.sh" >>"$OUT/compare.log" 2>&1 || true
  PEER_UP=""
}

for r in $(seq 1 "$RUNS"); do
  if [[ ${SKIP_HOURGLASS:-0} != 1 && " $HG_PATHS " == *" mqtt "* ]]; then
    hg_mqtt_run "$r"
  fi
  if [[ ${SKIP_HOURGLASS:-0} != 1 && " $HG_PATHS " == *" http "* ]]; then
    hg_http_run "$r"
  fi
  for p in $PEERS_LIST; do
    peer_run "$p" "$r"
  done
done

python3 "$HERE/table.py" "$OUT" | tee "$OUT/comparison.md"
