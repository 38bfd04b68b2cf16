"""Explanations in words: why a family of plans does not fit, and why the chosen plan won.

Everything here is computed from the estimates' breakdowns; nothing is a canned message.
"""

from __future__ import annotations

from launcher.memory.constants import GIB, LOSS_CHUNK_TOKENS
from launcher.memory.estimate import Estimate, estimate
from launcher.planner.constants import SPEED_UNCERTAINTY
from launcher.planner.plans import Plan, Rejection, Request, moving_parts
from launcher.render import LABELS
from launcher.spec import TrainSpec

# How many of the largest memory components a sentence names before "+ N GiB other".
NAMED_COMPONENTS = 3


def size(x: float) -> str:
    """Bytes as GiB, or TiB from 1 TiB up: '75.2 GiB', '3.10 TiB'."""
    g = x / GIB
    if g >= 1024:
        return f"{g / 1024:,.2f} TiB"
    return f"{g:,.1f} GiB" if g >= 10 else f"{g:,.2f} GiB"


def candidate(spec: TrainSpec, dp: int) -> str:
    """'TP 8 x PP 1 x DP 8, micro-batch 1, recompute full' (', chunked loss' etc. where it is)."""
    return ", ".join(
        [f"TP {spec.tp} x PP {spec.pp} x DP {dp}, micro-batch {spec.micro_batch}, recompute {spec.grad_ckpt}",
         *spec.techniques()]
    )


def over_by(est: Estimate, request: Request) -> dict[str, tuple[float, float]]:
    """(needed, available) bytes for each constraint this estimate breaks: gpu, host, nvme."""
    node = request.cluster.node
    limits = {
        "gpu": (est.gpu_total, request.budget),
        "host": (est.host_per_node, node.cpu_memory_gib * GIB),
        "nvme": (est.nvme_per_node, node.nvme_gib * GIB),
    }
    return {k: v for k, v in limits.items() if v[0] > v[1]}


def pressure(est: Estimate, request: Request) -> float:
    """How far from fitting: the largest ratio of need to what is available (<= 1 fits)."""
    node = request.cluster.node
    worst = est.gpu_total / request.budget
    for need, cap in ((est.host_per_node, node.cpu_memory_gib), (est.nvme_per_node, node.nvme_gib)):
        if need > 0:
            worst = max(worst, need / (cap * GIB) if cap > 0 else float("inf"))
    return worst


def rejection(family: str, spec: TrainSpec, est: Estimate, request: Request) -> Rejection:
    """The binding constraint of `family`'s member closest to fitting, as one sentence."""
    broken = over_by(est, request)
    constraint = max(broken, key=lambda k: broken[k][0] / broken[k][1] if broken[k][1] else float("inf"))
    need, cap = broken[constraint]
    where = candidate(spec, est.dp)
    if constraint == "gpu":
        parts = sorted(((v, k) for k, v in est.components.items() if v > 0), key=lambda t: -t[0])
        named = [f"{size(v)} {LABELS.get(k, k)}" for v, k in parts[:NAMED_COMPONENTS]]
        rest = sum(v for v, _ in parts[NAMED_COMPONENTS:])
        if rest > 0:
            named.append(f"{size(rest)} other")
        reason = f"{family}: {' + '.join(named)} = {size(need)} per GPU > {size(cap)} budget ({where})"
    else:
        what = "host RAM" if constraint == "host" else "NVMe"
        comps = est.host_components if constraint == "host" else {}
        parts = sorted(((v, k) for k, v in comps.items() if v > 0), key=lambda t: -t[0])
        detail = (
            " (" + " + ".join(f"{size(v)} {k.replace('_', ' ')}" for v, k in parts) + ")" if parts else ""
        )
        reason = f"{family}: {size(need)} {what} per node{detail} > {size(cap)} available"
        if "gpu" not in broken:
            reason += f"; its GPU side fits ({size(est.gpu_total)}, {where})"
    return Rejection(family, constraint, need, cap, reason, where)


