"""The trace estimator: one real training step under FakeTensorMode, counted by category.

`trace(arch, spec, dp)` runs launcher.trace.step in a subprocess (torch is imported there, not
here, so `ftlaunch estimate` without --trace stays light) and returns its peak and breakdown.
What it cannot trace is refused up front with one line that says why (`untraceable`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass

from launcher.errors import FtlaunchError
from launcher.memory import constants as C
from launcher.models.arch import ModelArch
from launcher.spec import BNB_OPTIMIZERS, PAGED_OPTIMIZERS, TrainSpec


class TraceError(FtlaunchError):
    pass


@dataclass(frozen=True)
class Trace:
    peak_allocated: float  # bytes per GPU
    peak_phase: str
    components: dict[str, float]  # bytes per GPU at the peak, by the analytic model's names
    moments: dict[str, float]
    params_total: int
    params_trainable: int
    seconds: float

    def to_dict(self) -> dict:
        g = C.GIB
        return {
            "peak_allocated_gib": round(self.peak_allocated / g, 3),
            "peak_phase": self.peak_phase,
            "components": {k: round(v / g, 3) for k, v in self.components.items()},
            "params": {"total": self.params_total, "trainable": self.params_trainable},
            "seconds": self.seconds,
        }


def untraceable(arch: ModelArch, spec: TrainSpec) -> str | None:
    """Why this configuration cannot be traced, or None."""
    if not arch.hf_config:
        return f"{arch.name} has no config.json contents to build the model from"
    if spec.tp > 1 or spec.pp > 1:
        return "tensor and pipeline parallelism are not traced (one rank of a TP/PP group is not simulated)"
    if spec.optimizer in PAGED_OPTIMIZERS:
        return (
            f"--optimizer {spec.optimizer} keeps its states in CUDA unified memory, paged by the driver; a traced "
            "step cannot see where they are (trace --optimizer adamw or adamw-8bit for the same tensors)"
        )
    return None


def trace(
    arch: ModelArch, spec: TrainSpec, dp: int, timeout: float = 1800, quiet: bool = False, debug: bool = False
) -> Trace:
    """Run the traced step in a subprocess; progress goes to stderr unless `quiet`."""
    why = untraceable(arch, spec)
    if why:
        raise TraceError(f"cannot trace this configuration: {why}")
    missing = [m for m in ("torch", "transformers", "peft") if importlib.util.find_spec(m) is None]
    if spec.method == "qlora" or spec.optimizer in BNB_OPTIMIZERS:
        from launcher.train.quantize import bitsandbytes_refusal

        why = bitsandbytes_refusal("tracing QLoRA" if spec.method == "qlora" else f"tracing --optimizer {spec.optimizer}")
        if why:
            raise TraceError(why)
    if missing:
        raise TraceError(
            f"--trace needs {', '.join(missing)}: pip install torch first, then -e '.[train]' "
            "(the analytic estimate above needs neither)"
        )
    request = {
        "hf_config": arch.hf_config,
        "spec": spec.to_dict(),
        "dp": dp,
        "hidden": arch.hidden,
        "vocab": arch.vocab,
        "sub_group": C.STAGE3_SUB_GROUP_SIZE,
        "zero3": {
            "prefetch": C.STAGE3_PREFETCH_FACTOR * arch.hidden**2,
            "persistence": C.STAGE3_PERSISTENCE_FACTOR * arch.hidden,
            "reuse_distance": C.STAGE3_MAX_REUSE_DISTANCE,
            "max_live": C.STAGE3_MAX_LIVE_PARAMETERS,
        },
    }
    env = dict(os.environ, DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONWARNINGS"] = "ignore"
    if debug:
        env["FTLAUNCH_DEBUG"] = "1"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "launcher.trace.step"],
            input=json.dumps(request),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if quiet else None,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise TraceError(
            f"the trace did not finish within {timeout:.0f} s; try a smaller --micro-batch or --seq-len "
            "(the trace's time grows with the number of ops, not with tensor sizes)"
        ) from None
    lines = proc.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1]) if lines else {}
    except ValueError:
        out = {}
    if "error" in out:
        raise TraceError(f"the traced step failed: {out['error']} (--debug shows the traceback)")
    if proc.returncode != 0 or "peak_bytes" not in out:
        raise TraceError(f"the traced step failed (exit {proc.returncode}); rerun with --debug to see why")
    return Trace(
        peak_allocated=float(out["peak_bytes"]),
        peak_phase=out["peak_phase"],
        components={k: float(v) for k, v in out["peak_breakdown"].items()},
        moments={k: float(v) for k, v in out["moments"].items()},
        params_total=int(out["params_total"]),
        params_trainable=int(out["params_trainable"]),
        seconds=float(out["seconds"]),
    )
