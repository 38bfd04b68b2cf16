"""The search: every candidate's memory verdict, the feasible ones ranked by estimated speed.

A candidate is feasible when the memory model's GPU total is within the budget (GPU memory less
the margin) and its host RAM and NVMe per node are within the node's. Feasible plans are ranked
by estimated tokens/s, discounted by the speed model's error band (its median error on published
runs it was not fitted on) for each moving part (offload, ZeRO-3, TP, PP, the chunked loss: plans
within the band are ties, and the simpler plan wins unless the other is faster by more than it);
ties go to fewer moving parts (lower ZeRO stage, less offload, smaller TP,
smaller PP, less recompute, the whole loss, smaller micro-batch), so the order is total and deterministic.

Pruning (only what provably cannot fit or cannot win, never what merely seems slow). Within a
group (same sharding, TP, PP, recompute) candidates differ in micro-batch only:
  * Host RAM and NVMe do not depend on the micro-batch or the accumulation, so once they are
    over, every micro-batch of the group is over too.
  * The GPU total with accumulation 1 is a lower bound for the same micro-batch at any
    accumulation (accumulation only adds persistent gradient buffers and, with PP, micro-batches
    in flight), and it grows with the micro-batch (every activation term is linear in it). When
    that bound is over the budget, no larger micro-batch of the group can fit.
    tests/test_planner_search.py checks both properties on a grid, and the pruned search
    against an exhaustive one.
Modes: "all" walks each group from the smallest micro-batch up and ranks every feasible plan;
"best" drops every group whose lower bound (smallest micro-batch, accumulation 1) is over, orders
the remaining candidates by their performance estimate and estimates memory in that order until
one fits: everything after it ranks lower, so it is the best plan "all" would give (tested), for
less work; "first" stops at any feasible plan (an existence check for advice and selection).
A chunked-loss candidate whose whole-loss twin fits is dropped: the twin is the same plan, faster;
likewise an in-backward candidate whose after-backward twin fits (the same plan, fewer moving parts).
"""

from __future__ import annotations

from launcher.memory.constants import GIB
from launcher.memory.estimate import Estimate, estimate
from launcher.planner import explain, space
from launcher.planner.perf import Perf, performance
from launcher.planner.plans import Plan, PlanResult, Request, ranking_speed, sharding_label
from launcher.spec import TrainSpec

MODES = ("all", "best", "first")


def order_key(spec: TrainSpec, perf: Perf) -> tuple:
    """Faster first, more moving parts paying the speed model's uncertainty each; at equal
    speed, fewer moving parts."""
    return (
        -ranking_speed(spec, perf),
        space.SHARDING_RANK[(spec.zero_stage, spec.offload_optimizer, spec.offload_params)],
        spec.hpz,
        spec.tp,
        spec.pp,
        space.CKPT_RANK[spec.grad_ckpt],
        space.LOSS_RANK[spec.loss],
        space.STEP_RANK[spec.optimizer_step],
        spec.micro_batch,
    )


def rank_key(plan: Plan) -> tuple:
    # a plan that runs the global batch asked for ranks above every plan that runs the nearest one
    # its layout splits (space._batches): that changes the training, not only its speed
    return (not plan.batch_exact, *order_key(plan.spec, plan.perf))


def _families(spec: TrainSpec) -> tuple[str, ...]:
    out = (sharding_label(spec), f"TP {spec.tp}")
    return out + (f"PP {spec.pp}",) if spec.pp > 1 else out


_SHARDING_ORDER = {
    sharding_label(TrainSpec(zero_stage=z, offload_optimizer=o, offload_params=p)): i
    for i, (z, o, p) in enumerate(space.SHARDINGS)
}


def _family_order(family: str) -> tuple:
    """Sharding families in SHARDINGS order (each without hpZ first), then TP degrees, then PP degrees."""
    base, _, hpz = family.partition(" + hpZ ")
    if base in _SHARDING_ORDER:
        return (0, _SHARDING_ORDER[base], int(hpz or 1))
    kind, degree = family.split()
    return (1 if kind == "TP" else 2, int(degree))


