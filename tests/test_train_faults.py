"""Faults on the CPU: a rank SIGKILLed mid-run, a rank SIGKILLed during a checkpoint save, a
cancel mid-run. No step is lost or repeated and the last complete checkpoint always loads."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from launcher.backends import local
from launcher.models.catalog import CATALOG
from launcher.spec import TrainSpec
from tests.runs import (
    assert_same_curve,
    assert_same_weights,
    cpu_env,
    digests,
    events,
    make_run,
    run_torchrun,
)

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
    return run_dir


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
    # bitwise: the steps before the kill (untouched vs untouched) and after the resume, and the
    # final weights
    assert_same_curve(got, curve(reference))
    assert_same_weights(run_dir, reference)


# tiny-llama's save lasts ~10-25 ms here, too short to land a kill inside it every time; this
# wider, deeper Llama (4.2M parameters, ~57 MB per checkpoint with the optimizer states) keeps a
# save's temporary directory in place for ~100 ms, against a 2 ms poll, and trains 16 steps in
# about the same time.
SAVE_KILL_MODEL = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4}


def proc_state(pid: int) -> str:
    """R, S, T (stopped), Z (exited, not yet reaped)...; "gone" once reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0]
    except FileNotFoundError:
        return "gone"


# the data-parallel engine's checkpoint (ZeRO-2) and the pipeline engine's (2 stages, ZeRO-1:
# per-layer files of each stage plus each rank's optimizer partition)
SAVE_KILL_LAYOUTS = {"zero2": SPEC, "pp2": TrainSpec(pp=2, zero_stage=1, micro_batch=2, grad_accum=2, seq_len=64)}


