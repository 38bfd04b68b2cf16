#!/usr/bin/env bash
# A real Ray head on this machine, loopback only, with fake GPUs: the cluster the Ray tests and
# demos submit to. Prints the dashboard address (what `ftlaunch --backend ray --address` takes).
#   bash cluster/ray_up.sh       # idempotent: an already running head is reused; ~10 s from nothing
#   bash cluster/ray_down.sh     # stop it (only the processes this script started)
# Ray jobs run the `python` on the PATH of `ray start`: the script puts the interpreter of the `ray`
# it uses first on PATH (a shim, not the whole bin directory: a second `ninja` there would make
# DeepSpeed rebuild its cached CPU extensions each time a job and a torchrun run alternate).
# Settings (environment): RAY (the ray executable; default: .venv/bin/ray, else the one on PATH),
# FTLAUNCH_RAY_CPUS (default 4), FTLAUNCH_RAY_GPUS (fake GPUs declared, default 8),
# FTLAUNCH_RAY_PORT (GCS port; default: a free one), FTLAUNCH_RAY_DASHBOARD_PORT (default 8265),
# FTLAUNCH_RAY_STATE (default /tmp/ftlaunch-ray: pid file, Ray's session files, head.log).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${FTLAUNCH_RAY_STATE:-/tmp/ftlaunch-ray}
CPUS=${FTLAUNCH_RAY_CPUS:-4}
GPUS=${FTLAUNCH_RAY_GPUS:-8}
DASH_PORT=${FTLAUNCH_RAY_DASHBOARD_PORT:-8265}
ADDRESS="http://127.0.0.1:$DASH_PORT"
if [ -z "${RAY:-}" ]; then
  if [ -x "$HERE/../.venv/bin/ray" ]; then RAY="$HERE/../.venv/bin/ray"; else RAY=$(command -v ray || true); fi
fi
[ -n "$RAY" ] && [ -x "$RAY" ] || { echo "ray_up: no ray executable; pip install -e '.[ray]'" >&2; exit 1; }
BIN=$(cd "$(dirname "$RAY")" && pwd)
mkdir -p "$STATE/bin"
for exe in python python3; do
  printf '#!/bin/sh\nexec %q "$@"\n' "$BIN/python" >"$STATE/bin/$exe"
  chmod +x "$STATE/bin/$exe"
done
export PATH="$STATE/bin:$PATH"
# Without this Ray swaps 127.0.0.1 for the machine's address and drivers retry forever.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0

# The dashboard answers before the head node has registered its resources: ready means an ALIVE
# node is listed (a job checked against an empty node list is refused).
answers() {
  curl -sf --max-time 2 "$ADDRESS/api/v0/nodes?limit=10" 2>/dev/null | "$BIN/python" -c '
import json, sys
nodes = json.load(sys.stdin)["data"]["result"]["result"]
sys.exit(0 if any(n.get("state") == "ALIVE" and n.get("resources_total", {}).get("CPU") for n in nodes) else 1)
' 2>/dev/null
}

if answers; then
  echo "$ADDRESS"
  exit 0
fi
if [ -s "$STATE/head.pid" ] && kill -0 "$(cat "$STATE/head.pid")" 2>/dev/null; then
  echo "ray_up: a head started from $STATE is running but $ADDRESS does not answer; run cluster/ray_down.sh" >&2
  exit 1
fi
PORT=${FTLAUNCH_RAY_PORT:-$("$BIN/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
# --block keeps `ray start` in the foreground as the leader of its own session (setsid), so
# ray_down.sh stops exactly this cluster by its process group.
setsid "$RAY" start --head --block --disable-usage-stats \
  --node-ip-address 127.0.0.1 --port "$PORT" \
  --dashboard-host 127.0.0.1 --dashboard-port "$DASH_PORT" \
  --num-cpus "$CPUS" --num-gpus "$GPUS" \
  --temp-dir "$STATE/session" \
  </dev/null >"$STATE/head.log" 2>&1 &
echo $! >"$STATE/head.pid"
for _ in $(seq 120); do
  if answers; then
    echo "$ADDRESS"
    exit 0
  fi
  kill -0 "$(cat "$STATE/head.pid")" 2>/dev/null || break
  sleep 0.5
done
echo "ray_up: the Ray head did not come up at $ADDRESS; see $STATE/head.log" >&2
tail -n 20 "$STATE/head.log" >&2 || true
exit 1
