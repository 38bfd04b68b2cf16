#!/usr/bin/env bash
# A real Slurm cluster on this one machine, from nothing: Debian's slurmctld / slurmd / munge
# (installed with apt if missing), two nodes (node1, node2: one slurmd each on its own port) with
# fake GPUs (gres backed by character devices), partitions "debug" (default) and "short" (10-minute
# limit), no accounting database.
#   sudo bash cluster/slurm_up.sh        # idempotent; ~15 s with apt, ~1 s once installed
#   sudo bash cluster/slurm_down.sh      # stop it and remove its state
# Settings (environment): FTLAUNCH_SLURM_GPUS (per node, default 4), FTLAUNCH_SLURM_CPUS (per
# node, default 4), FTLAUNCH_SLURM_MEM_MB (per node, default 8192). Nodes may advertise more than
# the machine has (SlurmdParameters=config_overrides). State and logs: /var/lib/ftlaunch-slurm.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
STATE=/var/lib/ftlaunch-slurm
NODES=(node1 node2)
GPUS=${FTLAUNCH_SLURM_GPUS:-4}
CPUS=${FTLAUNCH_SLURM_CPUS:-4}
MEM_MB=${FTLAUNCH_SLURM_MEM_MB:-8192}
MARK="# ftlaunch local test cluster"
HOSTS_LINE="127.0.0.1 ${NODES[*]} # ftlaunch-slurm"

die() { echo "slurm_up: $*" >&2; exit 1; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop() {  # stop the daemon whose pid file is $1, by its pid
  if alive "$1"; then
    local pid; pid=$(cat "$1"); kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
}

[ "$(id -u)" = 0 ] || die "needs root (it installs packages and starts daemons)"

# 1. packages
missing=()
for pkg in slurmctld slurmd slurm-client munge; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "slurm_up: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. node names resolve (jobs use them as the rendezvous address)
grep -q "# ftlaunch-slurm$" /etc/hosts || echo "$HOSTS_LINE" >>/etc/hosts

# 3. configuration; a change needs the daemons restarted (GresTypes cannot be reconfigured)
mkdir -p /etc/slurm "$STATE/ctld" "$STATE/gpus"
changed=0
for f in slurm.conf gres.conf; do
  if [ -e "/etc/slurm/$f" ] && ! grep -qF "$MARK" "/etc/slurm/$f"; then
    die "/etc/slurm/$f was not written by this script; move it away to use the ftlaunch test cluster"
  fi
  new=$(sed -e "s|@CTLD_HOST@|$(hostname -s)|" -e "s|@STATE@|$STATE|g" -e "s|@CPUS@|$CPUS|" \
    -e "s|@MEM_MB@|$MEM_MB|" -e "s|@GPUS@|$GPUS|" -e "s|@LAST_GPU@|$((GPUS - 1))|" "$HERE/slurm/$f")
  if [ "$new" != "$(cat "/etc/slurm/$f" 2>/dev/null)" ]; then
    printf '%s\n' "$new" >"/etc/slurm/$f"
    changed=1
  fi
done

# 4. fake GPUs: character devices like /dev/null (a gpu gres without File= drains the node)
for node in "${NODES[@]}"; do
  mkdir -p "$STATE/gpus/$node" "$STATE/$node"
  for ((i = 0; i < GPUS; i++)); do
    [ -c "$STATE/gpus/$node/gpu$i" ] || mknod "$STATE/gpus/$node/gpu$i" c 1 3
  done
done

# 5. munge (authentication between the daemons and the commands)
if ! alive /run/munge/munged.pid; then
  install -d -o munge -g munge -m 0755 /run/munge
  [ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey --create
  runuser -u munge -- /usr/sbin/munged
fi

# 6. the controller and one slurmd per node
if [ "$changed" = 1 ]; then
  for node in "${NODES[@]}"; do stop "$STATE/slurmd-$node.pid"; done
  stop "$STATE/slurmctld.pid"
fi
alive "$STATE/slurmctld.pid" || slurmctld
for node in "${NODES[@]}"; do
  alive "$STATE/slurmd-$node.pid" || slurmd -N "$node"
done

# 7. wait until both nodes take jobs
for _ in $(seq 120); do
  states=$(sinfo -h -N -o "%N %t" 2>/dev/null | sort -u || true)  # a node shows once per partition
  for node in "${NODES[@]}"; do
    case "$(awk -v n="$node" '$1 == n {print $2}' <<<"$states")" in
      down* | drain* | drng* | fail*) scontrol update NodeName="$node" State=RESUME 2>/dev/null || true ;;
    esac
  done
  if [ "$(grep -cE ' (idle|mix|alloc|comp)$' <<<"$states")" = "${#NODES[@]}" ]; then
    echo "slurm_up: ready: ${#NODES[@]} nodes x $GPUS fake GPUs, $CPUS CPUs, partitions debug, short"
    exit 0
  fi
  sleep 0.5
done
sinfo -N -l >&2 || true
die "the nodes did not come up; see $STATE/slurmctld.log and $STATE/slurmd-*.log"
