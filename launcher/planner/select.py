"""Hardware selection: with no cluster given, what to rent or buy.

For every GPU type of the catalog: the smallest count on the ladder (shapes.py: 1, 2, 4, ... GPUs
up to a node, then whole nodes up to SELECT_MAX_NODES, refined to the exact node count) where a
plan fits, the best plan there, its estimated tokens/s, and what it costs: per million training
tokens and, with --tokens, for the whole run. Prices are the catalog's per-GPU-hour defaults
(launcher/hardware.py) unless the user overrides them (--price H100=2.5). The next
SELECT_EXTRA_RUNGS rungs are planned too, and a larger count is listed as well when it is
cheaper per token (typically: enough GPUs to drop a slow offload). Sorted by cost per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.errors import FtlaunchError
from launcher.gpus import GpuType, list_gpus
from launcher.models.arch import ModelArch
from launcher.planner import search, shapes
from launcher.planner.constants import DEFAULT_MARGIN, SELECT_EXTRA_RUNGS, SELECT_MAX_NODES
from launcher.planner.plans import Plan, Request
from launcher.spec import TrainSpec


@dataclass(frozen=True)
class Choice:
    """One GPU type at one count, with its best plan and its cost."""

    shape: str  # what to pass as --gpus
    plan: Plan
    price_per_gpu_hour: float
    smallest: bool  # the smallest count that fits (else: a larger, cheaper-per-token count)
    run_tokens: float | None

    @property
    def gpus(self) -> int:
        return self.plan.cluster.world_size

    @property
    def cost_per_million_tokens(self) -> float:
        return self.gpus * self.price_per_gpu_hour / 3600 / self.plan.perf.tokens_per_s * 1e6

    @property
    def run_hours(self) -> float | None:
        return None if self.run_tokens is None else self.run_tokens / self.plan.perf.tokens_per_s / 3600

    @property
    def run_cost(self) -> float | None:
        hours = self.run_hours
        return None if hours is None else hours * self.gpus * self.price_per_gpu_hour

    def to_dict(self) -> dict:
        return {
            "gpus": self.shape,
            "gpu": self.plan.cluster.gpu.name,
            "count": self.gpus,
            "smallest": self.smallest,
            "price_per_gpu_hour_usd": self.price_per_gpu_hour,
            "tokens_per_s": round(self.plan.perf.tokens_per_s, 3),
            "cost_per_million_tokens_usd": round(self.cost_per_million_tokens, 4),
            "run_tokens": self.run_tokens,
            "run_hours": None if self.run_hours is None else round(self.run_hours, 3),
            "run_cost_usd": None if self.run_cost is None else round(self.run_cost, 2),
            "plan": self.plan.to_dict(),
        }


@dataclass(frozen=True)
class Selection:
    choices: tuple[Choice, ...]  # cheapest per token first
    unfit: tuple[tuple[str, str], ...]  # (GPU type, why it has no plan)

    def to_dict(self) -> dict:
        return {
            "choices": [c.to_dict() for c in self.choices],
            "unfit": [{"gpu": g, "reason": r} for g, r in self.unfit],
        }


def _fits(request: Request) -> bool:
    return bool(search.plan(request, mode="first").ranked)


def _choices_for(
    gpu: GpuType, template: Request, price: float, run_tokens: float | None
) -> tuple[list[Choice], str | None]:
    hardware = dict(template.hardware)
    per_node = hardware.get("gpus_per_node", gpu.default_gpus_per_node)
    rungs = shapes.ladder(per_node, SELECT_MAX_NODES, hardware)
    found = shapes.smallest_fit(template, gpu, rungs, _fits)
    if found is None:
        top = rungs[-1][0] * rungs[-1][1]
        return [], f"no plan fits on up to {top:,} GPUs ({SELECT_MAX_NODES} nodes)"
    text, req = found
    smallest = Choice(text, search.plan(req, mode="best").best, price, True, run_tokens)
    out = [smallest]
    world = req.cluster.world_size
    cheapest = smallest
    for nodes, per in [r for r in rungs if r[0] * r[1] > world][:SELECT_EXTRA_RUNGS]:
        try:
            text, cluster = shapes.build(gpu, nodes, per, hardware)
            best = search.plan(req.with_(cluster=cluster), mode="best").best
        except FtlaunchError:
            continue
        if best is not None:
            choice = Choice(text, best, price, False, run_tokens)
            if choice.cost_per_million_tokens < cheapest.cost_per_million_tokens:
                cheapest = choice
    if cheapest is not smallest:
        out.append(cheapest)
    return out, None


def select(
    arch: ModelArch,
    base: TrainSpec,
    *,
    pins: tuple[tuple[str, object], ...] = (),
    global_batch: int | None = None,
    margin: float = DEFAULT_MARGIN,
    hardware: tuple[tuple[str, float | int], ...] = (),
    prices: dict[str, float] | None = None,
    run_tokens: float | None = None,
) -> Selection:
    """The smallest fitting count of every catalog GPU type, cheapest per token first."""
    prices = prices or {}
    choices: list[Choice] = []
    unfit: list[tuple[str, str]] = []
    for gpu in list_gpus():
        per_node = dict(hardware).get("gpus_per_node", gpu.default_gpus_per_node)
        nodes, per = shapes.ladder(per_node, SELECT_MAX_NODES, dict(hardware))[0]
        try:
            _, cluster = shapes.build(gpu, nodes, per, dict(hardware))
            template = Request(arch, cluster, base, pins, global_batch, margin, hardware)
            found, why = _choices_for(gpu, template, prices.get(gpu.name, gpu.price_per_hour_usd), run_tokens)
        except FtlaunchError as err:  # e.g. a precision this GPU cannot run
            found, why = [], str(err)
        choices += found
        if why is not None:
            unfit.append((gpu.name, why))
    choices.sort(key=lambda c: (c.cost_per_million_tokens, c.plan.cluster.gpu.name, c.gpus))
    return Selection(tuple(choices), tuple(unfit))
