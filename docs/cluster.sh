#!/usr/bin/env bash
# A local cluster to try: redis-server and N router nodes on 127.0.0.1, one realm across all.
#   docs/cluster.sh [N]     (default 3; Ctrl-C stops everything)
# Node i (1..N) listens on WebSocket 127.0.0.1:(8080+10*i)/ws, RawSocket 8081+10*i,
# MQTT 1883+10*i and AMQP 5672+10*i; Redis on 127.0.0.1:6390. State goes to ./cluster/.
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=${1:-3}
redis_port=${REDIS_PORT:-6390}
python=${PYTHON:-.venv/bin/python}
work=cluster
mkdir -p "$work"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait' EXIT INT TERM
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$work" >"$work/redis.log" 2>&1 &
pids+=($!)
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.1; done
for i in $(seq 1 "$nodes"); do
  dir="$work/node$i"
  mkdir -p "$dir/realms"
  cp realms/realm1.json "$dir/realms/"
  cat >"$dir/config.json" <<JSON
{"realms": ["realm1"],
 "engine": {"type": "redis", "url": "redis://127.0.0.1:$redis_port/0", "node": "node$i"},
 "listeners": [
  {"type": "websocket", "host": "127.0.0.1", "port": $((8080 + 10 * i)), "path": "/ws"},
  {"type": "rawsocket", "host": "127.0.0.1", "port": $((8081 + 10 * i))},
  {"type": "mqtt", "host": "127.0.0.1", "port": $((1883 + 10 * i)), "realm": "realm1"},
  {"type": "amqp", "host": "127.0.0.1", "port": $((5672 + 10 * i)), "realm": "realm1"}]}
JSON
  "$python" -m router run --config "$dir/config.json" 2>"$dir/router.log" &
  pids+=($!)
done
echo "redis on 127.0.0.1:$redis_port, $nodes node(s); logs in $work/; Ctrl-C stops"
wait
