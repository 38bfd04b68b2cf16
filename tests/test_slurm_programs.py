"""The user's own program (`--script` / `--module`) as a Slurm job on the local cluster
(cluster/slurm_up.sh: two nodes):

- on 2 nodes it COMPLETES, under torchrun (a plain DDP script) and under `--launcher accelerate`
  (an Accelerator() script whose DeepSpeed engine runs the plan; each node gives accelerate its own
  machine rank and the head's address);
- the time-limit signal reaches the script's ranks; a script that checkpoints and exits 75 (on the
  signal, or of its own accord) makes the job requeue, and the requeued job finishes from there;
- a script that raises ends FAILED with its traceback in `ftlaunch logs`.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from launcher.backends import slurm
from launcher.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

SCRIPTS = Path(__file__).parent / "user_scripts"
PLAN = ["--model", "tiny-llama", "--cpu", "--init", "random", "--max-restarts", "0", "--backend", "slurm"]


@pytest.fixture
def planned_in_scripts(slurm_cluster, cpu, monkeypatch):
    monkeypatch.chdir(SCRIPTS)


def launch(tmp_path, name: str, argv: list[str], capsys) -> Path:
    """Write the run and submit it detached; the run directory."""
    cut = argv.index("--")
    assert main([*PLAN, *argv[:cut], "--dry-run", "--name", name, "--runs-dir", str(tmp_path), *argv[cut:]]) == 0
    run_dir = tmp_path / name
    assert main(["launch", str(run_dir), "--detach", "--skip-preflight"]) == 0
    capsys.readouterr()
    return run_dir


def wait_end(run_dir: Path, timeout: float = 600) -> tuple[dict, str]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = slurm.status(run_dir)
        if st["state"] in ("COMPLETED", "FAILED", "CANCELLED", "PREEMPTED", "TIMEOUT"):
            break
        time.sleep(0.5)
    job = json.loads((run_dir / "job.json").read_text())["job_id"]
    path = slurm.log_path(run_dir, job)
    return st, path.read_text() if path.exists() else ""


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_a_script_on_two_nodes_completes(launcher, tmp_path, capsys, planned_in_scripts):
    if launcher == "torchrun":
        argv = ["--gpus", "2x2xA100", "--script", "ddp.py", "--", "{output_dir}", "3"]
    else:
        argv = ["--gpus", "2x2xA100", "--zero-stage", "2", "--micro-batch", "2", "--grad-accum", "1"]
        argv += ["--launcher", "accelerate", "--script", "accelerate_ds.py", "--", "{output_dir}"]
    run_dir = launch(tmp_path, launcher, argv, capsys)
    st, log = wait_end(run_dir)
    assert st["state"] == "COMPLETED", log[-4000:]
    out = run_dir / "output"
    if launcher == "torchrun":
        reports = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(4)]
        assert {r["world"] for r in reports} == {4} and {r["cwd"] for r in reports} == {str(SCRIPTS)}
    else:
        reports = [json.loads((out / f"engine-{r}.json").read_text()) for r in range(4)]
        assert {(r["world"], r["dp"], r["stage"], r["micro_batch"]) for r in reports} == {(4, 4, 2, 2)}
        assert sorted(r["machine_rank"] for r in reports) == ["0", "0", "1", "1"]  # a node rank each


@pytest.mark.parametrize("mode", ["signal", "self"])
def test_a_script_that_exits_75_is_requeued_and_finishes(mode, tmp_path, capsys, planned_in_scripts):
    argv = ["--gpus", "2x1xA100", "--script", "preemptible.py", "--", "{output_dir}", mode]
    run_dir = launch(tmp_path, mode, argv, capsys)
    out = run_dir / "output"
    if mode == "signal":
        deadline = time.time() + 300
        while len(list(out.glob("started-*"))) < 2 and time.time() < deadline:
            time.sleep(0.3)
        job = json.loads((run_dir / "job.json").read_text())["job_id"]
        # what `--signal=B:USR1@N` does N seconds before the time limit
        subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    st, log = wait_end(run_dir)
    assert st["state"] == "COMPLETED", log[-4000:]
    assert st["restarts"] == 1 and "checkpointed and requeued (requeue 1 of at most 3)" in log
    assert {p.read_text() for p in out.glob("checkpoint-*")} == {mode}  # the signal reached both ranks
    assert {p.read_text() for p in out.glob("resumed-*")} == {"1"}


def test_a_script_that_raises_ends_failed_with_its_traceback(tmp_path, capsys, planned_in_scripts):
    run_dir = launch(tmp_path, "fails", ["--gpus", "1x1xA100", "--module", "userpkg.fail", "--"], capsys)
    st, _ = wait_end(run_dir)
    assert st["state"] == "FAILED" and st["exit_code"] != 0
    assert main(["logs", str(run_dir)]) == 0
    log = capsys.readouterr().out
    assert "Traceback" in log and "RuntimeError: the user's training step failed: loss is nan" in log
    assert "[ftlaunch] the job failed" in log
