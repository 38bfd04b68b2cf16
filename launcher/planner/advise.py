"""When nothing fits: the smallest changes that would, each computed and verified by planning
with the change applied (never a rule of thumb).

  more GPUs     the smallest cluster of the same GPU type on the ladder (shapes.py) with a plan
  method        LoRA, then QLoRA, on the same GPUs (only methods lighter than the one asked)
  host / NVMe   the least host RAM and/or NVMe per node that lets a plan whose GPU side already
                fits (a "near miss" of the search) run, rounded up to a whole GiB
  sequence      the longest sequence, in steps of SEQ_STEP tokens, with a plan

`scale_out` answers the question a slow offload plan raises: how many GPUs of this type would
train without any offload.
"""

from __future__ import annotations

import math

from launcher.errors import FtlaunchError
from launcher.memory.constants import GIB
from launcher.planner import search, shapes
from launcher.planner.constants import SELECT_MAX_NODES
from launcher.planner.plans import PlanResult, Request, Suggestion
from launcher.spec import METHODS

SEQ_STEP = 128  # sequence lengths tried: multiples of this


def _fits(request: Request) -> bool:
    return bool(search.plan(request, mode="first").ranked)


def _best(request: Request):
    try:
        return search.plan(request, mode="best").best
    except FtlaunchError:
        return None


def _per_node(request: Request) -> int:
    cluster = request.cluster
    if cluster.nodes > 1:
        return cluster.gpus_per_node
    return dict(request.hardware).get("gpus_per_node", cluster.gpu.default_gpus_per_node)


def _grow(request: Request, kind: str, why: str) -> Suggestion | None:
    """The smallest larger cluster of the same GPU where `request` has a plan."""
    gpu = request.cluster.gpu
    start = request.cluster.world_size + 1
    rungs = shapes.ladder(_per_node(request), SELECT_MAX_NODES, dict(request.hardware), start)
    found = shapes.smallest_fit(request, gpu, rungs, _fits)
    if found is None:
        return None
    text, req = found
    best = _best(req)
    if best is None:
        return None
    return Suggestion(kind, (("--gpus", text),), f"--gpus {text}{why}: {best.summary()}", best)


def more_gpus(request: Request) -> Suggestion | None:
    return _grow(request, "gpus", "")


def scale_out(request: Request) -> Suggestion | None:
    """The smallest cluster of this GPU type that trains without any offload (None when the
    user pinned an offload or nothing up to the ladder's top fits)."""
    pins = request.pinned
    if pins.get("offload_optimizer", "none") != "none" or pins.get("offload_params", "none") != "none":
        return None
    no_offload = (("offload_optimizer", "none"), ("offload_params", "none"))
    req = request.with_(pins=tuple(p for p in request.pins if p[0] not in dict(no_offload)) + no_offload)
    if _fits(req):
        return None
    return _grow(req, "scale_out", " without offload")


def lighter_methods(request: Request) -> list[Suggestion]:
    out = []
    for method in METHODS[METHODS.index(request.base.method) + 1 :]:
        best = _best(request.with_(base=request.base.with_(method=method)))
        if best is not None:
            out.append(
                Suggestion("method", (("--method", method),), f"--method {method}: {best.summary()}", best)
            )
    return out


def _with_node(request: Request, **changes: float) -> Request:
    hardware = {**dict(request.hardware), **changes}
    c = request.cluster
    _, cluster = shapes.build(c.gpu, c.nodes, c.gpus_per_node, hardware)
    return request.with_(cluster=cluster, hardware=tuple(sorted(hardware.items())))


def more_host_or_nvme(result: PlanResult) -> list[Suggestion]:
    """Least host RAM, least NVMe, or (when neither alone is enough) both, per node."""
    request = result.request
    node = request.cluster.node
    host_cap, nvme_cap = node.cpu_memory_gib * GIB, node.nvme_gib * GIB
    misses = [(est.host_per_node, est.nvme_per_node) for _, est in result.near_misses]
    options: list[dict[str, int]] = []
    host_only = [h for h, n in misses if n <= nvme_cap]
    nvme_only = [n for h, n in misses if h <= host_cap]
    if host_only:
        options.append({"cpu_memory_gib": math.ceil(min(host_only) / GIB)})
    if nvme_only:
        options.append({"nvme_gib": math.ceil(min(nvme_only) / GIB)})
    if misses and not options:
        h, n = min(misses, key=lambda hn: max(hn[0] / host_cap, hn[1] / max(nvme_cap, 1.0)))
        options.append({"cpu_memory_gib": math.ceil(h / GIB), "nvme_gib": math.ceil(n / GIB)})
    out = []
    for change in options:
        req = _with_node(request, **change)
        best = _best(req)
        if best is None:
            continue
        flags = tuple(
            ("--cpu-memory" if k == "cpu_memory_gib" else "--nvme", str(v)) for k, v in change.items()
        )
        words = " and ".join(
            f"{v:,} GiB {'host RAM' if k == 'cpu_memory_gib' else 'NVMe'} per node" for k, v in change.items()
        )
        kind = "+".join("cpu_memory" if k == "cpu_memory_gib" else "nvme" for k in change)
        typed = " ".join(" ".join(f) for f in flags)
        out.append(Suggestion(kind, flags, f"{words} ({typed}): {best.summary()}", best))
    return out


def shorter_sequence(request: Request) -> Suggestion | None:
    """The longest sequence (a multiple of SEQ_STEP below the one asked) with a plan."""

    def fits(seq: int) -> bool:
        try:
            return _fits(request.with_(base=request.base.with_(seq_len=seq)))
        except FtlaunchError:
            return False

    top = (request.base.seq_len - 1) // SEQ_STEP
    if top < 1 or not fits(SEQ_STEP):
        return None
    lo, hi = 1, top + 1  # lo fits, hi does not (the asked length failed)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid * SEQ_STEP):
            lo = mid
        else:
            hi = mid
    seq = lo * SEQ_STEP
    best = _best(request.with_(base=request.base.with_(seq_len=seq)))
    if best is None:
        return None
    return Suggestion("seq_len", (("--seq-len", str(seq)),), f"--seq-len {seq}: {best.summary()}", best)


def suggestions(result: PlanResult) -> tuple[Suggestion, ...]:
    """Every kind of change that makes the request of a result without plans fit."""
    request = result.request
    out: list[Suggestion] = []
    grown = more_gpus(request)
    if grown is not None:
        out.append(grown)
    out += lighter_methods(request)
    out += more_host_or_nvme(result)
    seq = shorter_sequence(request)
    if seq is not None:
        out.append(seq)
    return tuple(out)
