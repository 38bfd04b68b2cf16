"""The Ray Jobs entrypoint: `python -m launcher.backends.ray_entry`, run by Ray on the cluster in
the shipped copy of the run directory (the job's working_dir, see launcher/backends/ray.py).

It places the run directory on the storage every node sees (STORAGE/NAME, STORAGE from
ray_job.json's ftlaunch_train metadata, copying the submitted inputs there) and trains it under Ray Train's TorchTrainer, one Ray Train
worker per rank. Each Ray Train worker starts the rank exactly as torchrun does: the same worker
(`python -m launcher.train RUN_DIR`, here through `ray_entry --rank`) as a child process, with
RANK / WORLD_SIZE / LOCAL_RANK from Ray Train's context and a rendezvous address that rank 0
broadcasts. A child process rather than a call: Ray Train runs the training function in a
thread, where the worker could not install its SIGTERM handler (checkpoint, then exit), and a
process of its own keeps a failed rank's memory and CUDA state out of the Ray worker. The child
dies with its Ray worker (PR_SET_PDEATHSIG).

Checkpoints: the worker writes atomic checkpoints to RUN_DIR/checkpoints and logs each one in
logs/metrics.jsonl. Every Ray Train worker reports each of them, in that order, to Ray Train
(rank 0 with a small pointer checkpoint: step, path, loss), so Ray's results and UI show them.
When a rank dies, FailureConfig restarts the whole group, and the restarted ranks resume from the
newest complete checkpoint on the shared storage -- the one last reported.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import launcher
from launcher import program
from launcher.backends import rank_exit
from launcher.backends.ray_request import REQUEST_FILE, train_settings
from launcher.rundir import read_run_dir

POINTER = "ftlaunch_checkpoint.json"
POLL_S = 1.0  # how often a Ray Train worker looks for new checkpoints


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


class _CheckpointLog:
    """The checkpoints the worker logs in logs/metrics.jsonl (and each step's loss), read as it grows."""

    def __init__(self, run_dir: Path, offset: int):
        self.path = run_dir / "logs" / "metrics.jsonl"
        self.offset = offset
        self.loss: dict[int, float] = {}

    @staticmethod
    def end(run_dir: Path) -> int:
        path = run_dir / "logs" / "metrics.jsonl"
        return path.stat().st_size if path.is_file() else 0

    def new_steps(self) -> list[int]:
        """Steps checkpointed since the last call (only whole lines: the worker may be writing one)."""
        if not self.path.is_file():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        chunk = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(chunk)
        steps = []
        for row in map(json.loads, chunk.splitlines()):
            if "loss" in row:
                self.loss[row["step"]] = row["loss"]
            if row.get("event") == "checkpoint":
                steps.append(row["step"])
        return steps


def _report(run_dir: Path, step: int, rank: int, loss: float | None) -> None:
    """One checkpoint to Ray Train: every rank calls it (a barrier); rank 0 attaches the pointer."""
    import ray.train

    if rank != 0:
        ray.train.report({"step": step})
        return
    metrics = {"step": step, **({"loss": loss} if loss is not None else {})}
    path = run_dir / "checkpoints" / f"step-{step:08d}"
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, POINTER).write_text(json.dumps({**metrics, "path": str(path)}))
        ray.train.report(
            metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp), checkpoint_dir_name=path.name
        )


