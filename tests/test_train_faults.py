"""Faults on the CPU: a rank SIGKILLed mid-run, a rank SIGKILLed during a checkpoint save, a
cancel mid-run. No step is lost or repeated and the last complete checkpoint always loads."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from launcher.backends import local
from launcher.spec import TrainSpec
from tests.runs import cpu_env, make_run, run_torchrun

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

SPEC = TrainSpec(zero_stage=2, micro_batch=2, seq_len=64)


def curve(run_dir) -> dict[int, float]:
    """Loss per step; a step re-run after a restart keeps its last value."""
    out = {}
    for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "loss" in row:
            out[row["step"]] = row["loss"]
    return out


def events(run_dir) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "event" in r]


def wait_for(pred, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def started_steps(run_dir) -> int:
    path = run_dir / "logs" / "metrics.jsonl"
    return max(curve(run_dir), default=0) if path.exists() else 0


def submit_with_cpu_env(run_dir, monkeypatch):
    for k, v in cpu_env().items():
        monkeypatch.setenv(k, v)
    local.submit(run_dir)


def wait_done(run_dir, timeout=300):
    wait_for(lambda: local.status(run_dir)["state"] != "RUNNING", timeout, "the job to end")
    return local.status(run_dir)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("ref")
    run_dir, argv = make_run(root, "ref", SPEC, max_steps=24, save_every=4, lr=1e-3)
    proc = run_torchrun(argv)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return curve(run_dir)


def test_sigkill_of_a_rank_restarts_and_resumes_with_the_same_curve(tmp_path, monkeypatch, reference):
    run_dir, _ = make_run(tmp_path, "killed", SPEC, max_restarts=1, max_steps=24, save_every=4, lr=1e-3)
    submit_with_cpu_env(run_dir, monkeypatch)
    wait_for(lambda: started_steps(run_dir) >= 10, 240, "step 10")
    pid = int((run_dir / "logs" / "pids" / "rank-1").read_text())
    os.kill(pid, signal.SIGKILL)
    st = wait_done(run_dir)
    assert st["state"] == "SUCCEEDED", (run_dir / "logs" / "launcher.log").read_text()[-3000:]
    resumed = [e for e in events(run_dir) if e["event"] == "resumed"]
    assert resumed and resumed[0]["step"] in (8, 12)
    got = curve(run_dir)
    assert sorted(got) == list(range(1, 25))  # every step, none lost
    for step, loss in reference.items():
        assert got[step] == pytest.approx(loss, abs=1e-4), step


def test_sigkill_during_a_checkpoint_save_leaves_the_previous_one_loadable(tmp_path, monkeypatch):
    run_dir, _ = make_run(tmp_path, "savekill", SPEC, max_restarts=1, max_steps=16, save_every=4, lr=1e-3)
    submit_with_cpu_env(run_dir, monkeypatch)
    ckpts = run_dir / "checkpoints"
    # the first save is at step 4; kill rank 0 the moment a temporary save directory appears
    wait_for(
        lambda: (
            started_steps(run_dir) >= 5
            or any(p.name.startswith(".tmp-step-00000008") for p in ckpts.iterdir())
        ),
        240,
        "the second save",
    )
    pid = int((run_dir / "logs" / "pids" / "rank-0").read_text())
    os.kill(pid, signal.SIGKILL)
    st = wait_done(run_dir)
    # the restarted group resumed from a complete checkpoint and finished
    assert st["state"] == "SUCCEEDED", (run_dir / "logs" / "launcher.log").read_text()[-3000:]
    assert any(e["event"] == "resumed" for e in events(run_dir))
    assert sorted(curve(run_dir)) == list(range(1, 17))
    assert not [p for p in ckpts.iterdir() if p.name.startswith(".tmp-")]


def test_cancel_mid_run_checkpoints_first(tmp_path, monkeypatch):
    run_dir, _ = make_run(tmp_path, "cancelled", SPEC, max_steps=2000, save_every=1000, lr=1e-3)
    submit_with_cpu_env(run_dir, monkeypatch)
    wait_for(lambda: started_steps(run_dir) >= 3, 240, "step 3")
    st = local.cancel(run_dir, grace_s=120)
    assert st["state"] == "CANCELLED"
    ev = events(run_dir)
    assert any(e["event"] == "preempted" for e in ev)
    saved = [e["step"] for e in ev if e["event"] == "checkpoint"]
    assert saved and (run_dir / "checkpoints" / f"step-{saved[-1]:08d}").is_dir()
