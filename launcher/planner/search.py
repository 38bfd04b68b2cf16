"""The search: every candidate's memory verdict, the feasible ones ranked by estimated speed.

A candidate is feasible when the memory model's GPU total is within the budget (GPU memory less
the margin) and its host RAM and NVMe per node are within the node's. Feasible plans are ranked
by estimated tokens/s; ties go to fewer moving parts (lower ZeRO stage, less offload, smaller TP,
smaller PP, less recompute, smaller micro-batch), so the order is total and deterministic.

Pruning (only what provably cannot fit, never what merely seems slow): within a group (same
sharding, TP, PP, recompute) candidates are walked from the smallest micro-batch up.
  * Host RAM and NVMe do not depend on the micro-batch or the accumulation, so once they are
    over, every larger micro-batch is over too.
  * The GPU total with accumulation 1 is a lower bound for the same micro-batch at any
    accumulation (accumulation only adds persistent gradient buffers and, with PP, micro-batches
    in flight), and it grows with the micro-batch (every activation term is linear in it). When
    that bound is over the budget, no larger micro-batch of the group can fit.
    tests/test_planner_search.py checks both properties on a grid.
"""

from __future__ import annotations

from launcher.memory.constants import GIB
from launcher.memory.estimate import Estimate, estimate
from launcher.planner import explain, space
from launcher.planner.perf import performance
from launcher.planner.plans import Plan, PlanResult, Rejection, Request, sharding_label
from launcher.spec import TrainSpec


def rank_key(plan: Plan) -> tuple:
    s = plan.spec
    return (
        -plan.perf.tokens_per_s,
        space.SHARDING_RANK[(s.zero_stage, s.offload_optimizer, s.offload_params)],
        s.tp,
        s.pp,
        space.CKPT_RANK[s.grad_ckpt],
        s.micro_batch,
    )


def _families(spec: TrainSpec) -> tuple[str, ...]:
    out = (sharding_label(spec), f"TP {spec.tp}")
    return out + (f"PP {spec.pp}",) if spec.pp > 1 else out


def _family_order(family: str) -> tuple:
    for i, s in enumerate(space.SHARDINGS):
        if family == sharding_label(TrainSpec(zero_stage=s[0], offload_optimizer=s[1], offload_params=s[2])):
            return (0, i)
    kind, degree = family.split()
    return (1 if kind == "TP" else 2, int(degree))


def plan(request: Request, *, first_fit: bool = False) -> PlanResult:
    """Search the whole space of `request`. With first_fit, stop at the first feasible plan (an
    existence check for hardware selection and advice)."""
    base, notes = space.effective_base(request)
    arch, cluster = request.arch, request.cluster
    budget = request.budget
    host_cap = cluster.node.cpu_memory_gib * GIB
    nvme_cap = cluster.node.nvme_gib * GIB

    plans: list[Plan] = []
    closest: dict[str, tuple[float, TrainSpec, Estimate]] = {}
    near: list[tuple[TrainSpec, Estimate]] = []
    candidates = evaluated = pruned = 0
    for group in space.groups(request, base):
        candidates += len(group.batches)
        for i, (micro, accum, gb) in enumerate(group.batches):
            spec = group.spec.with_(micro_batch=micro, grad_accum=accum)
            est = estimate(arch, spec, cluster)
            evaluated += 1
            gpu_ok = est.gpu_total <= budget
            side_ok = est.host_per_node <= host_cap and est.nvme_per_node <= nvme_cap
            if gpu_ok and side_ok:
                perf = performance(arch, spec, cluster, group.dp)
                plans.append(Plan(arch, cluster, spec, group.dp, gb, est, perf, budget))
                if first_fit:
                    return _result(request, plans, {}, near, candidates, evaluated, pruned, notes)
                continue
            score = explain.pressure(est, request)
            for fam in _families(spec):
                if fam not in closest or score < closest[fam][0]:
                    closest[fam] = (score, spec, est)
            if gpu_ok:  # host RAM or NVMe over: the same for every micro-batch of this group
                near.append((spec, est))
                stop = True
            elif accum == 1:
                stop = True  # this estimate is its own lower bound
            else:
                evaluated += 1
                stop = estimate(arch, spec.with_(grad_accum=1), cluster).gpu_total > budget
            if stop:
                pruned += len(group.batches) - i - 1
                break
    if candidates == 0:
        raise space.unreachable_batch_error(request)
    return _result(request, plans, closest, near, candidates, evaluated, pruned, notes)


def _result(request, plans, closest, near, candidates, evaluated, pruned, notes) -> PlanResult:
    ranked = tuple(sorted(plans, key=rank_key))
    fits = {fam for p in ranked for fam in _families(p.spec)}
    rejected: list[Rejection] = [
        explain.rejection(fam, spec, est, request)
        for fam, (_, spec, est) in sorted(closest.items(), key=lambda kv: _family_order(kv[0]))
        if fam not in fits
    ]
    return PlanResult(
        request=request,
        ranked=ranked,
        rejected=tuple(rejected),
        candidates=candidates,
        evaluated=evaluated,
        pruned=pruned,
        global_batch=request.resolved_global_batch(),
        notes=notes,
        near_misses=tuple(near),
    )
