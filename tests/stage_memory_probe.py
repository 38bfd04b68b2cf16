"""Each pipeline stage's activation peak, and a data-parallel step's transient peak, measured in the
real engine, against the memory model.

Run as a script under torchrun it is a worker rank (python -m launcher.train RUN_DIR) whose
second optimizer step runs inside tests/memtrack.ActivationPeak, writing that step's peak to
$FTLAUNCH_PROBE_OUT/rank-N.json (the first step is left out: it allocates the buffers DeepSpeed
keeps from then on). `measure_stages` writes a run directory, runs the ranks and pairs each
stage's measurement with launcher/memory/estimate.stage_activations; `measure_step` the whole step
of a pp 1 plan with the estimate. Used by tests/test_pipeline_memory.py, tests/test_zero3_memory.py
and bench/pipeline_memory.py."""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.train import engines, loop  # noqa: E402
from tests.memtrack import ActivationPeak  # noqa: E402

MEASURED_STEP = 1  # 0-based: the second optimizer step
WORDS = "the a of model memory stage pipeline gradient tensor batch layer token cluster node rank".split()


def long_records(path: Path, n: int = 64, words: int = 2000) -> Path:
    """Text records far longer than any test's sequence length, so every micro-batch is full
    (the worker pads a batch only to its longest row)."""
    import random

    rng = random.Random(0)
    path.write_text("".join(json.dumps({"text": " ".join(rng.choices(WORDS, k=words))}) + "\n" for _ in range(n)))
    return path


def _run(root: Path, spec, gpus: str, hf_config: dict) -> Path:
    """Write a run directory for `spec`, train its 2 steps with the probe on every rank; the
    directory of the ranks' measurements."""
    import subprocess

    from launcher.hardware import parse_gpus
    from tests.runs import cpu_env, make_run

    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.json"
    config.write_text(json.dumps(hf_config))
    data = long_records(root / "long.jsonl")
    run_dir, _ = make_run(root, "probe", spec, model=str(config), gpus=gpus, max_steps=2, save_every=100,
                          data=str(data))  # fmt: skip
    out = root / "measured"
    out.mkdir()
    world = parse_gpus(gpus).world_size
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}", __file__, str(run_dir)]
    proc = subprocess.run(cmd, env={**cpu_env(), "FTLAUNCH_PROBE_OUT": str(out)}, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    if proc.returncode:
        raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-3000:])
    return out


def measure_stages(root: Path, spec, gpus: str, hf_config: dict) -> list[tuple[float, float]]:
    """(modelled, measured) activation bytes of each stage (its first data-parallel rank)."""
    from launcher.hardware import parse_gpus
    from launcher.memory.estimate import stage_activations
    from launcher.models.hf_config import arch_from_hf_config

    out = _run(root, spec, gpus, hf_config)
    dp = parse_gpus(gpus).world_size // spec.pp
    measured = [json.loads((out / f"rank-{s * dp}.json").read_text())["activation_peak"] for s in range(spec.pp)]
    modelled = stage_activations(arch_from_hf_config(hf_config, "probe"), spec, parse_gpus(gpus))
    return list(zip(modelled, measured, strict=True))


def measure_step(root: Path, spec, gpus: str, hf_config: dict) -> tuple[float, float]:
    """(modelled, measured) bytes the busiest rank allocates during a step of a pp 1 plan and frees by its end:
    the peak of the second step's new storages, against the estimate's peak less what it counts as
    kept from step to step (the weights' partition, master weights, optimizer states, persistent
    gradient buffer of ZeRO-3 and the reduce bucket, all made by the first step)."""
    return _step_figures(_run(root, spec, gpus, hf_config), spec, gpus, hf_config)


def _step_figures(out: Path, spec, gpus: str, hf_config: dict) -> tuple[float, float]:
    from launcher.hardware import parse_gpus
    from launcher.memory import states as S
    from launcher.memory.estimate import estimate
    from launcher.models.hf_config import arch_from_hf_config

    cluster = parse_gpus(gpus)
    arch = arch_from_hf_config(hf_config, "probe")
    dp = cluster.world_size // (spec.tp * spec.pp)
    p = S.stage_params(arch, spec, arch.layers, True, True)
    st = S.model_states(spec, p, dp, arch.hidden)
    _, bucket = S.zero_buffers(spec, arch, p)
    kept = st.weights + st.master + st.optimizer + bucket
    # ZeRO-3's gradient partition buffer is made once; every other gradient buffer (ZeRO-1/2's
    # partition, accumulated gradients) is made in the step and freed by its end
    kept += st.grads if spec.zero_stage == 3 else 0.0
    modelled = estimate(arch, spec, cluster).peak_allocated - kept
    # the model counts the busiest rank (ZeRO-1/2: the one whose partition holds a gradient's piece)
    return modelled, max(json.loads(f.read_text())["peak"] for f in out.glob("rank-*.json"))


def measure_hpz(root: Path, spec, gpus: str, hf_config: dict) -> tuple[tuple[float, float], tuple[float, list[float]]]:
    """One run of a ZeRO++ hpZ plan: measure_step's (modelled, measured) step figures, and the
    (modelled, measured on each rank) bytes of its secondary weight shards: what the memory model
    adds to a ZeRO-3 rank's weights from the backward to the step, against the ds_secondary_tensor
    bytes DeepSpeed holds at the end of the measured step's backward."""
    from launcher.hardware import parse_gpus
    from launcher.memory import states as S
    from launcher.models.hf_config import arch_from_hf_config

    out = _run(root, spec, gpus, hf_config)
    arch = arch_from_hf_config(hf_config, "probe")
    p = S.stage_params(arch, spec, arch.layers, True, True)
    modelled = S.model_states(spec, p, parse_gpus(gpus).world_size).secondary
    measured = [json.loads(f.read_text())["secondary"] for f in sorted(out.glob("rank-*.json"))]
    return _step_figures(out, spec, gpus, hf_config), (modelled, measured)


def measured(step_fn):
    def step(self, batches, step: int):
        if step != MEASURED_STEP:
            return step_fn(self, batches, step)
        gc.collect()
        with ActivationPeak(self.ds.module.parameters()) as live:
            out = step_fn(self, batches, step)
        secondary = SECONDARY.pop("bytes", 0)
        path = Path(os.environ["FTLAUNCH_PROBE_OUT"]) / f"rank-{os.environ['RANK']}.json"
        path.write_text(json.dumps({"activation_peak": live.activation_peak, "peak": live.peak,
                                    "grad_peak": live.grad_peak, "secondary": secondary}))  # fmt: skip
        return out

    return step


SECONDARY: dict[str, int] = {}  # ZeRO++ hpZ's secondary weight shards at the end of the measured backward


def secondary_after(backward):
    """DeepSpeed's backward, then the bytes of the secondary shards it left on this rank (made as
    modules are released, dropped after the optimizer step)."""

    def run(self, *args, **kwargs):
        out = backward(self, *args, **kwargs)
        SECONDARY["bytes"] = max(SECONDARY.get("bytes", 0), sum(
            t.numel() * t.element_size()
            for t in (getattr(p, "ds_secondary_tensor", None) for p in self.module.parameters())
            if t is not None
        ))  # fmt: skip
        return out

    return run


if __name__ == "__main__":
    import deepspeed

    deepspeed.DeepSpeedEngine.backward = secondary_after(deepspeed.DeepSpeedEngine.backward)
    engines.Pipeline.step = measured(engines.Pipeline.step)
    engines.DataParallel.step = measured(engines.DataParallel.step)
    loop.exit_process(loop.main())  # as the worker ends (loop.exit_process: a rare teardown abort with offload)
