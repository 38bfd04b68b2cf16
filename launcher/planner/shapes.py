"""Cluster shapes the planner tries when it looks beyond the given cluster (advice, selection).

The ladder for one GPU type: 1, 2, 4, ... GPUs up to a node, then 2, 4, 8, ... whole nodes.
Clusters are built with parse_gpus from the same text a user would type, with the user's
hardware overrides (--cpu-memory, --nvme, ...), so `--gpus <shape>` reproduces them exactly.
"""

from __future__ import annotations

from collections.abc import Callable

from launcher.errors import FtlaunchError
from launcher.hardware import ClusterSpec, GpuType, parse_gpus
from launcher.planner.plans import Request


def shape_text(gpu: GpuType, nodes: int, per_node: int, hardware: dict) -> str:
    """The --gpus text for `nodes` x `per_node` GPUs: '8xA100-80GB' or '2x8xA100-80GB'."""
    if nodes == 1 and per_node <= gpu.default_gpus_per_node and "gpus_per_node" not in hardware:
        return f"{per_node}x{gpu.name}"
    return f"{nodes}x{per_node}x{gpu.name}"


def build(gpu: GpuType, nodes: int, per_node: int, hardware: dict) -> tuple[str, ClusterSpec]:
    text = shape_text(gpu, nodes, per_node, hardware)
    return text, parse_gpus(text, **hardware)


def ladder(per_node: int, max_nodes: int, hardware: dict, start_gpus: int = 1) -> list[tuple[int, int]]:
    """(nodes, GPUs per node) from `start_gpus` up: powers of two within a node, a full node,
    then whole nodes doubling up to max_nodes. With --gpus-per-node given, whole nodes only."""
    rungs = []
    n = per_node if "gpus_per_node" in hardware else 1
    while n < per_node:
        if n >= start_gpus:
            rungs.append((1, n))
        n *= 2
    if per_node >= start_gpus:
        rungs.append((1, per_node))
    nodes = 2
    while nodes <= max_nodes:
        if nodes * per_node >= start_gpus:
            rungs.append((nodes, per_node))
        nodes *= 2
    return rungs


def smallest_fit(
    request: Request,
    gpu: GpuType,
    rungs: list[tuple[int, int]],
    fits: Callable[[Request], bool],
) -> tuple[str, Request] | None:
    """The smallest cluster on the ladder where `fits`, refined to the exact node count between
    a failing and a fitting rung of whole nodes (assuming more nodes never stop a fit, which
    tests/test_planner_properties.py checks). None if nothing up to the top rung fits."""
    hardware = dict(request.hardware)

    def attempt(nodes: int, per_node: int) -> tuple[str, Request] | None:
        try:
            text, cluster = build(gpu, nodes, per_node, hardware)
            req = request.with_(cluster=cluster)
            return (text, req) if fits(req) else None
        except FtlaunchError:  # e.g. a pinned global batch this cluster cannot split
            return None

    last_fail: tuple[int, int] | None = None
    for nodes, per_node in rungs:
        hit = attempt(nodes, per_node)
        if hit is None:
            last_fail = (nodes, per_node)
            continue
        if last_fail is None or last_fail[1] != per_node or nodes - last_fail[0] < 2:
            return hit
        lo, hi = last_fail[0], nodes  # lo fails, hi fits
        while hi - lo > 1:
            mid = (lo + hi) // 2
            found = attempt(mid, per_node)
            if found is None:
                lo = mid
            else:
                hi, hit = mid, found
        return hit
    return None
