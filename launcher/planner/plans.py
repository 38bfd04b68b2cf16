"""The planner's data: what is asked (`Request`), what is found (`Plan`, `PlanResult`), and why.

A `Plan` is the contract with what comes after planning (plan.json, the DeepSpeed config, the
launch scripts are written from it): the model, the cluster, the full TrainSpec (ZeRO stage,
offloads, TP/PP, micro-batch, accumulation, checkpointing, method), the data-parallel degree,
the global batch, the memory estimate and the performance estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from launcher.errors import FtlaunchError, InvalidSpecError
from launcher.hardware import ClusterSpec
from launcher.memory.constants import GIB
from launcher.memory.estimate import Estimate, pipeline_stages
from launcher.models.arch import ModelArch
from launcher.planner.constants import DEFAULT_GLOBAL_BATCH, DEFAULT_MARGIN, SPEED_UNCERTAINTY
from launcher.planner.perf import Perf
from launcher.spec import TrainSpec

# TrainSpec fields the planner searches; a value the user gives for one of them pins it.
SEARCHED = (
    "zero_stage",
    "offload_optimizer",
    "offload_params",
    "tp",
    "pp",
    "hpz",
    "micro_batch",
    "grad_accum",
    "grad_ckpt",
    "loss",
    "optimizer_step",
)


class NoPlanFitsError(FtlaunchError):
    """Nothing in the search space fits the hardware (the analysis is printed before it)."""


@dataclass(frozen=True)
class Request:
    """What to plan: a model on a cluster, the user's training choices and what they pinned.

    `base` holds the choices the planner does not search (method, precision, optimizer, sequence
    length, attention, LoRA settings); `pins` the searched fields the user fixed. `hardware` keeps
    the parse_gpus overrides (--cpu-memory, --nvme, ...) so that suggestions on other cluster
    sizes are planned on the same kind of node the user described.
    """

    arch: ModelArch
    cluster: ClusterSpec
    base: TrainSpec = TrainSpec()
    pins: tuple[tuple[str, object], ...] = ()
    global_batch: int | None = None
    margin: float = DEFAULT_MARGIN
    hardware: tuple[tuple[str, float | int], ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.margin <= 0.9:
            raise InvalidSpecError(
                f"--margin {self.margin:g} is the fraction of GPU memory kept free: use 0 to 0.9, e.g. 0.05"
            )
        unknown = [k for k, _ in self.pins if k not in SEARCHED]
        if unknown:
            raise ValueError(f"not a searched field: {unknown}")

    @property
    def pinned(self) -> dict[str, object]:
        return dict(self.pins)

    @property
    def budget(self) -> float:
        """Bytes per GPU a plan may use: the GPU's memory less the safety margin."""
        return self.cluster.gpu_memory_gib * GIB * (1 - self.margin)

    def resolved_global_batch(self) -> int | None:
        """The global batch every candidate trains; None when --grad-accum is pinned without one
        (each candidate then trains micro-batch x data-parallel x that accumulation)."""
        if self.global_batch is not None:
            return self.global_batch
        if "grad_accum" in self.pinned:
            return None
        return default_global_batch(self.base.method, self.cluster.world_size)

    def with_(self, **changes) -> Request:
        return replace(self, **changes)


