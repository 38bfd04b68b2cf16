"""A node's slurmd SIGKILLed while a 2-node job runs on the local Slurm cluster (cluster/slurm_up.sh;
helpers shared with tests/test_slurm_cluster.py): `ftlaunch status` (never hanging) names the node
while it does not answer; Slurm marks it DOWN after SlurmdTimeout (10 s on the test cluster), the
ranks left checkpoint and the job is requeued and resumes from that checkpoint once slurmd is back;
no checkpoint or step is lost."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launcher.backends import slurm, slurm_cluster
from launcher.train import checkpoint as ckpt
from tests.runs import cpu_env
from tests.test_slurm_cluster import (
    FTLAUNCH,
    STATE,
    TRAIN,
    curve,
    events,
    ft,
    job_id,
    metrics,
    wait_for,
    write_run,
)

pytestmark = [pytest.mark.slow, pytest.mark.cluster]
pytest.importorskip("deepspeed")


@pytest.fixture(scope="session")
def cluster(slurm_cluster):
    return slurm_cluster


def node_state(node: str) -> str:
    """sinfo's short state of one node: idle, alloc, mix, comp, down*, alloc* (* = not responding)."""
    proc = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%t"], capture_output=True, text=True)
    return (proc.stdout.split() or ["?"])[0]


def slurmd_pid(node: str) -> int | None:
    try:
        pid = int((STATE / f"slurmd-{node}.pid").read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def heal(node: str) -> None:
    """Start the node's slurmd again (as slurm_up.sh does) and wait until the node takes jobs
    (ReturnToService=2 brings it back when slurmd registers; resume it by hand otherwise)."""
    if slurmd_pid(node) is None:
        subprocess.run(["slurmd", "-N", node], check=True, timeout=60)
    for i in range(120):
        state = node_state(node)
        if state.rstrip("*~#!%$@^-") in ("idle", "mix", "alloc", "comp") and not state.endswith("*"):
            return
        if i == 40:
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
        time.sleep(0.5)
    raise AssertionError(f"{node} did not return to service: {node_state(node)}")


def cli_status(run_dir: Path) -> str:
    """`ftlaunch status RUN` as a user runs it; it must answer within seconds, node down or not."""
    proc = subprocess.run(
        [*FTLAUNCH, "status", str(run_dir)], env=cpu_env(), capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0 and proc.stdout.startswith(f"{run_dir.name}: "), proc.stdout + proc.stderr
    return proc.stdout.strip()


def test_slurmd_killed_on_a_node_the_job_requeues_and_resumes_from_its_last_checkpoint(
    cluster, tmp_path, capsys, cpu
):
    """SIGKILL one node's slurmd mid-job (the node stops answering Slurm; its ranks, under their own
    slurmstepd, run on). Slurm marks the node DOWN after SlurmdTimeout and requeues the job: the
    ranks left get SIGTERM and checkpoint, the job comes back once slurmd does and resumes there."""
    argv = [*TRAIN, "--gpus", "2x1xA100", "--max-steps", "5000", "--save-every", "5"]
    run_dir = write_run(tmp_path, "nodefail", argv, capsys)
    assert ft("launch", str(run_dir), "--detach", "--skip-preflight", capsys=capsys) == 0
    job = job_id(run_dir)
    victim, seen = None, []
    try:
        wait_for(lambda: ckpt.latest(run_dir / "checkpoints"), 300, "the first checkpoint", run_dir)
        info = slurm_cluster.fields(
            subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True).stdout
        )
        nodes = subprocess.run(
            ["scontrol", "show", "hostnames", info["NodeList"]], capture_output=True, text=True
        ).stdout.split()
        victim = next(n for n in nodes if n != info["BatchHost"])  # not the node running the batch script
        before = ckpt.latest(run_dir / "checkpoints")[0]
        os.kill(slurmd_pid(victim), signal.SIGKILL)

        def requeued():
            line = cli_status(run_dir)
            state, reason = line.split()[1], line.partition("  reason=")[2]
            shown = (state, re.sub(r"step \d+", "step N", reason))  # not each newer checkpoint
            if not seen or seen[-1][0] != shown:
                seen.append((shown, reason))
            if node_state(victim).startswith("down") and slurmd_pid(victim) is None:
                subprocess.run(["slurmd", "-N", victim], check=True, timeout=60)  # the node comes back
            return state == "REQUEUED"

        wait_for(requeued, 120, "the requeue after the node failure", run_dir)
        heal(victim)
        wait_for(lambda: events(run_dir, "resumed"), 300, "the resumed job", run_dir)
        resumed = events(run_dir, "resumed")[0]
        wait_for(lambda: max(curve(run_dir)) >= resumed + 2, 120, "steps after the resume", run_dir)
        assert ft("cancel", str(run_dir)) == 0
        assert capsys.readouterr().out.strip() == "nodefail: CANCELLED"
    finally:
        subprocess.run(["scancel", job], check=False)
        if victim:
            heal(victim)
        wait_for(
            lambda: not subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip(),
            120,
            "an empty queue",
        )
    with capsys.disabled():
        print(f"\n`ftlaunch status` after {victim}'s slurmd was killed:")
        print("".join(f"  {state}  {reason}\n" for (state, _), reason in seen))
    # a clear state at every moment: running (naming the node once it stopped answering), requeued
    assert {state for (state, _), _ in seen} == {"RUNNING", "REQUEUED"}, seen
    named = [reason for _, reason in seen if f"node down or not responding: {victim} (" in reason]
    assert named and "Slurm requeues the job, which resumes from checkpoint step" in named[0], seen
    st = slurm.status(run_dir)
    assert st["state"] == "CANCELLED" and st["restarts"] == 1, st
    # the ranks left checkpointed when Slurm ended the job; the job resumed from that checkpoint
    stopped = events(run_dir, "preempted")
    assert stopped[0] == resumed >= before, (stopped, resumed, before)
    steps = [r["step"] for r in metrics(run_dir) if "loss" in r]
    assert sorted(set(steps)) == list(range(1, max(steps) + 1))  # none lost
    # the newest checkpoint is complete and every file of it loads
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    step, path = ckpt.latest(run_dir / "checkpoints")
    assert step == stopped[-1]
    assert json.loads((path / ckpt.LAYOUT).read_text())["world"] == 2
    assert sorted(p.name for p in path.glob("rank-*.pt")) == ["rank-00000.pt", "rank-00001.pt"]
    import torch

    for f in path.glob("*.pt"):
        torch.load(f, map_location="cpu", weights_only=False)
    assert ft("logs", str(run_dir)) == 0
    assert "DUE TO NODE FAILURE" in capsys.readouterr().out
