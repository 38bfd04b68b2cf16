"""Which processes belong to a local job, told apart from everything else on the machine.

A pid alone names a job only until it is reused, so a job is recorded by more than its pid:
- the supervisor's identity: pid, the boot it started in (/proc/sys/kernel/random/boot_id) and
  its start time since boot (/proc/PID/stat field 22); a reused pid has another start time;
- a token in the environment of every process the job starts (FTLAUNCH_JOB_TOKEN): torchrun
  hands its environment to the ranks, which live in sessions of their own, so a scan of
  /proc/*/environ finds every rank, however it was detached, and nothing that is not the job.

Signals go only to processes that prove to be the job right before the signal, never to a
process group <= 1 or to ftlaunch's own group.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

TOKEN_VAR = "FTLAUNCH_JOB_TOKEN"
_PROC = Path("/proc")


def boot_id() -> str | None:
    try:
        return (_PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, ...] (None if gone)."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    return text.rpartition(")")[2].split()


def start_ticks(pid: int) -> int | None:
    fields = _stat(pid)
    try:
        return int(fields[19]) if fields else None  # field 22 of stat; 20th after the name
    except (IndexError, ValueError):
        return None


def running(pid: int) -> bool:
    """Exists and is not a zombie (exited, not yet reaped)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def identity(pid: int) -> dict:
    return {"pid": pid, "boot_id": boot_id(), "start_ticks": start_ticks(pid)}


def is_same(record: dict) -> bool:
    """The process `record` (from identity()) describes is still the one running under its pid."""
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return False
    if record.get("boot_id") is None or record.get("start_ticks") is None:
        return False  # nothing to verify it by: never taken for the job
    return running(pid) and boot_id() == record["boot_id"] and start_ticks(pid) == record["start_ticks"]


def _environ(pid: int) -> bytes:
    try:
        return (_PROC / str(pid) / "environ").read_bytes()
    except OSError:  # gone, or another user's process
        return b""


def carries(pid: int, token: str) -> bool:
    return f"{TOKEN_VAR}={token}".encode() in _environ(pid).split(b"\0")


def tagged(token: str) -> list[int]:
    """Running processes (other than this one) whose environment carries the job's token."""
    if not token:
        return []
    me = os.getpid()
    out = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and int(entry.name) != me:
            pid = int(entry.name)
            if carries(pid, token) and running(pid):
                out.append(pid)
    return sorted(out)


def safe_group(pgid) -> bool:
    """A process group id ftlaunch may signal: a real group, not init's, not its own."""
    return isinstance(pgid, int) and not isinstance(pgid, bool) and pgid > 1 and pgid != os.getpgrp()


def signal_tagged(token: str, sig: int) -> list[int]:
    """Send `sig` to every process of the job, each checked for the token right before; returns
    the pids signalled."""
    sent = []
    for pid in tagged(token):
        if pid > 1 and carries(pid, token):
            try:
                os.kill(pid, sig)
                sent.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
    return sent


def kill_all(token: str) -> list[int]:
    return signal_tagged(token, signal.SIGKILL)
