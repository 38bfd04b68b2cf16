"""Local jobs (the torchrun backend on this machine): submit, status, logs, cancel.

submit starts `python -m launcher.backends.supervise RUN_DIR` in a new session (its own process
group), detached from ftlaunch: killing ftlaunch does not stop the job. job.json in the run dir
records the supervisor's pid / process group; logs/exit_code records how the job ended.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from launcher.errors import FtlaunchError
from launcher.rundir import read_new, write_atomic

PREEMPTED = 75
LOW_SPACE = 64 * 2**20  # below this, a failed job's status names the full disk


class JobError(FtlaunchError):
    pass


def _job_file(run_dir: Path) -> Path:
    return run_dir / "job.json"


def submit(run_dir: Path) -> dict:
    run_dir = run_dir.resolve()
    if (run_dir / "job.json").exists() and status(run_dir)["state"] in ("RUNNING",):
        raise JobError(f"{run_dir.name} is already running; `ftlaunch cancel {run_dir}` first")
    (run_dir / "logs" / "exit_code").unlink(missing_ok=True)
    (run_dir / "cancel_requested").unlink(missing_ok=True)
    env = dict(os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher.backends.supervise", str(run_dir)],
        cwd=run_dir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    job = {
        "backend": "torchrun",
        "pid": proc.pid,
        "pgid": proc.pid,
        "host": socket.gethostname(),
        "started": time.time(),
    }
    write_atomic(_job_file(run_dir), json.dumps(job, indent=2) + "\n")
    return job


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is not running
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _last_event(run_dir: Path) -> dict:
    path = run_dir / "logs" / "metrics.jsonl"
    if not path.exists():
        return {}
    last = {}
    for line in path.read_text().splitlines():
        try:
            last = json.loads(line)
        except json.JSONDecodeError:
            continue
    return last


def status(run_dir: Path) -> dict:
    run_dir = run_dir.resolve()
    jf = _job_file(run_dir)
    if not jf.exists():
        return {"run": str(run_dir), "state": "NOT_STARTED"}
    job = json.loads(jf.read_text())
    out = {"run": str(run_dir), "backend": job.get("backend"), "pid": job.get("pid"), "host": job.get("host")}
    code_file = run_dir / "logs" / "exit_code"
    last = _last_event(run_dir)
    if "step" in last:
        out["step"] = last["step"]
    if code_file.exists():
        code = int(code_file.read_text().strip() or 1)
        out["exit_code"] = code
        if (run_dir / "cancel_requested").exists():
            out["state"] = "CANCELLED"
        elif code == 0:
            out["state"] = "SUCCEEDED"
        elif last.get("event") == "preempted":
            out["state"] = "PREEMPTED"
        else:
            out["state"] = "FAILED"
    elif job.get("host") != socket.gethostname():
        out["state"] = "UNKNOWN"
        out["reason"] = f"started on {job.get('host')}; check there"
    elif _alive(int(job["pid"])):
        out["state"] = "RUNNING"
    else:
        out["state"] = "LOST"
        out["reason"] = "the supervisor is gone without recording an exit code (machine restart or SIGKILL)"
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


def cancel(run_dir: Path, grace_s: float = 60.0) -> dict:
    """SIGTERM the job's process group (ranks checkpoint and exit), SIGKILL after grace_s."""
    run_dir = run_dir.resolve()
    st = status(run_dir)
    if st["state"] != "RUNNING":
        raise JobError(f"{run_dir.name} is {st['state']}, nothing to cancel")
    write_atomic(run_dir / "cancel_requested", f"{time.time()}\n")
    pgid = json.loads(_job_file(run_dir).read_text())["pgid"]
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return status(run_dir)
    deadline = time.time() + grace_s
    while time.time() < deadline:
        if status(run_dir)["state"] != "RUNNING":
            return status(run_dir)
        time.sleep(0.5)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
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