@pytest.mark.parametrize("layout", list(SAVE_KILL_LAYOUTS))
def test_sigkill_during_a_checkpoint_save_leaves_the_previous_one_loadable(tmp_path, monkeypatch, layout):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**CATALOG["tiny-llama"], **SAVE_KILL_MODEL}))
    # keep_last 4: no checkpoint is rotated away, so step 4 can be compared after the resume
    run_dir, _ = make_run(
        tmp_path,
        "savekill",
        SAVE_KILL_LAYOUTS[layout],
        model=str(config),
        max_restarts=1,
        max_steps=8,
        save_every=4,
        keep_last=4,
        lr=1e-3,
    )
    submit_with_cpu_env(run_dir, monkeypatch)
    ckpts = run_dir / "checkpoints"
    prev, tmp, final = ckpts / "step-00000004", ckpts / ".tmp-step-00000008", ckpts / "step-00000008"
    wait_for(prev.is_dir, 240, "the step-4 checkpoint")
    pid = int((run_dir / "logs" / "pids" / "rank-0").read_text())
    # rank 0 (local rank 0, the only rank that renames) is stopped the moment the step-8 save's
    # temporary directory appears, long before its rename; frozen, it can change nothing, so what
    # is on disk then is what the SIGKILL that follows leaves. (Record it before the kill: once
    # rank 0 is dead, rank 1's barrier fails and its failure handling removes the temp directory.)
    deadline = time.time() + 120
    while not tmp.is_dir():
        assert time.time() < deadline, "timed out waiting for the step-8 save to begin"
        time.sleep(0.002)
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: proc_state(pid) == "T", 10, "rank 0 to stop")
    at_kill = {"tmp": tmp.is_dir(), "final": final.exists(), "tmp_files": sorted(os.listdir(tmp))}
    os.kill(pid, signal.SIGKILL)
    assert at_kill["tmp"] and not at_kill["final"], at_kill  # the kill landed inside the save
    wait_for(lambda: proc_state(pid) in ("Z", "gone"), 10, "rank 0 to die")
    assert not final.exists()  # the unfinished save was never renamed into place
    before = digests(prev)
    assert any(name.startswith("rank-") for name in before)  # a complete checkpoint

    st = wait_done(run_dir)
    assert st["state"] == "SUCCEEDED", (run_dir / "logs" / "launcher.log").read_text()[-3000:]
    rows = [json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    # one resume, from step 4: the unfinished step-8 save was not taken as a checkpoint
    resumed = [i for i, r in enumerate(rows) if r.get("event") == "resumed"]
    assert [rows[i]["step"] for i in resumed] == [4]
    first, second = rows[: resumed[0]], rows[resumed[0] + 1 :]
    assert [r["step"] for r in first if "loss" in r] == list(range(1, 9))  # killed in step 8's save
    assert [r["step"] for r in first if r.get("event") == "checkpoint"] == [4]
    # no step lost or repeated: the resumed attempt ran steps 5..8 again, with the same loss as
    # before the kill
    assert [r["step"] for r in second if "loss" in r] == list(range(5, 9))
    assert [r["step"] for r in second if r.get("event") == "checkpoint"] == [8]
    again = {r["step"]: r["loss"] for r in second if "loss" in r}
    before_kill = {r["step"]: r["loss"] for r in first if "loss" in r}
    assert_same_curve(again, before_kill, steps=range(5, 9))  # bitwise
    # the previous checkpoint is intact, the temporary one is gone, every save completed
    assert digests(prev) == before
    assert not [p for p in ckpts.iterdir() if p.name.startswith(".tmp-")]
    assert [p.name for p in sorted(ckpts.glob("step-*"))] == [f"step-{s:08d}" for s in (4, 8)]


def test_cancel_mid_run_checkpoints_first(tmp_path, monkeypatch, capsys):
    run_dir, _ = make_run(tmp_path, "cancelled", SPEC, max_steps=2000, save_every=1000, lr=1e-3)
    submit_with_cpu_env(run_dir, monkeypatch)
    wait_for(lambda: started_steps(run_dir) >= 3, 240, "step 3")
    # while it runs, `ftlaunch status` says how far: step N of M, the last loss, the time left
    from launcher.cli import main

    assert main(["status", str(run_dir)]) == 0
    line = capsys.readouterr().out.strip()
    assert re.fullmatch(r"cancelled: RUNNING  step=\d+/2000  loss=[0-9.]+  eta=(\d+h\d\dm|\d+m\d\ds)  pid=\d+", line), line
    assert main(["status", str(run_dir), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["max_steps"] == 2000 and st["eta_s"] > 0 and st["loss"] > 0
    st = local.cancel(run_dir, grace_s=120)
    assert st["state"] == "CANCELLED"
    ev = events(run_dir)
    assert any(e["event"] == "preempted" for e in ev)
    saved = [e["step"] for e in ev if e["event"] == "checkpoint"]
    assert saved and (run_dir / "checkpoints" / f"step-{saved[-1]:08d}").is_dir()


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, reference):
    """One file of the newest checkpoint deleted: preflight names it, the resume skips it for the
    previous complete checkpoint (saying which and why), and the curve from there is the
    untouched run's."""
    from launcher.preflight import check_run_dir

    run_dir, argv = make_run(tmp_path, "damaged", SPEC, max_steps=8, save_every=4, keep_last=3, lr=1e-3)
    assert run_torchrun(argv).returncode == 0
    newest = run_dir / "checkpoints" / "step-00000008"
    victim = next(f for f in sorted(newest.rglob("*.pt")) if "optim" in f.name)
    victim.unlink()
    run_dir, argv = make_run(
        tmp_path, "damaged", SPEC, max_steps=12, save_every=4, keep_last=3, lr=1e-3, replan=True
    )
    notes = check_run_dir(run_dir)
    assert any("checkpoint step 8 is damaged" in n and victim.name in n and "resumes from step 4" in n for n in notes)
    proc = run_torchrun(argv)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ev = events(run_dir)
    skipped = [e for e in ev if e["event"] == "checkpoint_skipped"]
    assert [e["step"] for e in skipped] == [8] and victim.name in skipped[0]["reason"]
    assert [e["step"] for e in ev if e["event"] == "resumed"] == [4]
    got = curve(run_dir)
    assert sorted(got) == list(range(1, 13))
    # steps 5..8 trained again, from step 4's state: bitwise as if never damaged
    assert_same_curve(got, curve(reference), steps=range(5, 13))
    assert (run_dir / "checkpoints" / "step-00000008" / "manifest.json").is_file()  # saved again, whole
