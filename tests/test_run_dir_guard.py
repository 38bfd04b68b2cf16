"""The run directory is never damaged by a careless command: a used name is not written over,
--replan only plans the same model again while nothing runs, run files that are FIFOs or garbage
never hang or crash a watcher, ds_config.json edited away from plan.json is caught before a rank
starts, and numeric flags out of range are one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from launcher.backends import local, procs
from launcher.cli import main
from tests.runs import ROOT, cpu_env, digests

TINY = ["--model", "tiny-llama", "--gpus", "1x2xA100", "--cpu", "--init", "random"]


def dry(tmp_path, capsys, *extra, name="r") -> int:
    code = main([*TINY, "--dry-run", "--name", name, "--runs-dir", str(tmp_path), *extra])
    capsys.readouterr()
    return code


def error(argv, capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("ftlaunch: error:"), err
    return err[0]


def test_a_used_run_name_is_never_written_over(tmp_path, capsys):
    assert dry(tmp_path, capsys) == 0
    run_dir = tmp_path / "r"
    (run_dir / "checkpoints" / "step-00000004").mkdir()
    (run_dir / "logs" / "metrics.jsonl").write_text('{"step": 4, "loss": 1.0}\n')
    before = digests(run_dir)
    msg = error([*TINY, "--dry-run", "--name", "r", "--runs-dir", str(tmp_path), "--lr", "1e-3"], capsys)
    assert "already exists" in msg and "step-00000004" in msg and "--replan" in msg
    assert digests(run_dir) == before
    # the launch command too (plan, write, start): nothing written, nothing started
    msg = error([*TINY, "--detach", "--name", "r", "--runs-dir", str(tmp_path)], capsys)
    assert "already exists" in msg and not (run_dir / "job.json").exists()
    assert digests(run_dir) == before


def test_replan_keeps_the_checkpoints_and_refuses_another_model(tmp_path, capsys):
    assert dry(tmp_path, capsys) == 0
    run_dir = tmp_path / "r"
    (run_dir / "checkpoints" / "step-00000004").mkdir()
    assert dry(tmp_path, capsys, "--replan", "--lr", "1e-3") == 0
    assert json.loads((run_dir / "plan.json").read_text())["training"]["lr"] == 1e-3
    assert (run_dir / "checkpoints" / "step-00000004").is_dir()
    before = digests(run_dir)
    other = ["--model", "tiny-bloom", "--gpus", "1x2xA100", "--cpu", "--init", "random"]
    msg = error([*other, "--dry-run", "--name", "r", "--runs-dir", str(tmp_path), "--replan"], capsys)
    assert "holds a run of tiny-llama" in msg
    msg = error([*TINY, "--dry-run", "--name", "r", "--runs-dir", str(tmp_path), "--replan", "--method", "lora"], capsys)
    assert "holds a full run" in msg
    msg = error([*TINY, "--dry-run", "--name", "nothing", "--runs-dir", str(tmp_path), "--replan"], capsys)
    assert "there is no run 'nothing'" in msg
    assert digests(run_dir) == before


def test_replan_is_refused_while_the_job_runs(tmp_path, capsys):
    assert dry(tmp_path, capsys) == 0
    run_dir = tmp_path / "r"
    token = uuid.uuid4().hex
    rank = subprocess.Popen(["sleep", "300"], env={**os.environ, procs.TOKEN_VAR: token}, start_new_session=True)
    try:
        job = {**procs.identity(rank.pid), "pgid": rank.pid, "token": token, "backend": "torchrun"}
        job.update(host=os.uname().nodename, run_dir=str(run_dir.resolve()))
        (run_dir / "job.json").write_text(json.dumps(job))
        assert local.status(run_dir)["state"] == "RUNNING"
        before = digests(run_dir)
        msg = error([*TINY, "--dry-run", "--name", "r", "--runs-dir", str(tmp_path), "--replan"], capsys)
        assert "is RUNNING" in msg and "refused while its job may run" in msg
        assert digests(run_dir) == before
    finally:
        rank.kill()
        rank.wait()


@pytest.mark.parametrize("name", ["ds_config.json", "launch.sh", "plan.json"])
def test_run_files_that_are_fifos_never_hang(tmp_path, capsys, name):
    assert dry(tmp_path, capsys) == 0
    run_dir = tmp_path / "r"
    (run_dir / name).unlink()
    os.mkfifo(run_dir / name)
    for extra in (["logs/exit_code"], ["logs/launcher.log"], ["logs/metrics.jsonl"], ["job.json"]):
        path = run_dir / extra[0]
        if not path.exists():
            os.mkfifo(path)
    for argv in (["status", "r"], ["logs", "r"], ["jobs"], ["launch", "r", "--detach"], ["cancel", "r"]):
        proc = subprocess.run(
            [sys.executable, "-m", "launcher.cli", *argv],
            cwd=tmp_path,
            env={**cpu_env(), "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "Traceback" not in proc.stderr, (argv, proc.stderr[-1500:])
        assert proc.returncode in (0, 2), (argv, proc.returncode, proc.stderr[-500:])


def test_ds_config_edited_away_from_the_plan_is_caught_before_any_rank(tmp_path, capsys):
    pytest.importorskip("deepspeed")
    assert dry(tmp_path, capsys) == 0
    run_dir = tmp_path / "r"
    ds = json.loads((run_dir / "ds_config.json").read_text())
    ds["train_micro_batch_size_per_gpu"] += 1
    (run_dir / "ds_config.json").write_text(json.dumps(ds))
    msg = error(["launch", str(run_dir), "--detach"], capsys)
    assert "does not match plan.json (train_micro_batch_size_per_gpu" in msg
    assert not (run_dir / "job.json").exists()


def test_a_supervisor_that_cannot_run_says_why(tmp_path, capsys, monkeypatch):
    """Its own errors go to logs/supervisor.log, and status quotes them (they used to vanish)."""
    assert dry(tmp_path, capsys) == 0
    run_dir = tmp_path / "r"
    (run_dir / "logs" / "launcher.log").mkdir()  # the supervisor cannot open its log
    for k, v in cpu_env().items():
        monkeypatch.setenv(k, v)
    local.submit(run_dir)
    deadline = time.time() + 60
    while local.status(run_dir)["state"] == "RUNNING" and time.time() < deadline:
        time.sleep(0.1)
    st = local.status(run_dir)
    assert st["state"] == "LOST" and "IsADirectoryError" in st["reason"], st


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--lr", "1"], "--lr: expected below 1"),
        (["--max-steps", "20000000"], "--max-steps: expected at most 10,000,000"),
        (["--seed", str(2**64)], "--seed: expected at most 4,294,967,295"),
        (["--keep-last", "100000"], "--keep-last"),
        (["--rdzv-endpoint", "node1"], "--rdzv-endpoint: expected HOST:PORT"),
        (["--rdzv-endpoint", "node1:0"], "--rdzv-endpoint: expected HOST:PORT"),
        (["--rdzv-endpoint", "$(id):29500"], "--rdzv-endpoint: expected HOST:PORT"),
        (["--name", "r\n"], "run name"),
    ],
)
def test_numbers_and_endpoints_out_of_range(flags, needle, tmp_path, capsys):
    msg = error([*TINY, "--dry-run", "--runs-dir", str(tmp_path), *flags], capsys)
    assert needle in msg
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("grace", ["nan", "-5", "inf", "1e9"])
def test_cancel_grace_out_of_range(grace, tmp_path, capsys):
    assert dry(tmp_path, capsys) == 0
    assert "--grace" in error(["cancel", str(tmp_path / "r"), "--grace", grace], capsys)


def test_runs_dir_that_cannot_hold_runs(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert "cannot write the run directory" in error(
        [*TINY, "--dry-run", "--runs-dir", str(tmp_path / "afile")], capsys
    )
    assert "cannot write the run directory" in error([*TINY, "--dry-run", "--runs-dir", "/dev/null"], capsys)
    assert "cannot write the run directory" in error([*TINY, "--dry-run", "--runs-dir", "/proc/self"], capsys)
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=False)
    try:
        if os.access(ro, os.W_OK) and not os.path.ismount(ro):
            pytest.skip("cannot make a read-only directory here (not root)")
        assert "cannot write the run directory" in error([*TINY, "--dry-run", "--runs-dir", str(ro)], capsys)
    finally:
        subprocess.run(["umount", str(ro)], check=False)
