"""Local jobs (the torchrun backend on this machine): submit, status, logs, cancel.

submit starts `python -m launcher.backends.supervise RUN_DIR` in a new session (its own process
group), detached from ftlaunch: killing ftlaunch does not stop the job. job.json in the run dir
records who the job is (backends/procs.py: the supervisor's pid, boot and start time, and the token
every process of the job carries); logs/exit_code records how the job ended. One job per run
directory: the supervisor holds RUN_DIR/.job.lock for its life, and a launch is refused while it is
held or while any process of the previous job still runs.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from launcher.backends import procs, rank_exit
from launcher.errors import FtlaunchError
from launcher.rundir import RunDirError, read_exit_code, read_job, read_new, write_atomic

PREEMPTED = rank_exit.PREEMPTED
LOW_SPACE = 64 * 2**20  # below this, a failed job's status names the full disk
SUPERVISOR_LOG = "supervisor.log"  # what the supervisor itself said (a job that could not start)


class JobError(FtlaunchError):
    pass


def _job_file(run_dir: Path) -> Path:
    return run_dir / "job.json"


_LOCK = ".job.lock"
_EXITING = 10.0  # seconds a finished job's supervisor may take to exit and release the lock


def _try_lock(run_dir: Path, wait: float = 0.0) -> int | None:
    """An fd holding the run directory's exclusive lock, or None while a job holds it (`wait`
    seconds at most)."""
    fd = os.open(run_dir / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def _read_job(run_dir: Path) -> dict | None:
    """job.json as submit wrote it; None if there is none; a one-line error if unreadable."""
    try:
        return read_job(run_dir, {})
    except RunDirError as exc:
        raise JobError(str(exc).replace("nothing was done with it", "nothing was signalled")) from None


def _record_problem(job: dict) -> str | None:
    """Why a job record cannot be trusted to name the job's processes (None if it can)."""
    pid, pgid, token = job.get("pid"), job.get("pgid"), job.get("token")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return f"its pid {pid!r} is not a process ftlaunch started"
    if pgid != pid or not procs.safe_group(pgid):
        return f"its process group {pgid!r} is not the supervisor's own ({pid})"
    if not isinstance(token, str) or len(token) != 32:
        return "it has no job token (written by an older ftlaunch, or edited)"
    return None


def _supervisor_alive(job: dict) -> bool:
    """The recorded supervisor still runs: same pid, boot and start time, and it carries the token."""
    return procs.is_same(job) and procs.carries(job["pid"], job["token"])


def submit(run_dir: Path) -> dict:
    run_dir = run_dir.resolve()
    # once the exit code is recorded the job is over (status says so) but its supervisor, which holds
    # the lock, may still be exiting: a launch right after SUCCEEDED waits for it, not refuses
    ended = (run_dir / "logs" / "exit_code").exists()
    fd = _try_lock(run_dir, wait=_EXITING if ended else 0.0)
    if fd is None:
        raise JobError(f"{run_dir.name} is already running (its job holds {_LOCK}); `ftlaunch cancel {run_dir}` first")
    try:
        st = status(run_dir)
        if st["state"] in ("RUNNING", "UNKNOWN"):
            todo = (
                f"`ftlaunch cancel {run_dir}` first"
                if st["state"] == "RUNNING"
                else f"if that job is gone (check `ps`), remove {_job_file(run_dir)} and launch again"
            )
            why = f" ({st['reason']})" if st.get("reason") else ""
            raise JobError(f"{run_dir.name} is {st['state']}{why}; {todo}")
        (run_dir / "logs").mkdir(exist_ok=True)
        (run_dir / "logs" / "exit_code").unlink(missing_ok=True)
        (run_dir / "cancel_requested").unlink(missing_ok=True)
        token = uuid.uuid4().hex
        env = {**os.environ, procs.TOKEN_VAR: token}
        with open(run_dir / "logs" / SUPERVISOR_LOG, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "launcher.backends.supervise", str(run_dir)],
                cwd=run_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                pass_fds=(fd,),
            )
        job = {
            "backend": "torchrun",
            **procs.identity(proc.pid),  # our child, not reaped: its pid cannot be reused yet
            "pgid": proc.pid,
            "host": socket.gethostname(),
            "token": token,
            "run_dir": str(run_dir),
            "started": time.time(),
        }
        write_atomic(_job_file(run_dir), json.dumps(job, indent=2) + "\n")
    finally:
        os.close(fd)
    return job


def _last_event(run_dir: Path) -> dict:
    """The newest record of logs/metrics.jsonl (its last 64 KiB are read; bad lines skipped)."""
    path = run_dir / "logs" / "metrics.jsonl"
    if not path.is_file():
        return {}
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
        lines = f.read().decode("utf-8", "replace").splitlines()
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            return row
    return {}


