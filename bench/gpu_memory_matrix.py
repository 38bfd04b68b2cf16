"""bench/gpu_memory.py's matrix: which configurations, in which order, which are skipped, and
which fit the time budget. No torch and no subprocess here: tests/test_gpu_memory_script.py
checks all of it in milliseconds."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

# Predicted wall time of one row (for the budget): a fresh interpreter with torch, transformers,
# peft and DeepSpeed, DeepSpeed's start-up, then loading / moving the weights and a few steps.
# The first row of a model also writes its random checkpoint.
ROW_OVERHEAD_S = 25.0
ROW_S_PER_BPARAM = 3.0
WEIGHTS_S_PER_BPARAM = 3.0


@dataclasses.dataclass(frozen=True)
class Config:
    model: str
    method: str
    grad_ckpt: str
    seq_len: int
    micro_batch: int
    precision: str = "bf16"
    compile: bool = False  # --compile: every block under torch.compile (the speed model's fused term)

    @property
    def name(self) -> str:
        name = f"{self.model}-{self.method}-ckpt-{self.grad_ckpt}-s{self.seq_len}-b{self.micro_batch}"
        return name + ("-compiled" if self.compile else "")

    def args(self, gpus: str, gpu_memory: float | None = None) -> dict:
        """`ftlaunch estimate` flags (underscores for dashes), as published_memory.jsonl writes them."""
        args = {
            "model": self.model,
            "gpus": gpus,
            "method": self.method,
            "precision": self.precision,
            "optimizer": "adamw",
            "micro_batch": self.micro_batch,
            "seq_len": self.seq_len,
            "grad_ckpt": self.grad_ckpt,
            "attention": "sdpa",
            "zero_stage": 0,
            "tp": 1,
            "pp": 1,
        }
        if self.compile:
            args["compile"] = True
        if gpu_memory is not None:
            args["gpu_memory"] = gpu_memory
        return args


def matrix(
    models: list[str],
    methods: list[str],
    ckpts: list[str],
    seq_lens: list[int],
    micro_batches: list[int],
    precision: str = "bf16",
    compile: bool = False,
) -> list[tuple[int, Config]]:
    """(pass, config) for the cross product. Pass 0: first checkpointing mode, shortest sequence,
    smallest micro-batch; then the variants with the most tokens first, the last checkpointing
    mode (the one that changes most) before the others."""
    seqs, mbs = sorted(seq_lens), sorted(micro_batches)
    variants = [(c, s, b) for c in ckpts for s in seqs for b in mbs]
    first = (ckpts[0], seqs[0], mbs[0])
    rest = sorted((v for v in variants if v != first), key=lambda v: (-v[1] * v[2], -ckpts.index(v[0]), v[2]))
    rank = {v: i for i, v in enumerate([first, *rest])}
    return [
        (rank[(c, s, b)], Config(m, meth, c, s, b, precision, compile))
        for m in models
        for meth in methods
        for (c, s, b) in variants
    ]


def predicted_s(params: int, with_weights: bool) -> float:
    b = params / 1e9
    return ROW_OVERHEAD_S + ROW_S_PER_BPARAM * b + (WEIGHTS_S_PER_BPARAM * b if with_weights else 0.0)


def plan_rows(
    passes: list[tuple[int, Config]],
    estimates: dict[Config, dict],
    unavailable: dict[str, str],
    run_unfit: bool = False,
) -> list[dict]:
    """Rows in run order (pass, then predicted time, then estimated peak); `status` is None for a
    row to run, or why it is skipped. `estimates[c]` is `ftlaunch estimate --json`'s object or
    {"error": ...}; `unavailable` maps a method to why it cannot run here."""
    rows = []
    for p, c in passes:
        est = estimates[c]
        row = {"pass": p, "name": c.name, **dataclasses.asdict(c)}
        per_gpu = est.get("per_gpu", {})
        row["est_peak_allocated_gib"] = per_gpu.get("peak_allocated_gib")
        row["est_peak_reserved_gib"] = per_gpu.get("peak_reserved_gib")
        row["est_fits"] = est.get("fits")
        row["params"] = est.get("params", {}).get("total", 0)
        row["status"] = None
        if "error" in est:
            row["status"] = f"skipped: estimate failed: {est['error']}"
        elif c.method in unavailable:
            row["status"] = f"skipped: {unavailable[c.method]}"
        elif not est["fits"] and not run_unfit:
            row["status"] = (
                f"skipped: estimate says it does not fit ({per_gpu['total_gib']:.1f} GiB with the CUDA "
                f"context > {per_gpu['gpu_memory_gib']:.1f} GiB)"
            )
        rows.append((row, c))
    rows.sort(key=lambda rc: (rc[0]["pass"], rc[0]["params"], rc[0]["est_peak_allocated_gib"] or 0))
    return [r for r, _ in rows]


def run_rows(
    rows: list[dict],
    run_one: Callable[[dict, float], dict],
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
    started: float | None = None,
    on_row: Callable[[list[dict]], None] | None = None,
) -> list[dict]:
    """Run every row whose status is None, in order, while its predicted time fits what is left of
    the budget; a row that does not fit is 'not run: budget' and later (cheaper) rows still may.
    `run_one(row, seconds_left)` returns the fields to merge, `status` among them."""
    start = clock() if started is None else started
    made: set[str] = set()
    for row in rows:
        if row["status"] is not None:
            continue
        row["predicted_s"] = round(predicted_s(row["params"], row["model"] not in made))
        left = budget_s - (clock() - start)
        if row["predicted_s"] > left:
            row["status"] = f"not run: budget ({row['predicted_s']} s predicted, {max(left, 0):.0f} s left)"
            continue
        t0 = clock()
        row.update(run_one(row, left))
        row["wall_s"] = round(clock() - t0, 1)
        made.add(row["model"])
        if on_row:
            on_row(rows)
    return rows
