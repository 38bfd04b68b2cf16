"""A local job is known by more than its pid (backends/procs.py): pid reuse, forged or broken
job.json files and hostile exit codes never make ftlaunch signal a process that is not the job,
and every watching command answers in one line.

The processes here are plain `sleep`s standing in for "an unrelated process of the user"; the
real 2-rank runs are in test_run_safety.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.backends import local, procs
from launcher.cli import main

TINY = ["--model", "tiny-llama", "--gpus", "1x2xA100", "--cpu", "--init", "random"]


@pytest.fixture
def run_dir(tmp_path, capsys):
    assert main([*TINY, "--dry-run", "--name", "r", "--runs-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    return tmp_path / "r"


@pytest.fixture
def bystander():
    """An unrelated process of this user, in a session of its own (as a reused pid would be)."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def one_line(argv, capsys) -> tuple[int, str]:
    code = main(argv)
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    if code == 2:
        lines = out.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ftlaunch: error:"), out.err
        return code, lines[0]
    return code, out.out


def write_job(run_dir, **fields) -> None:
    job = {
        "backend": "torchrun",
        "host": socket.gethostname(),
        "token": uuid.uuid4().hex,
        "run_dir": str(run_dir.resolve()),
        "started": 0.0,
        **fields,
    }
    (run_dir / "job.json").write_text(json.dumps(job))


def test_a_reused_pid_is_not_the_job(run_dir, bystander, capsys):
    """The supervisor died and its pid now belongs to an unrelated process: the record's start
    time differs, so status is not RUNNING and cancel signals nothing."""
    me = procs.identity(bystander.pid)
    write_job(run_dir, pid=bystander.pid, pgid=bystander.pid, boot_id=me["boot_id"], start_ticks=me["start_ticks"] - 7)
    assert local.status(run_dir)["state"] == "LOST"
    code, msg = one_line(["cancel", str(run_dir), "--grace", "0"], capsys)
    assert code == 2 and "LOST" in msg and "nothing was signalled" in msg
    assert bystander.poll() is None  # alive
    assert not (run_dir / "cancel_requested").exists()


def test_a_forged_identity_without_the_token_is_not_the_job(run_dir, bystander, capsys):
    """job.json copying the unrelated process's exact identity still names no process of the job:
    the job's processes carry its token, this one does not."""
    write_job(run_dir, **procs.identity(bystander.pid), pgid=bystander.pid)
    assert local.status(run_dir)["state"] == "LOST"
    assert one_line(["cancel", str(run_dir), "--grace", "0"], capsys)[0] == 2
    assert bystander.poll() is None


@pytest.mark.parametrize("pgid", [0, 1, -1, "1", None, True])
def test_process_group_0_or_1_is_never_signalled(run_dir, bystander, pgid, capsys):
    """kill(-1) would signal every process of the user, kill(0) ftlaunch's own group."""
    write_job(run_dir, **procs.identity(bystander.pid), pgid=pgid)
    st = local.status(run_dir)
    assert st["state"] == "UNKNOWN" and "process group" in st["reason"]
    code, msg = one_line(["cancel", str(run_dir), "--grace", "0"], capsys)
    assert code == 2 and "nothing was signalled" in msg
    assert bystander.poll() is None


def test_a_live_process_of_the_job_is_found_by_its_token(run_dir, capsys):
    """A rank in a session of its own, its supervisor gone: status still says RUNNING and names
    it, launch is refused, and cancel ends it (and only it)."""
    token = uuid.uuid4().hex
    env = {**os.environ, procs.TOKEN_VAR: token}
    rank = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        write_job(run_dir, pid=dead.pid, pgid=dead.pid, boot_id=procs.boot_id(), start_ticks=1, token=token)
        st = local.status(run_dir)
        assert st["state"] == "RUNNING" and str(rank.pid) in st["reason"]
        code, msg = one_line(["launch", str(run_dir), "--detach", "--skip-preflight"], capsys)
        assert code == 2 and "RUNNING" in msg and str(rank.pid) in msg
        code, out = one_line(["cancel", str(run_dir), "--grace", "5"], capsys)
        assert code == 0 and "CANCELLED" in out
        assert rank.wait(timeout=10) == -signal.SIGTERM
        assert other.poll() is None
    finally:
        for p in (rank, other):
            p.kill()
            p.wait()


