#!/usr/bin/env bash
# A local cluster to try: redis-server and N router nodes on 127.0.0.1, one realm across all.
#   docs/cluster.sh [N]     (default 3; Ctrl-C stops everything)
# Node i (1..N) listens on WebSocket 127.0.0.1:(BASE_PORT+10*i)/ws, RawSocket BASE_PORT+10*i+1,
# MQTT +2, AMQP +3 and metrics http://127.0.0.1:(BASE_PORT+10*i+4)/metrics (for
# `python -m router status --url ...`); Redis on 127.0.0.1:REDIS_PORT.
# Environment: BASE_PORT (default 8080), REDIS_PORT (default 6390), CLUSTER_DIR (state and
# logs, default ./cluster), PYTHON (default .venv/bin/python), READY_TIMEOUT (seconds a node
# may take to start, default 60).
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=${1:-3}
base=${BASE_PORT:-8080}
redis_port=${REDIS_PORT:-6390}
python=${PYTHON:-.venv/bin/python}
work=${CLUSTER_DIR:-cluster}
ready_timeout=${READY_TIMEOUT:-60}
mkdir -p "$work"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait' EXIT INT TERM
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$work" >"$work/redis.log" 2>&1 &
pids+=($!)
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do
  kill -0 "${pids[0]}" 2>/dev/null || { echo "redis-server failed: see $work/redis.log" >&2; exit 1; }
  sleep 0.1
done
for i in $(seq 1 "$nodes"); do
  dir="$work/node$i"
  port=$((base + 10 * i))
  mkdir -p "$dir/realms"
  cp realms/realm1.json "$dir/realms/"
  cat >"$dir/config.json" <<JSON
{"realms": ["realm1"],
 "engine": {"type": "redis", "url": "redis://127.0.0.1:$redis_port/0", "node": "node$i"},
 "listeners": [
  {"type": "websocket", "host": "127.0.0.1", "port": $port, "path": "/ws"},
  {"type": "rawsocket", "host": "127.0.0.1", "port": $((port + 1))},
  {"type": "mqtt", "host": "127.0.0.1", "port": $((port + 2)), "realm": "realm1"},
  {"type": "amqp", "host": "127.0.0.1", "port": $((port + 3)), "realm": "realm1"},
  {"type": "metrics", "host": "127.0.0.1", "port": $((port + 4)), "path": "/metrics"}]}
JSON
  "$python" -m router run --config "$dir/config.json" 2>"$dir/router.log" &
  pids+=($!)
done
# the nodes start side by side; each is ready once it logs its "ready:" line
deadline=$((SECONDS + ready_timeout))
for i in $(seq 1 "$nodes"); do
  log="$work/node$i/router.log"
  until grep -q 'ready: ' "$log"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null || ((SECONDS >= deadline)); then
      echo "node$i did not start (log $log):" >&2
      tail -n 5 "$log" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "node$i: $(grep -o 'ready: .*' "$log" | head -n 1 | cut -c8-)"
done
echo "status of node1: $python -m router status --config $work/node1/config.json"
echo "redis on 127.0.0.1:$redis_port, $nodes node(s) ready; logs in $work/; Ctrl-C stops"
wait
