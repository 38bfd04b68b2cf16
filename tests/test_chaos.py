"""Chaos on the CPU: the launcher killed while its job runs, and a disk that fills up during a
checkpoint. Each ends with no lost checkpoint and a clear status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from launcher.backends import local
from launcher.spec import TrainSpec
from tests.runs import ROOT, cpu_env, make_run
from tests.test_train_faults import curve, started_steps, wait_done, wait_for

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

SPEC = TrainSpec(zero_stage=2, micro_batch=2, seq_len=64)


def test_killing_the_launcher_leaves_the_job_running(tmp_path):
    """SIGKILL `ftlaunch launch` (which follows the log) mid-run: the job goes on, status finds it."""
    run_dir, _ = make_run(tmp_path, "orphan", SPEC, max_steps=20, save_every=5, lr=1e-3)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "launcher.cli", "launch", str(run_dir)],
        env=cpu_env(),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: started_steps(run_dir) >= 3, 240, "step 3")
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    assert local.status(run_dir)["state"] == "RUNNING"
    st = wait_done(run_dir)
    assert st["state"] == "SUCCEEDED"
    assert sorted(curve(run_dir)) == list(range(1, 21))


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_during_a_checkpoint(small_disk, monkeypatch):
    run_dir, _ = make_run(small_disk, "full", SPEC, max_steps=40, save_every=4, lr=1e-3)
    for k, v in cpu_env().items():
        monkeypatch.setenv(k, v)
    local.submit(run_dir)
    wait_for(lambda: (run_dir / "checkpoints" / "step-00000004").is_dir(), 240, "the first checkpoint")
    filler = small_disk / "filler"
    with open(filler, "wb", buffering=0) as f:  # take every free byte
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
    st = wait_done(run_dir)
    # the log cannot grow on a full disk; the status says what happened
    assert st["state"] == "FAILED", st
    assert "disk full" in st.get("reason", ""), st
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-"))
    assert kept, "the previous checkpoint must survive"
    # free the space and launch again: it resumes from that checkpoint and finishes
    filler.unlink()
    local.submit(run_dir)
    assert wait_done(run_dir)["state"] == "SUCCEEDED"
    assert sorted(curve(run_dir)) == list(range(1, 41))