def status(run_dir: Path) -> dict:
    run_dir = run_dir.resolve()
    out = {"run": str(run_dir), "backend": "torchrun"}
    try:
        job = _read_job(run_dir)
    except JobError as exc:
        return {**out, "state": "UNKNOWN", "reason": str(exc).replace("; nothing was signalled", "")}
    if job is None:
        return {**out, "state": "NOT_STARTED"}
    if job.get("run_dir") not in (None, str(run_dir)):
        return {
            **out,
            "state": "NOT_STARTED",
            "reason": f"job.json and logs/ were copied from {job['run_dir']}; `ftlaunch launch` starts this copy",
        }
    out.update(pid=job.get("pid"), host=job.get("host"))
    last = _last_event(run_dir)
    if isinstance(last.get("step"), int):
        out["step"] = last["step"]
    problem = _record_problem(job)
    ended, code = read_exit_code(run_dir)
    if ended:
        out["exit_code"] = code if code is not None else "unreadable"
        if (run_dir / "cancel_requested").exists():
            out["state"] = "CANCELLED"
        elif code == 0:
            out["state"] = "SUCCEEDED"
        elif last.get("event") == "preempted" or code == PREEMPTED:
            out["state"] = "PREEMPTED"
        else:
            out["state"] = "FAILED"
            if code == rank_exit.STARTUP:
                out["reason"] = "a rank exited 2 (a start-up error), not restarted: `ftlaunch logs` shows what to fix"
        return _disk_reason(run_dir, out)
    if job.get("host") != socket.gethostname():
        return {**out, "state": "UNKNOWN", "reason": f"started on {job.get('host')!r}; check there"}
    if problem:
        return {**out, "state": "UNKNOWN", "reason": f"job.json cannot be trusted: {problem}"}
    left = procs.tagged(job["token"])
    if _supervisor_alive(job):
        out["state"] = "RUNNING"
    elif left:
        out["state"] = "RUNNING"
        out["reason"] = (
            f"the supervisor is gone but {len(left)} process(es) of the job still run (pids "
            f"{', '.join(map(str, left[:8]))}); `ftlaunch cancel {run_dir}` ends them"
        )
    elif (run_dir / "cancel_requested").exists():
        out["state"] = "CANCELLED"
    else:
        out["state"] = "LOST"
        out["reason"] = "the supervisor is gone without recording an exit code (machine restart or SIGKILL)"
        said = _last_line(run_dir / "logs" / SUPERVISOR_LOG)
        if said:
            out["reason"] += f"; it last said: {said}"
    return _disk_reason(run_dir, out)


def _last_line(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def _disk_reason(run_dir: Path, out: dict) -> dict:
    if out["state"] in ("FAILED", "LOST"):
        try:
            free = shutil.disk_usage(run_dir).free
        except OSError:
            free = None
        if free is not None and free < LOW_SPACE:
            out["reason"] = (
                f"disk full: {free / 2**20:.1f} MiB free where the run directory is; free space and "
                "`ftlaunch launch` it again to resume from the last complete checkpoint"
            )
    return out


def _wait_gone(job: dict, seconds: float, signalled: list[int]) -> list[int]:
    """Wait until neither the supervisor nor any process carrying the job's token runs, nor any of
    the pids `signalled`: a process in the middle of exiting has already lost its environment (so
    no token shows) but is not gone yet."""
    deadline = time.time() + seconds
    while True:
        left = sorted(set(procs.tagged(job["token"])) | {p for p in signalled if procs.running(p)})
        if not left and not _supervisor_alive(job):
            return []
        if time.time() >= deadline:
            return left
        time.sleep(0.2)


def cancel(run_dir: Path, grace_s: float = 60.0) -> dict:
    """SIGTERM every process of the job (the ranks checkpoint and exit), SIGKILL what is left
    after grace_s, then check that none is left. Only processes that carry the job's token are
    signalled, each checked right before."""
    run_dir = run_dir.resolve()
    st = status(run_dir)
    if st["state"] != "RUNNING":
        raise JobError(
            f"{run_dir.name} is {st['state']}" + (f" ({st['reason']})" if st.get("reason") else "")
            + "; nothing was signalled"
        )
    job = _read_job(run_dir)
    write_atomic(run_dir / "cancel_requested", f"{time.time()}\n")
    signalled = procs.signal_tagged(job["token"], signal.SIGTERM)
    if _wait_gone(job, grace_s, signalled):
        signalled += procs.kill_all(job["token"])
        left = _wait_gone(job, 10.0, signalled)
        if left:
            raise JobError(
                f"{run_dir.name}: {len(left)} process(es) of the job survived SIGKILL (pids "
                f"{', '.join(map(str, left[:8]))}); they may be stuck in the kernel (D state): check `ps`"
            )
    return status(run_dir)


def follow(run_dir: Path, write, follow_: bool = True, poll_s: float = 0.5) -> dict:
    """Write the job's log as it grows; with follow_, until the job has ended."""
    path = run_dir / "logs" / "launcher.log"
    pos = 0
    while True:
        text, pos = read_new(path, pos)
        if text:
            write(text)
        st = status(run_dir)
        if not follow_ or st["state"] not in ("RUNNING",):
            if path.exists() and path.stat().st_size > pos:
                continue
            return st
        time.sleep(poll_s)
