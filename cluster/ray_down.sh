#!/usr/bin/env bash
# Stop the Ray head cluster/ray_up.sh started: its process group (the `ray start --block` session,
# which holds the GCS, raylet, dashboard and the job / worker processes): SIGTERM, SIGKILL after 10 s.
# Other Ray instances on the machine are left alone. Idempotent.
#   bash cluster/ray_down.sh
set -euo pipefail
STATE=${FTLAUNCH_RAY_STATE:-/tmp/ftlaunch-ray}
PIDFILE="$STATE/head.pid"
[ -s "$PIDFILE" ] || { echo "ray_down: nothing to stop"; exit 0; }
PGID=$(cat "$PIDFILE")
group_alive() { pgrep -g "$PGID" >/dev/null 2>&1; }
if group_alive; then
  kill -TERM -- "-$PGID" 2>/dev/null || true
  for _ in $(seq 20); do group_alive || break; sleep 0.5; done
  if group_alive; then kill -KILL -- "-$PGID" 2>/dev/null || true; sleep 0.5; fi
fi
rm -f "$PIDFILE"
echo "ray_down: stopped"
