#!/usr/bin/env bash
# Stop the local Slurm cluster started by cluster/slurm_up.sh and remove its state, its
# configuration and its /etc/hosts line. The packages stay installed (the next start is fast).
#   sudo bash cluster/slurm_down.sh      # idempotent
set -uo pipefail
STATE=/var/lib/ftlaunch-slurm
MARK="# ftlaunch local test cluster"

stop() {  # stop the daemon whose pid file is $1, by its pid
  [ -s "$1" ] || return 0
  local pid; pid=$(cat "$1")
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

[ "$(id -u)" = 0 ] || { echo "slurm_down: needs root" >&2; exit 1; }
if [ -e /etc/slurm/slurm.conf ] && ! grep -qF "$MARK" /etc/slurm/slurm.conf; then
  echo "slurm_down: /etc/slurm/slurm.conf is not the ftlaunch test cluster's; leaving it alone" >&2
  exit 1
fi
if [ -s "$STATE/slurmctld.pid" ] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null; then
  # cancel every job and wait for their processes to end (they outlive a stopped slurmd)
  jobs=$(squeue -h -o %i 2>/dev/null || true)
  if [ -n "$jobs" ]; then
    scancel $jobs 2>/dev/null || true  # shellcheck disable=SC2086  (job ids, split on purpose)
    for _ in $(seq 120); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.5; done
  fi
fi
for pidfile in "$STATE"/slurmd-*.pid; do stop "$pidfile"; done
stop "$STATE/slurmctld.pid"
stop /run/munge/munged.pid
rm -f /etc/slurm/slurm.conf /etc/slurm/gres.conf
rm -rf "$STATE"
sed -i '/# ftlaunch-slurm$/d' /etc/hosts
echo "slurm_down: stopped"
