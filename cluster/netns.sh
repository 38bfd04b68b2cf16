#!/usr/bin/env bash
# Two simulated hosts on this machine: network namespaces ftA (10.231.0.1) and ftB (10.231.0.2)
# joined by a veth pair. Traffic between them never leaves this machine.
#   bash cluster/netns.sh up | down
# Needs root and iproute2. Idempotent.
set -euo pipefail
A=ftA B=ftB
case "${1:-up}" in
  up)
    ip netns list | grep -qw "$A" || ip netns add "$A"
    ip netns list | grep -qw "$B" || ip netns add "$B"
    if ! ip -n "$A" link show veth-ftA >/dev/null 2>&1; then
      ip link add veth-ftA netns "$A" type veth peer name veth-ftB netns "$B"
    fi
    ip -n "$A" addr replace 10.231.0.1/24 dev veth-ftA
    ip -n "$B" addr replace 10.231.0.2/24 dev veth-ftB
    for ns in "$A" "$B"; do
      ip -n "$ns" link set lo up
    done
    ip -n "$A" link set veth-ftA up
    ip -n "$B" link set veth-ftB up
    ;;
  down)
    ip netns del "$A" 2>/dev/null || true
    ip netns del "$B" 2>/dev/null || true
    ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