def test_the_lock_refuses_a_second_launch(run_dir, capsys):
    """While a job holds the run directory's lock, launch is refused before anything starts."""
    import fcntl

    fd = os.open(run_dir / ".job.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        code, msg = one_line(["launch", str(run_dir), "--detach", "--skip-preflight"], capsys)
        assert code == 2 and "already running" in msg
        assert not (run_dir / "job.json").exists()
    finally:
        os.close(fd)


def test_a_copied_job_record_is_not_this_runs_job(run_dir, bystander):
    write_job(run_dir, **procs.identity(bystander.pid), pgid=bystander.pid)
    job = json.loads((run_dir / "job.json").read_text())
    job["run_dir"] = "/somewhere/else/A"
    (run_dir / "job.json").write_text(json.dumps(job))
    st = local.status(run_dir)
    assert st["state"] == "NOT_STARTED" and "copied from /somewhere/else/A" in st["reason"]


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
JOB_KEYS = ["pid", "pgid", "host", "token", "boot_id", "start_ticks", "run_dir", "started", "job_id"]
BACKEND = st.sampled_from(["torchrun", "slurm", "ray", "other"]) | JSONISH
FILES = st.one_of(
    st.binary(max_size=200),
    JSONISH.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"backend": BACKEND}, optional={k: JSONISH for k in JOB_KEYS}).map(
        lambda d: json.dumps(d).encode()
    ),
)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(job=FILES | st.none(), exit_code=FILES | st.none(), metrics=FILES | st.none(), cancel=st.booleans())
def test_run_directory_files_of_any_content(
    run_dir, bystander, capsys, monkeypatch, tmp_path, job, exit_code, metrics, cancel
):
    """job.json, logs/exit_code and logs/metrics.jsonl with any bytes: status, logs and jobs answer
    (exit 0), cancel answers or refuses in one line, and nothing that is not the job is signalled."""
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))  # `jobs` lists this runs dir only
    paths = {"job.json": job, "logs/exit_code": exit_code, "logs/metrics.jsonl": metrics}
    for rel, content in paths.items():
        path = run_dir / rel
        path.unlink(missing_ok=True)
        if content is not None:
            path.write_bytes(content)
    fuzzed = {str(run_dir / rel) for rel in paths}
    tree = {str(f) for f in tmp_path.rglob("*")} - fuzzed
    st_ = local.status(run_dir)
    assert st_["state"] in ("NOT_STARTED", "UNKNOWN", "LOST", "FAILED", "SUCCEEDED", "CANCELLED", "PREEMPTED")
    # other backends' records ask Slurm / Ray, which are not here: one line, exit 2
    for argv in (["status", str(run_dir)], ["status", str(run_dir), "--json"], ["logs", str(run_dir)]):
        assert one_line(argv, capsys)[0] in (0, 2), argv
    assert one_line(["jobs", "--runs-dir", str(run_dir.parent)], capsys)[0] in (0, 2)
    if cancel:
        assert one_line(["cancel", str(run_dir), "--grace", "0"], capsys)[0] == 2
    assert bystander.poll() is None
    assert {str(f) for f in tmp_path.rglob("*")} - fuzzed == tree  # nothing written


def test_garbage_exit_code_is_a_failure_not_a_crash(run_dir, bystander, capsys):
    write_job(run_dir, **procs.identity(bystander.pid), pgid=bystander.pid)
    (run_dir / "logs" / "exit_code").write_text("zero\n")
    st = local.status(run_dir)
    assert st["state"] == "FAILED" and st["exit_code"] == "unreadable"


def test_a_launch_right_after_the_job_ended_waits_for_its_supervisor_to_exit(run_dir, capsys):
    """Status says SUCCEEDED as soon as the exit code is recorded; the supervisor still holds the
    lock until its interpreter exits. A launch in that window waits for it instead of refusing
    (seen once in CI: a moved run launched right after it finished)."""
    import fcntl
    import threading

    (run_dir / "launch.sh").write_text("exit 0\n")
    (run_dir / "logs" / "exit_code").write_text("0\n")
    fd = os.open(run_dir / ".job.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    threading.Timer(0.5, os.close, [fd]).start()  # the old supervisor exits half a second later
    code, out = one_line(["launch", str(run_dir), "--skip-preflight"], capsys)
    assert code == 0 and "SUCCEEDED" in out