def _restored_step() -> int | None:
    """The step of the checkpoint Ray Train last saw reported (set when it restarted the group)."""
    import ray.train

    restored = ray.train.get_checkpoint()
    if restored is None:
        return None
    with restored.as_directory() as d:
        return json.loads(Path(d, POINTER).read_text())["step"]


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def worker(config: dict) -> None:
    """One Ray Train worker = one rank: start it, report its checkpoints, fail when it fails."""
    import ray.train
    from ray.train.collective import barrier, broadcast_from_rank_zero
    from ray.util import get_node_ip_address

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    run_dir = Path(config["run_dir"])
    shared = None
    if rank == 0:
        host = get_node_ip_address()
        # the log's end now: what the ranks started below log after it is theirs to report
        shared = {"addr": host, "port": _free_port(host), "log_offset": _CheckpointLog.end(run_dir)}
        step = _restored_step()
        if step is not None:
            print(
                f"[ftlaunch] Ray Train restarted the ranks (last checkpoint reported: step {step}); they "
                "resume from the newest complete checkpoint in the run directory",
                flush=True,
            )
    shared = broadcast_from_rank_zero(shared)
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(ctx.get_world_size()),
        LOCAL_RANK=str(ctx.get_local_rank()),
        LOCAL_WORLD_SIZE=str(ctx.get_local_world_size()),
        NODE_RANK=str(ctx.get_node_rank()),
        MASTER_ADDR=shared["addr"],
        MASTER_PORT=str(shared["port"]),
        PYTHONPATH=os.pathsep.join(
            p for p in (str(Path(launcher.__file__).parent.parent), env.get("PYTHONPATH")) if p
        ),
    )
    argv, cwd = [sys.executable, "-m", "launcher.backends.ray_entry", "--rank", str(run_dir)], None
    if config.get("program"):  # the user's program, from the shipped copy of where it was planned
        cwd = shipped_dir(config["program_dir"])
        env.update(program.env(run_dir))
        argv = [sys.executable, "-m", "launcher.backends.ray_entry", "--exec", *config["program"]]
    proc = subprocess.Popen(argv, env=env, cwd=cwd)
    saved = _CheckpointLog(run_dir, shared["log_offset"])
    while (code := proc.poll()) is None:
        for step in saved.new_steps():
            _report(run_dir, step, rank, saved.loss.get(step))
        time.sleep(POLL_S)
    if code != 0:
        # 75: preempted after a checkpoint; failing the attempt lets FailureConfig resume it (2, a
        # start-up error: the restarted ranks exit 2 at once, rank_exit.py)
        raise RuntimeError(f"rank {rank}: {'the program' if config.get('program') else 'the worker'} exited with code {code}")
    barrier()  # every rank has ended: the log is final, so every rank reports the same checkpoints
    for step in saved.new_steps():
        _report(run_dir, step, rank, saved.loss.get(step))


def _die_with_parent() -> bool:
    """The child dies with the Ray worker that started it (False: that worker is already gone)."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG, kept across exec
    return os.getppid() == parent


def rank_main(run_dir: str) -> int:
    """The child: die with the Ray worker that started it, then run the worker as torchrun would."""
    if not _die_with_parent():
        return 1
    from launcher.backends import rank_exit
    from launcher.train.loop import main as train_main

    code = train_main([run_dir])
    if code == rank_exit.PREEMPTED:  # not 2: the worker also exits 2 when a peer died, which a restart retries
        rank_exit.end(run_dir, code)
    return code


def exec_program(words: list[str]) -> int:
    """The child for a user's program: `python WORDS` in place of this process (program.words: under
    rank_exit), dying with its Ray worker."""
    if not _die_with_parent():
        return 1
    os.execv(sys.executable, [sys.executable, *words])


def shipped_dir(name: str) -> str:
    """Where Ray unpacked the py_modules directory called `name` on this node (on the path Ray sets)."""
    for entry in sys.path + os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and (Path(entry) / name).is_dir() and Path(entry).name.startswith("_ray_pkg_"):
            return str(Path(entry) / name)
    raise RuntimeError(f"the shipped directory {name!r} is not on this Ray worker's path ({sys.path})")


def program_words(run, run_dir: Path) -> list[str]:
    """The user's program's command for the cluster's run directory: placeholders expanded there, the
    script relative to the shipped directory the ranks start in."""
    from launcher.spec import TrainSpec

    entry = run.program
    if entry.script is not None:
        entry = entry.model_copy(update={"script": os.path.relpath(entry.script, entry.workdir)})
    ds = json.loads((run_dir / "ds_config.json").read_text())
    return program.words(entry, program.values(run_dir, TrainSpec(**run.spec), ds, run.training))


def main() -> int:
    # keep a loopback head's 127.0.0.1 (cluster/ray_up.sh); harmless elsewhere
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    shipped = Path.cwd()
    train = train_settings(json.loads((shipped / REQUEST_FILE).read_text()))
    run = read_run_dir(shipped)
    run_dir = Path(train["storage"]) / run.name
    stage(shipped, run_dir)
    rank_exit.clear(run_dir)  # what ranks of an earlier submission left
    config = {"run_dir": str(run_dir)}
    if run.program is not None:
        config.update(program=program_words(run, run_dir), program_dir=Path(run.program.workdir).name)
    name = f"{run.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"  # unique per submission
    print(
        f"[ftlaunch] training {run_dir} under Ray Train ({train['num_workers']} workers, {name})", flush=True
    )
    trainer = TorchTrainer(
        worker,
        train_loop_config=config,
        # the Ray workers' own process group only coordinates; the ranks make theirs (nccl on GPUs)
        torch_config=TorchConfig(backend="gloo"),
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

    if sys.argv[1:2] == ["--rank"]:
        from launcher.train.loop import exit_process

        exit_process(ray_entry.rank_main(sys.argv[2]))
    if sys.argv[1:2] == ["--exec"]:
        sys.exit(ray_entry.exec_program(sys.argv[2:]))
    sys.exit(ray_entry.main())
