# Sourced by compare.sh and ab-http.sh: Hourglass served on loopback for a benchmark, and the
# shared load.py posting a line-protocol file to its InfluxDB write API. Needs PEERS_DIR.

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# hg_serve BINARY DATA_DIR LOG [VAR=VALUE ...]: starts `BINARY serve` on free loopback ports with
# auth off (a loopback benchmark: loads and queries run without tokens, as the peers' do) and
# the given extra variables; sets HG_PID, HG_URL and HG_DATA, and returns once /health answers
# (at most about 20 s).
hg_serve() {
  local bin=$1 data=$2 logf=$3 http mqtt
  shift 3
  http=$(free_port); mqtt=$(free_port)
  env HOURGLASS_AUTH__ENABLED=false "$@" "$bin" serve --data-dir "$data" \
    --http-listen "127.0.0.1:$http" --mqtt-listen "127.0.0.1:$mqtt" >"$logf" 2>&1 &
  HG_PID=$!
  HG_URL="http://127.0.0.1:$http"
  HG_DATA=$data
  for _ in $(seq 1 100); do curl -fsS -o /dev/null "$HG_URL/health" 2>/dev/null && break; sleep 0.2; done
}

# hg_stop: SIGTERM to the `serve` of hg_serve, and waits for its ordered shutdown; HG_PID is
# then empty (nothing of it left to stop).
hg_stop() {
  kill -TERM "$HG_PID"
  wait "$HG_PID" || true
  HG_PID=""
}

# hg_http_load FILE LABEL JSON MAX_WAIT: the shared load.py into the `serve` of hg_serve,
# `/write?precision=ms`, 4 workers × 5000 lines, as it loads the peers (HTTP_WORKERS and
# HTTP_BATCH change those).
hg_http_load() {
  python3 "$PEERS_DIR/load.py" --target http --url "$HG_URL/write?precision=ms" --pid "$HG_PID" \
    --data-dir "$HG_DATA" --no-flush --no-count --file "$1" --batch "${HTTP_BATCH:-5000}" --workers "${HTTP_WORKERS:-4}" \
    --load-max-wait "$4" --label "$2" --json "$3"
}