class _Search:
    """The verdicts of one search, and the bookkeeping every mode shares."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.base, self.notes = space.effective_base(request)
        node = request.cluster.node
        self.host_cap = node.cpu_memory_gib * GIB
        self.nvme_cap = node.nvme_gib * GIB
        self.groups = list(space.groups(request, self.base))
        self.asked = request.resolved_global_batch()
        self.candidates = sum(len(g.batches) for g in self.groups)
        if self.candidates == 0:
            raise space.unreachable_batch_error(request)
        self.evaluated = 0  # memory estimates, lower-bound checks included
        self.visited = 0  # candidates whose memory was estimated
        self.closest: dict[str, tuple[float, TrainSpec, Estimate]] = {}
        self.near: list[tuple[TrainSpec, Estimate]] = []

    def exact(self, global_batch: int) -> bool:
        """Whether a plan of this global batch runs the one asked for (or none was)."""
        return self.asked is None or global_batch == self.asked

    def verdict(self, spec: TrainSpec, accum: int) -> tuple[Estimate | None, int | None]:
        """(the estimate if it fits, else None; the micro-batch index from which the group is
        provably over: 0 = the whole group, 1 = from the next one, None = not known)."""
        arch, cluster, budget = self.request.arch, self.request.cluster, self.request.budget
        est = estimate(arch, spec, cluster)
        self.evaluated += 1
        self.visited += 1
        gpu_ok = est.gpu_total <= budget
        if gpu_ok and est.host_per_node <= self.host_cap and est.nvme_per_node <= self.nvme_cap:
            return est, None
        score = explain.pressure(est, self.request)
        for fam in _families(spec):
            if fam not in self.closest or score < self.closest[fam][0]:
                self.closest[fam] = (score, spec, est)
        if gpu_ok:  # host RAM or NVMe over: the same for every micro-batch of this group
            self.near.append((spec, est))
            return None, 0
        if accum == 1:
            return None, 1  # this estimate is its own lower bound
        self.evaluated += 1
        over = estimate(arch, spec.with_(grad_accum=1), cluster).gpu_total > budget
        return None, 1 if over else None

    def result(self, plans: list[Plan], complete: bool = True) -> PlanResult:
        """The result; rejected families only for a complete search (the others saw too little)."""
        ranked = tuple(sorted(plans, key=rank_key))
        fits = {fam for p in ranked for fam in _families(p.spec)}
        rejected = [
            explain.rejection(fam, spec, est, self.request)
            for fam, (_, spec, est) in sorted(self.closest.items(), key=lambda kv: _family_order(kv[0]))
            if complete and fam not in fits
        ]
        return PlanResult(
            request=self.request,
            ranked=ranked,
            rejected=tuple(rejected),
            candidates=self.candidates,
            evaluated=self.evaluated,
            pruned=self.candidates - self.visited,
            global_batch=self.request.resolved_global_batch(),
            notes=self.notes,
            near_misses=tuple(self.near),
        )


def plan(request: Request, *, mode: str = "all") -> PlanResult:
    """Search the space of `request`: every feasible plan ranked ("all"), the best plan only
    ("best"), or any one feasible plan ("first"); see the module docstring."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    s = _Search(request)
    arch, cluster, budget = request.arch, request.cluster, request.budget
    if mode == "best":
        return _best(s)
    plans: list[Plan] = []
    simpler_fits: set[TrainSpec] = set()
    over: set[TrainSpec] = set()  # candidates known to be over budget
    for group in s.groups:
        for i, (micro, accum, gb) in enumerate(group.batches):
            spec = group.spec.with_(micro_batch=micro, grad_accum=accum)
            if spec.hpz > 1 and spec.with_(hpz=1) in over:
                # hpZ only adds its secondary shards to the same plan without it: over too
                over.add(spec)
                continue
            if any(twin in simpler_fits for twin in _simpler_twins(spec)):
                # the same plan with the whole loss / the usual step fits and is faster or simpler:
                # pruned (its group comes before this one: space.groups). It needs no more memory
                # than that twin, so it stands for a fitting plan to its own twins
                simpler_fits.add(spec)
                continue
            est, over_from = s.verdict(spec, accum)
            if est is not None:
                simpler_fits.add(spec)
                perf = performance(arch, spec, cluster, group.dp)
                plans.append(Plan(arch, cluster, spec, group.dp, gb, est, perf, budget, s.exact(gb)))
                if mode == "first":
                    return s.result(plans, complete=False)
            else:
                over.add(spec)
                if over_from is not None:
                    # walking up from the smallest micro-batch: the rest of the group is over
                    over.update(group.spec.with_(micro_batch=m, grad_accum=a) for m, a, _ in group.batches[i:])
                    break
    return s.result(plans)


def _simpler_twins(spec: TrainSpec) -> list[TrainSpec]:
    """The same plan without one of the memory techniques it adds (the whole loss, the optimizer
    step after the backward); each is faster or simpler and comes earlier in space.groups."""
    twins = []
    if spec.optimizer_step == "in-backward":
        twins.append(spec.with_(optimizer_step="after-backward"))
    if spec.loss == "chunked":
        twins.append(spec.with_(loss="full"))
    return twins


def _best(s: _Search) -> PlanResult:
    request = s.request
    arch, cluster, budget = request.arch, request.cluster, request.budget
    ordered = []
    for g, group in enumerate(s.groups):
        # the smallest micro-batch at accumulation 1 bounds every member of the group from below
        # (GPU), and host RAM / NVMe are the same for all of them: one estimate may close it
        floor = estimate(arch, group.spec.with_(micro_batch=group.batches[0][0], grad_accum=1), cluster)
        s.evaluated += 1
        if floor.gpu_total > budget or floor.host_per_node > s.host_cap or floor.nvme_per_node > s.nvme_cap:
            continue
        for i, (micro, accum, gb) in enumerate(group.batches):
            spec = group.spec.with_(micro_batch=micro, grad_accum=accum)
            perf = performance(arch, spec, cluster, group.dp)
            ordered.append(((not s.exact(gb), *order_key(spec, perf)), g, i, spec, perf, gb))
    ordered.sort(key=lambda c: c[0])
    over: dict[int, int] = {}  # group -> the micro-batch index from which it is provably over
    for _, g, i, spec, perf, gb in ordered:
        if over.get(g, i + 1) <= i:
            continue
        est, over_from = s.verdict(spec, spec.grad_accum)
        if est is not None:  # the first feasible in rank order: everything after ranks lower
            best = Plan(arch, cluster, spec, s.groups[g].dp, gb, est, perf, budget, s.exact(gb))
            return s.result([best], complete=False)
        if over_from is not None:
            start = 0 if over_from == 0 else i + 1
            over[g] = min(over.get(g, start), start)
    return s.result([], complete=False)
