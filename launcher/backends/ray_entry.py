"""The Ray Jobs entrypoint: `python -m launcher.backends.ray_entry`, run by Ray on the cluster in
the shipped copy of the run directory (the job's working_dir, see launcher/backends/ray.py).

It places the run directory on the storage every node sees (ray_job.json's train.storage / NAME),
copying the submitted inputs there, and trains it under Ray Train's TorchTrainer: one Ray Train
worker per rank, each running the worker torchrun runs (launcher.train.loop.train) inside the
process group Ray Train set up (gloo on CPU workers, nccl on GPU workers).

Checkpoints: the worker writes atomic DeepSpeed checkpoints to RUN_DIR/checkpoints. Each one is
reported to Ray Train as it is saved (a small pointer directory: step, path, loss), so Ray's
results and UI show them and keep as many as the run keeps. When a worker dies, FailureConfig
restarts the whole group, and the restarted worker resumes from the newest complete checkpoint on
the shared storage -- the one last reported.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from launcher.backends.ray import REQUEST_FILE
from launcher.rundir import read_run_dir

POINTER = "ftlaunch_checkpoint.json"


def stage(src: Path, run_dir: Path) -> None:
    """Copy the submitted run directory's files into the cluster's run directory (atomically each)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for sub in ("logs", "checkpoints", "output"):
        (run_dir / sub).mkdir(exist_ok=True)
    if src.resolve() == run_dir.resolve():
        return
    for path in src.iterdir():
        if path.is_file():
            tmp = run_dir / f".{path.name}.tmp"
            shutil.copy2(path, tmp)
            os.replace(tmp, run_dir / path.name)


def _last_loss(run_dir: Path) -> dict:
    path = run_dir / "logs" / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    losses = [r for r in rows if "loss" in r]
    return {"loss": losses[-1]["loss"]} if losses else {}


def _reporting(save, run_dir: Path):
    """checkpoint.save, then ray.train.report on every rank (a barrier); rank 0 attaches the pointer."""
    import ray.train

    def save_and_report(engine, root, step, *args, **kwargs):
        path = save(engine, root, step, *args, **kwargs)
        if ray.train.get_context().get_world_rank() != 0:
            ray.train.report({"step": step})
            return path
        metrics = {"step": step, **_last_loss(run_dir)}
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, POINTER).write_text(json.dumps({"step": step, "path": str(path), **metrics}))
            ray.train.report(
                metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp), checkpoint_dir_name=path.name
            )
        return path

    save_and_report.reports_to_ray = True
    return save_and_report


def _restored_step() -> int | None:
    """The step of the checkpoint Ray Train last saw reported (set when it restarted the group)."""
    import ray.train

    restored = ray.train.get_checkpoint()
    if restored is None:
        return None
    with restored.as_directory() as d:
        return json.loads(Path(d, POINTER).read_text())["step"]


def worker(config: dict) -> None:
    """One Ray Train worker = one rank: torchrun's environment from Ray Train's context, then the worker."""
    import ray.train

    from launcher.train import checkpoint, loop

    ctx = ray.train.get_context()
    os.environ.update(
        RANK=str(ctx.get_world_rank()),
        WORLD_SIZE=str(ctx.get_world_size()),
        LOCAL_RANK=str(ctx.get_local_rank()),
        LOCAL_WORLD_SIZE=str(ctx.get_local_world_size()),
        NODE_RANK=str(ctx.get_node_rank()),
    )
    run_dir = Path(config["run_dir"])
    step = _restored_step()
    if step is not None and ctx.get_world_rank() == 0:
        print(
            f"[ftlaunch] Ray Train restarted the workers; last reported checkpoint: step {step}", flush=True
        )
    if not getattr(checkpoint.save, "reports_to_ray", False):
        checkpoint.save = _reporting(checkpoint.save, run_dir)
    code = loop.train(run_dir)
    if code != 0:
        # 75: preempted after a checkpoint; failing the attempt lets FailureConfig resume it
        raise RuntimeError(f"rank {ctx.get_world_rank()}: the worker exited with code {code}")


def main() -> int:
    # keep a loopback head's 127.0.0.1 (cluster/ray_up.sh); harmless elsewhere
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    shipped = Path.cwd()
    train = json.loads((shipped / REQUEST_FILE).read_text())["train"]
    run = read_run_dir(shipped)
    run_dir = Path(train["storage"]) / run.name
    stage(shipped, run_dir)
    name = f"{run.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"  # unique per attempt
    print(
        f"[ftlaunch] training {run_dir} under Ray Train ({train['num_workers']} workers, {name})", flush=True
    )
    trainer = TorchTrainer(
        worker,
        train_loop_config={"run_dir": str(run_dir)},
        scaling_config=ScalingConfig(
            num_workers=train["num_workers"],
            use_gpu=train["use_gpu"],
            resources_per_worker=train["resources_per_worker"],
            placement_strategy=train["placement_strategy"],
        ),
        run_config=RunConfig(
            name=name,
            storage_path=str(run_dir / "ray"),
            failure_config=FailureConfig(max_failures=train["max_failures"]),
            checkpoint_config=CheckpointConfig(num_to_keep=run.training.keep_last),
        ),
    )
    try:
        result = trainer.fit()
    except Exception as exc:  # Ray Train's TrainingFailedError and worker errors: one line, job FAILED
        print(f"[ftlaunch] training failed: {' '.join(str(exc).split())[:2000]}", flush=True)
        return 1
    print(f"[ftlaunch] finished: {result.metrics}; last checkpoint {result.checkpoint}", flush=True)
    return 0


if __name__ == "__main__":
    # run the importable module rather than __main__, so Ray ships `worker` to the workers by reference
    from launcher.backends import ray_entry

    sys.exit(ray_entry.main())
