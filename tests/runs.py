"""Helpers for tests that write and run real run directories on the CPU."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from launcher.emit import artifacts
from launcher.hardware import parse_gpus
from launcher.memory.estimate import estimate, pipeline_stages
from launcher.models.catalog import resolve_model
from launcher.rundir import TrainingConfig
from launcher.spec import TrainSpec

ROOT = Path(__file__).resolve().parents[1]


def make_run(
    root: Path,
    name: str,
    spec: TrainSpec,
    model: str = "tiny-llama",
    gpus: str = "1x2xA100",
    max_restarts: int = 0,
    nvme_path: str | None = None,
    replan: bool = False,
    **training,
):
    arch = resolve_model(model)
    cluster = parse_gpus(gpus)
    dp = cluster.world_size // (spec.tp * spec.pp)
    est = estimate(arch, spec, cluster)
    training.setdefault("init", "random")
    cfg = TrainingConfig(**training)
    run = artifacts.run_file(
        name,
        arch,
        model,
        spec,
        cluster,
        dp,
        spec.micro_batch * spec.grad_accum * dp,
        {"memory": est.to_dict(), "pipeline_stages": pipeline_stages(arch, spec, cluster)},  # as the planner writes it
        cfg,
        max_restarts=max_restarts,
    )
    cpu = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}  # as `--cpu` writes it
    where = {"nvme_path": nvme_path} if nvme_path else {}  # else the emitter's default
    run_dir, argv = artifacts.write(
        root, run, arch, spec, cluster, explain="test run\n", env=cpu, replan=replan, **where
    )
    return run_dir, argv


def events(run_dir: Path) -> list[dict]:
    """The worker's event records (logs/metrics.jsonl rows with an "event")."""
    rows = [json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "event" in r]


def cpu_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        PYTHONUNBUFFERED="1",
    )
    return env


def cpu_fp16_env(has_kernels: bool) -> dict[str, str]:
    """cpu_env on a CPU that has (or lacks) oneDNN's fp16 kernels, whatever this one has
    (tests/cpu_fp16/sitecustomize.py)."""
    env = cpu_env()
    env["PYTHONPATH"] = str(ROOT / "tests" / "cpu_fp16") + os.pathsep + env["PYTHONPATH"]
    env["FTLAUNCH_TEST_CPU_FP16"] = "1" if has_kernels else "0"
    return env


def run_torchrun(
    argv: list[str], timeout: int = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env or cpu_env(), capture_output=True, text=True, timeout=timeout)


def python() -> str:
    return sys.executable


def digests(root: Path) -> dict[str, str]:
    """sha256 of every file under root, by relative path (to show a tree is byte-identical)."""
    return {
        str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(root.rglob("*"))
        if f.is_file()
    }


def assert_same_curve(got: dict[int, float], want: dict[int, float], steps=None) -> None:
    """Bitwise equal losses at every step (all of want's by default). On the CPU an untouched run
    and one killed, restarted and resumed take the same steps on the same state, so nothing but
    exact equality is right (issue 24); the message shows where and by how much they part."""
    steps = sorted(want) if steps is None else list(steps)
    differ = [(s, got.get(s), want[s]) for s in steps if got.get(s) != want[s]]
    if differ:
        worst = max((abs(g - w) for _, g, w in differ if g is not None), default=None)
        raise AssertionError(
            f"{len(differ)} of {len(steps)} steps differ; first: step {differ[0][0]} got {differ[0][1]!r} "
            f"want {differ[0][2]!r}; largest difference {worst}"
        )


def final_weights(run_dir: Path) -> set[str]:
    """The sha256 of the final weights each rank wrote (logs/weights-rank-N.sha256): one value
    when the ranks agree, and equal between two runs exactly when their weights are bitwise equal."""
    return {f.read_text().strip() for f in (run_dir / "logs").glob("weights-rank-*.sha256")}


def assert_same_weights(run_dir: Path, reference: Path) -> None:
    """Every rank of run_dir ended with the same weights, bitwise those of the reference run."""
    got, want = final_weights(run_dir), final_weights(reference)
    assert len(got) == 1 and got == want, (got, want)


def assert_pipeline_export(final: Path, pp: int) -> None:
    """A pipeline run's final model: one safetensors shard per stage, written by that stage, and
    the index that makes them one Hugging Face model (no rank gathered the whole model)."""
    import json

    index = json.loads((final / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == [f"model-{s:05d}-of-{pp:05d}.safetensors" for s in range(1, pp + 1)], shards
    assert all((final / s).is_file() for s in shards) and (final / "config.json").is_file()
    assert not (final / "model.safetensors").exists()


def in_memory_sets(cfg, tokenizer, seq_len: int):
    """(training, evaluation or None) examples of a run's TrainingConfig, tokenised in memory here,
    apart from the token cache the worker reads (launcher/train/token_cache.py)."""
    from launcher.train.data import read_records, split_eval, tokenize

    source = cfg.data or "the demo data set"
    records, held = read_records(cfg.data), None
    if cfg.eval_split:
        records, held = split_eval(records, cfg.eval_split, cfg.seed, source)
    elif cfg.eval_data is not None:
        held = read_records(cfg.eval_data)
    train = tokenize(records, tokenizer, seq_len, source, cfg.skip_bad_records)
    return train, None if held is None else tokenize(held, tokenizer, seq_len, "held", cfg.skip_bad_records)


def token_builds(run_dir: Path) -> list[str]:
    """The token cache's build log: one line per time the run's data was tokenised."""
    log = run_dir / "cache" / "builds.log"
    return log.read_text().splitlines() if log.exists() else []