def _slower_because(winner: Plan, other: Plan) -> str:

    ratio = winner.perf.tokens_per_s / other.perf.tokens_per_s
    extra = {k: other.perf.breakdown[k] - winner.perf.breakdown.get(k, 0.0) for k in other.perf.breakdown}
    key = max(extra, key=lambda k: extra[k])
    more = moving_parts(other.spec) - moving_parts(winner.spec)
    if ratio < 1.0 - 1e-9 and more > 0:
        return (
            f"{(1 - ratio) * 100:.2g} % fewer tokens/s, within the speed model's error band "
            f"({SPEED_UNCERTAINTY:.0%} on published runs, for each of the {more} more moving part{'s' if more > 1 else ''} it has: "
            "offload, ZeRO-3, TP, PP, chunked loss, optimizer in backward), so the simpler plan"
        )
    if ratio <= 1.0 + 1e-9:
        return "as fast; the chosen plan has fewer moving parts (lower stage, less offload, smaller TP/PP)"
    reason = f"{(ratio - 1) * 100:.2g} % more tokens/s" if ratio < 1.1 else f"{ratio:.2f}x the tokens/s"
    if extra[key] > 0:
        reason += f"; it spends {extra[key]:.3g} s more per step on {key.replace('_', ' ')}"
        reason += f" ({other.perf.breakdown[key]:.3g} s vs {winner.perf.breakdown.get(key, 0.0):.3g} s)"
    return reason


def chunked_loss(plan: Plan) -> str | None:
    """Why a plan computes the loss in chunks: what it saves, what fits because of it, its cost."""
    if plan.spec.loss != "chunked":
        return None
    whole = estimate(plan.arch, plan.spec.with_(loss="full"), plan.cluster)
    saved = whole.components["logits_loss"] - plan.estimate.components["logits_loss"]
    if whole.gpu_total > plan.budget:
        fits = f"with the whole loss this plan needs {size(whole.gpu_total)} per GPU > {size(plan.budget)} budget"
    else:
        fits = "the whole loss would fit too, but no faster plan does"
    return (
        f"chunked loss ({LOSS_CHUNK_TOKENS} tokens at a time): the logits + loss working set is "
        f"{size(plan.estimate.components['logits_loss'])} instead of {size(whole.components['logits_loss'])} "
        f"({size(saved)} less); {fits}; it costs one more LM-head forward in backward"
    )


def optimizer_in_backward(plan: Plan) -> str | None:
    """Why a plan steps the optimizer inside the backward: the gradients it never holds at once."""
    if plan.spec.optimizer_step != "in-backward":
        return None
    usual = estimate(plan.arch, plan.spec.with_(optimizer_step="after-backward"), plan.cluster)
    if usual.gpu_total > plan.budget:
        fits = f"stepped after the backward this plan needs {size(usual.gpu_total)} per GPU > {size(plan.budget)} budget"
    else:
        fits = "the usual step would fit too, but no faster plan does"
    return (
        f"optimizer in backward: each parameter is stepped as its gradient is complete, so "
        f"{size(plan.estimate.gradients_full)} of gradients are alive at most instead of {size(usual.gradients_full)}; "
        f"{fits}; no gradient clipping (its global norm needs every gradient at once)"
    )


def why(ranked: tuple[Plan, ...], limit: int = 4) -> list[str]:
    """Why the best plan beats the runner-up and the best plan of each other family (and why it
    chunks its loss or steps in backward, where it does)."""
    if not ranked:
        return []
    best = ranked[0]
    lines = [line for line in (chunked_loss(best), optimizer_in_backward(best)) if line]
    own = len(lines)
    if len(ranked) < 2:
        return lines
    lines.append(f"over the runner-up ({ranked[1].summary()}): {_slower_because(best, ranked[1])}")
    seen = {best.family}
    for plan in ranked[1:]:
        if plan.family in seen:
            continue
        seen.add(plan.family)
        if plan is not ranked[1]:
            lines.append(f"over the best {plan.family} ({plan.summary()}): {_slower_because(best, plan)}")
        if len(lines) >= limit + own:
            break
    return lines
