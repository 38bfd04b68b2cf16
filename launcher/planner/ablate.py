"""What each technique buys: memory and speed as techniques are added one by one, cumulatively.

From a naive baseline (full fine-tuning, fp32, AdamW, no checkpointing, ZeRO-0) each row adds
one technique on top of all the previous ones, on the request's cluster with TP = PP = 1,
micro-batch 1 and the accumulation that reaches the global batch; the user's sequence length,
attention and LoRA settings are kept. The CPU-offload row goes back to AdamW (DeepSpeed's CPU
optimizer cannot run 8-bit AdamW). Mixed precision usually RAISES model-state memory (fp32
master weights and gradient copy next to the 16-bit ones) while halving activations: the table
shows it rather than hiding it.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.errors import InvalidSpecError
from launcher.memory.constants import GIB
from launcher.memory.estimate import Estimate, estimate
from launcher.planner.perf import Perf, performance
from launcher.planner.plans import Request

STEPS: tuple[tuple[str, dict], ...] = (
    (
        "baseline: full fine-tuning, fp32, AdamW, no checkpointing, ZeRO-0",
        dict(method="full", precision="fp32", optimizer="adamw", grad_ckpt="none", zero_stage=0, compile=False),
    ),
    ("+ activation checkpointing (full recompute)", dict(grad_ckpt="full")),
    ("+ bf16 mixed precision", dict(precision="bf16")),
    ("+ 8-bit AdamW", dict(optimizer="adamw-8bit")),
    ("+ ZeRO-1 (optimizer states sharded)", dict(zero_stage=1)),
    ("+ ZeRO-2 (+ gradients sharded)", dict(zero_stage=2)),
    ("+ ZeRO-3 (+ weights sharded)", dict(zero_stage=3)),
    (
        "+ CPU offload of optimizer and weights (AdamW on the CPU)",
        dict(offload_optimizer="cpu", offload_params="cpu", optimizer="adamw"),
    ),
    ("+ LoRA (frozen base weights)", dict(method="lora")),
    ("+ QLoRA (4-bit base weights)", dict(method="qlora")),
    # last: with the head frozen it always saves (a trained head adds its per-chunk weight gradient)
    ("+ chunked loss (LM head + cross-entropy 1024 tokens at a time)", dict(loss="chunked")),
    # speed only: the memory plan of compiled blocks is the eager one (an upper bound)
    ("+ torch.compile of every block (--compile: fused element-wise work)", dict(compile=True)),
)


@dataclass(frozen=True)
class Row:
    label: str
    spec_changes: dict
    estimate: Estimate
    perf: Perf
    fits: bool  # GPU within budget, host RAM and NVMe within the node's

    def to_dict(self) -> dict:
        return {
            "technique": self.label,
            "changes": self.spec_changes,
            "gpu_total_gib": round(self.estimate.gpu_total / GIB, 3),
            "host_per_node_gib": round(self.estimate.host_per_node / GIB, 3),
            "nvme_per_node_gib": round(self.estimate.nvme_per_node / GIB, 3),
            "fits": self.fits,
            "tokens_per_s": round(self.perf.tokens_per_s, 3),
            "step_time_s": round(self.perf.step_time_s, 4),
        }


def ablate(request: Request) -> tuple[Row, ...]:
    cluster = request.cluster
    world = cluster.world_size
    gb = request.resolved_global_batch() or world
    if gb % world:
        raise InvalidSpecError(
            f"--ablate runs every row at micro-batch 1 on all {world} GPUs: use a --global-batch "
            f"that is a multiple of {world}"
        )
    mixed = "bf16" if cluster.gpu.bf16 else "fp16"
    spec = request.base.with_(
        tp=1, pp=1, micro_batch=1, grad_accum=gb // world, offload_optimizer="none", offload_params="none"
    )
    node = cluster.node
    rows = []
    for label, changes in STEPS:
        changes = {k: (mixed if v == "bf16" else v) for k, v in changes.items()}
        spec = spec.with_(**changes)
        est = estimate(request.arch, spec, cluster)
        fits = (
            est.gpu_total <= request.budget
            and est.host_per_node <= node.cpu_memory_gib * GIB
            and est.nvme_per_node <= node.nvme_gib * GIB
        )
        perf = performance(request.arch, spec, cluster, world)
        rows.append(Row(label.replace("bf16", mixed), changes, est, perf, fits))
    return tuple(rows)
