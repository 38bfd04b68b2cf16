"""Real 2-rank CPU runs (tiny Llama, DeepSpeed, torchrun) that must never harm what is not the job
nor lose a run: cancel ends every rank, a run whose ranks live cannot be launched twice, a copied
run directory trains itself and leaves the original byte-identical, a moved one launches, and a
run name in use is never written over."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest

from launcher.backends import local, procs
from launcher.cli import main
from launcher.spec import TrainSpec
from tests.runs import cpu_env, digests, make_run
from tests.test_train_faults import curve, events, started_steps, wait_done, wait_for

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

SPEC = TrainSpec(zero_stage=2, micro_batch=2, seq_len=64)


def rank_pids(run_dir) -> list[int]:
    return [int(f.read_text()) for f in sorted((run_dir / "logs" / "pids").glob("rank-*"))]


@pytest.fixture
def cpu(monkeypatch):
    for k, v in cpu_env().items():
        monkeypatch.setenv(k, v)


def test_cancel_leaves_no_rank_alive_and_a_live_run_cannot_launch_twice(tmp_path, cpu):
    run_dir, _ = make_run(tmp_path, "long", SPEC, max_steps=5000, save_every=1000, lr=1e-3)
    local.submit(run_dir)
    wait_for(lambda: started_steps(run_dir) >= 2, 240, "step 2")
    ranks = rank_pids(run_dir)
    assert len(ranks) == 2 and all(procs.running(p) for p in ranks)
    job = json.loads((run_dir / "job.json").read_text())
    # the supervisor dies (SIGKILL, an OOM killer): torchrun and the ranks, in sessions of their
    # own, train on. Status says so, and a second launch is refused instead of racing them.
    os.kill(job["pid"], signal.SIGKILL)
    wait_for(lambda: not procs.running(job["pid"]), 10, "the supervisor to die")
    st = local.status(run_dir)
    assert st["state"] == "RUNNING" and "the supervisor is gone" in st["reason"], st
    with pytest.raises(local.JobError, match="RUNNING"):
        local.submit(run_dir)
    assert main(["launch", str(run_dir), "--detach", "--skip-preflight"]) == 2
    assert all(procs.running(p) for p in ranks)  # refusing touched nothing
    # cancel with no grace: what SIGTERM does not end at once is SIGKILLed, ranks included,
    # and cancel checks that none is left
    st = local.cancel(run_dir, grace_s=0.0)
    assert st["state"] == "CANCELLED", st
    assert not [p for p in ranks if procs.running(p)]
    assert procs.tagged(job["token"]) == []


def test_a_copied_run_trains_itself_and_a_moved_one_launches(tmp_path, cpu, capsys):
    runs = tmp_path / "runs"
    a, _ = make_run(runs, "A", SPEC, max_steps=6, save_every=3, lr=1e-3)
    local.submit(a)
    assert wait_done(a)["state"] == "SUCCEEDED"
    before = digests(a)
    # cp -r runs/A runs/B, then plan B again with another learning rate and more steps
    b = runs / "B"
    shutil.copytree(a, b, symlinks=True)
    assert local.status(b)["state"] == "NOT_STARTED"  # A's job record is not B's job
    make_run(runs, "B", SPEC, max_steps=9, save_every=3, lr=5e-4, replan=True)
    local.submit(b)
    assert wait_done(b)["state"] == "SUCCEEDED", (b / "logs" / "launcher.log").read_text()[-2000:]
    assert digests(a) == before  # the original is byte-identical
    got = curve(b)
    assert sorted(got) == list(range(1, 10))
    ev = events(b)
    assert {"event": "resumed", "step": 6} in ev
    assert any(e["event"] == "lr_changed" and e["to"] == 5e-4 for e in ev)
    rows = [json.loads(x) for x in (b / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows if r.get("step", 0) > 6 and "lr" in r] == [5e-4] * 3
    assert curve(a) == {s: got[s] for s in range(1, 7)}
    # mv runs/B runs/C: it still launches (and trains its own directory)
    c = tmp_path / "elsewhere" / "C"
    c.parent.mkdir()
    os.rename(b, c)
    plan = json.loads((c / "plan.json").read_text())
    plan["training"]["max_steps"] = 10
    (c / "plan.json").write_text(json.dumps(plan))
    local.submit(c)
    assert wait_done(c)["state"] == "SUCCEEDED", (c / "logs" / "launcher.log").read_text()[-2000:]
    assert sorted(curve(c)) == list(range(1, 11))
    assert (c / "output" / "final.json").is_file()
    assert digests(a) == before