def default_global_batch(method: str, world: int) -> int:
    """The method's default global batch (DEFAULT_GLOBAL_BATCH sequences), rounded up to a multiple
    of the GPU count."""
    return world * -(-DEFAULT_GLOBAL_BATCH[method] // world)


def moving_parts(spec: TrainSpec) -> int:
    """What can go wrong or run slower than modelled, each within the speed model's error band
    (constants.SPEED_UNCERTAINTY)."""
    weight = {"none": 0, "cpu": 1, "nvme": 2}
    return (
        weight[spec.offload_optimizer]
        + weight[spec.offload_params]
        + (spec.zero_stage == 3)
        + (spec.tp > 1)
        + (spec.pp > 1)
        + (spec.loss == "chunked")
        + (spec.optimizer_step == "in-backward")
        + (spec.hpz > 1)
    )


def ranking_speed(spec: TrainSpec, perf: Perf) -> float:
    """Tokens/s discounted by the speed model's error band per moving part: a plan with more of
    them must be faster by more than that band to win (plans within it are ties, broken by fewer
    moving parts)."""
    return perf.tokens_per_s * (1 - SPEED_UNCERTAINTY) ** moving_parts(spec)


@dataclass(frozen=True)
class Plan:
    """One configuration that fits, with its memory and performance estimates."""

    arch: ModelArch
    cluster: ClusterSpec
    spec: TrainSpec
    dp: int
    global_batch: int
    estimate: Estimate
    perf: Perf
    budget: float  # bytes per GPU allowed (GPU memory less the margin)
    batch_exact: bool = True  # False: the nearest global batch its layout splits, not the one asked for

    @property
    def family(self) -> str:
        return sharding_label(self.spec)

    @property
    def layout(self) -> str:
        return f"TP {self.spec.tp} x PP {self.spec.pp} x DP {self.dp}"

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.spec.seq_len

    def batch_note(self, asked: int | None) -> str | None:
        """Why this plan's global batch is not the one asked for (None when it is)."""
        if asked is None or asked == self.global_batch:
            return None
        return (
            f"the global batch {asked:,} does not split over {self.dp} data-parallel ranks "
            f"(micro-batch x {self.dp} x accumulation): this plan runs {self.global_batch:,}, the nearest it can; "
            f"pin --global-batch {self.global_batch} to take it, or choose a layout that splits {asked:,}"
        )

    def summary(self) -> str:
        """One line: sharding, layout, batch, recompute and speed."""
        s = self.spec
        return (
            f"{self.family}, {self.layout}, micro-batch {s.micro_batch} x accum {s.grad_accum}, "
            f"recompute {', '.join([s.grad_ckpt, *s.techniques()])}: "
            f"{self.perf.tokens_per_s:,.0f} tokens/s"
        )

    def to_dict(self) -> dict:
        return {
            "family": self.family,
            "model": {"name": self.arch.name, "params": self.arch.total_params},
            "cluster": {
                "gpu": self.cluster.gpu.name,
                "nodes": self.cluster.nodes,
                "gpus_per_node": self.cluster.gpus_per_node,
                "world_size": self.cluster.world_size,
                "gpu_memory_gib": self.cluster.gpu_memory_gib,
            },
            "spec": self.spec.to_dict(),
            "tp": self.spec.tp,
            "pp": self.spec.pp,
            "dp": self.dp,
            "global_batch": self.global_batch,
            "tokens_per_step": self.tokens_per_step,
            "budget_gib": round(self.budget / GIB, 3),
            "memory": self.estimate.to_dict(self.cluster),
            "pipeline_stages": pipeline_stages(self.arch, self.spec, self.cluster),
            "perf": self.perf.to_dict(),
            # the ranking's figure: tokens/s less the speed model's uncertainty per moving part
            "moving_parts": moving_parts(self.spec),
            "ranking_tokens_per_s": round(ranking_speed(self.spec, self.perf), 3),
            "speed_error_band": SPEED_UNCERTAINTY,
        }


DEVICE = {"cpu": "CPU", "nvme": "NVMe"}


def sharding_label(spec: TrainSpec) -> str:
    """'ZeRO-2', 'ZeRO-3 + offload optimizer->CPU, params->NVMe', ..."""
    parts = [
        f"{what}->{DEVICE[where]}"
        for what, where in (("optimizer", spec.offload_optimizer), ("params", spec.offload_params))
        if where != "none"
    ]
    label = f"ZeRO-{spec.zero_stage}" + (f" + offload {', '.join(parts)}" if parts else "")
    return label + (f" + hpZ {spec.hpz}" if spec.hpz > 1 else "")


@dataclass(frozen=True)
class Rejection:
    """Why a family of plans (a sharding choice, a TP or a PP degree) has no member that fits:
    the binding constraint of its member closest to fitting."""

    family: str
    constraint: str  # "gpu" | "host" | "nvme"
    needed: float  # bytes (per GPU for "gpu", per node otherwise)
    available: float
    reason: str  # one sentence, starting with the family
    closest: str  # the configuration the sentence is about

    def to_dict(self) -> dict:
        return {
            "family": self.family,
            "constraint": self.constraint,
            "needed_gib": round(self.needed / GIB, 3),
            "available_gib": round(self.available / GIB, 3),
            "reason": self.reason,
            "closest": self.closest,
        }


@dataclass(frozen=True)
class Suggestion:
    """A computed change that makes a plan fit, verified by planning with it."""

    kind: str  # "gpus" | "method" | "cpu_memory" | "nvme" | "seq_len"
    flags: tuple[tuple[str, str], ...]  # command-line flags that apply the change
    text: str
    plan: Plan  # the best plan once the change is applied

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "flags": dict(self.flags),
            "text": self.text,
            "plan": self.plan.to_dict(),
        }


@dataclass(frozen=True)
class PlanResult:
    """Feasible plans best first, the rejected families, and how much was searched."""

    request: Request
    ranked: tuple[Plan, ...]
    rejected: tuple[Rejection, ...]
    candidates: int  # configurations in the search space
    evaluated: int  # memory estimates computed (lower-bound checks included)
    pruned: int  # candidates never estimated: provably over budget or slower than a twin that fits
    # (the chunked loss where the whole one fits), or (modes best/first) not needed
    global_batch: int | None
    notes: tuple[str, ...] = ()
    near_misses: tuple[tuple[TrainSpec, Estimate], ...] = field(default=(), compare=False, repr=False)
    suggestions: tuple[Suggestion, ...] = ()

    @property
    def best(self) -> Plan | None:
        return self.ranked[0] if self.ranked else None

    def to_dict(self) -> dict:
        r = self.request
        node = r.cluster.node
        return {
            "model": {"name": r.arch.name, "params": r.arch.total_params},
            "cluster": {
                "gpu": r.cluster.gpu.name,
                "nodes": r.cluster.nodes,
                "gpus_per_node": r.cluster.gpus_per_node,
                "gpu_memory_gib": r.cluster.gpu_memory_gib,
                "cpu_memory_gib_per_node": node.cpu_memory_gib,
                "nvme_gib_per_node": node.nvme_gib,
                "notes": list(r.cluster.notes),
            },
            "request": {
                "method": r.base.method,
                "precision": r.base.precision,
                "optimizer": r.base.optimizer,
                "seq_len": r.base.seq_len,
                "global_batch": self.global_batch,
                "margin": r.margin,
                "budget_gib": round(r.budget / GIB, 3),
                "pinned": {k: v for k, v in r.pins},
            },
            "search": {"candidates": self.candidates, "evaluated": self.evaluated, "pruned": self.pruned},
            "fits": bool(self.ranked),
            "plans": [{**p.to_dict(), "global_batch_note": p.batch_note(self.global_batch)} for p in self.ranked],
            "rejected": [x.to_dict() for x in self.rejected],
            "suggestions": [s.to_dict() for s in self.suggestions],
            "notes": list(self.notes),
        }
