"""The Slurm backend: submit a run directory's job.sbatch, then watch, follow and cancel the job.

submit first checks the request against the cluster (launcher/backends/slurm_cluster.py), then
runs exactly `sbatch --parsable --chdir=RUN_DIR RUN_DIR/job.sbatch` and records the job id in RUN_DIR/job.json.
status asks `squeue` while the job is queued or running, then `scontrol show job` (until Slurm
forgets it, MinJobAge), then `sacct` where accounting is on, and last the exit code the batch
script recorded in logs/exit_code. Slurm's states are mapped to ftlaunch's: PENDING, RUNNING,
REQUEUED, COMPLETED, FAILED, CANCELLED, PREEMPTED (checkpointed, not requeued: launch again
to resume). A node of a running job that stops answering, and a job ended by a node failure
(NODE_FAIL), are named in the status's reason with the checkpoint a launch resumes from.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from launcher.backends import slurm_cluster
from launcher.backends.slurm_cluster import SlurmError
from launcher.backends.slurm_script import PREEMPTED, SCRIPT, SlurmOptions, submit_argv
from launcher.rundir import last_step, read_exit_code, read_job, read_new, read_run_dir, write_atomic

FINAL = ("COMPLETED", "FAILED", "CANCELLED", "PREEMPTED")
ACTIVE = ("PENDING", "RUNNING", "REQUEUED")
_STATES = {
    "PENDING": "PENDING",
    "CONFIGURING": "PENDING",
    "RESV_DEL_HOLD": "PENDING",
    "REQUEUED": "REQUEUED",
    "REQUEUE_HOLD": "REQUEUED",
    "REQUEUE_FED": "REQUEUED",
    "RUNNING": "RUNNING",
    "COMPLETING": "RUNNING",
    "SIGNALING": "RUNNING",
    "STAGE_OUT": "RUNNING",
    "RESIZING": "RUNNING",
    "SUSPENDED": "PREEMPTED",
    "STOPPED": "PREEMPTED",
    "PREEMPTED": "PREEMPTED",
    "COMPLETED": "COMPLETED",
    "CANCELLED": "CANCELLED",
}  # everything else (FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE, ...) is FAILED


def _job_file(run_dir: Path) -> Path:
    return run_dir / "job.json"


def _job(run_dir: Path) -> dict | None:
    job = read_job(run_dir, {"job_id": str})
    if job is not None and not job["job_id"].isdigit():
        raise SlurmError(f"{_job_file(run_dir)}: job_id {job['job_id'][:20]!r} is not a Slurm job id")
    return job


def log_path(run_dir: Path, job_id: str) -> Path:
    return run_dir / "logs" / f"slurm-{job_id}.out"


def submit(run_dir: Path) -> dict:
    """Check the request against the cluster, then queue job.sbatch; returns job.json's record."""
    run_dir = Path(run_dir).resolve()
    run = read_run_dir(run_dir)
    if run.backend.get("name") != "slurm":
        raise SlurmError(f"{run_dir.name} is a {run.backend.get('name')} run; write it with --backend slurm")
    if not (run_dir / SCRIPT).is_file():
        raise SlurmError(f"{run_dir}/{SCRIPT} is missing; write the run directory again with --dry-run")
    job = _job(run_dir)
    if job and status(run_dir)["state"] in ACTIVE:
        raise SlurmError(f"{run_dir.name} is already queued as Slurm job {job['job_id']}; cancel it first")
    slurm_cluster.check(
        SlurmOptions(**run.backend["slurm"]), run.backend["nnodes"], run.backend["nproc_per_node"]
    )
    (run_dir / "logs" / "exit_code").unlink(missing_ok=True)
    (run_dir / "cancel_requested").unlink(missing_ok=True)
    proc = slurm_cluster.run(submit_argv(run_dir))
    job_id = proc.stdout.strip().split(";")[0]
    if proc.returncode != 0 or not job_id.isdigit():
        raise SlurmError(f"sbatch refused the job: {slurm_cluster.last_line(proc)}")
    record = {"backend": "slurm", "job_id": job_id, "submitted": time.time()}
    if job:
        record["earlier_jobs"] = [*job.get("earlier_jobs", []), job["job_id"]]
    write_atomic(_job_file(run_dir), json.dumps(record, indent=2) + "\n")
    return record


def _query(job_id: str) -> dict | None:
    """What Slurm knows of a job: slurm_state, reason, restarts, exit_code; None once forgotten."""
    proc = slurm_cluster.run(["squeue", "-h", "-j", job_id, "-o", "%T|%r"])
    queued = proc.stdout.strip().split("|") if proc.returncode == 0 and proc.stdout.strip() else None
    out = None
    proc = slurm_cluster.run(["scontrol", "show", "job", "-o", job_id])
    if proc.returncode == 0 and proc.stdout.strip():
        f = slurm_cluster.fields(proc.stdout)
        code, _, sig = f.get("ExitCode", "0:0").partition(":")
        out = {
            "slurm_state": f.get("JobState", "UNKNOWN"),
            "reason": f.get("Reason", "None"),  # why it waits or ended
            "restarts": int(f.get("Restarts", "0") or 0),
            "exit_code": int(code or 0),
            "signal": int(sig or 0),
        }
        if f.get("NodeList", "(null)") not in ("", "(null)"):
            out["nodes"] = f["NodeList"]
        out["requeue"] = f.get("Requeue") == "1"
    elif slurm_cluster.has_accounting():
        proc = slurm_cluster.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"])
        rows = [r for r in proc.stdout.splitlines() if "|" in r]
        if rows:
            state, _, exit_code = rows[-1].partition("|")
            code, _, sig = exit_code.partition(":")
            out = {"slurm_state": state.split()[0], "reason": "None", "exit_code": int(code or 0)}
            out["signal"] = int(sig or 0)
    if queued:  # squeue is the authority while the job is in the queue
        out = {**(out or {}), "slurm_state": queued[0], "reason": queued[-1]}
    if out and out["reason"] in ("None", "(null)"):
        del out["reason"]
    return out


def _unwell(nodelist: str) -> list[str]:
    """The nodes of a node list that Slurm sees as down or not responding, each with its state
    and Slurm's reason: 'node2 (DOWN+NOT_RESPONDING: Not responding)'."""
    proc = slurm_cluster.run(["scontrol", "show", "node", "-o", nodelist])
    out = []
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        f = slurm_cluster.fields(line)
        state = f.get("State", "")
        if {"DOWN", "FAIL", "NOT_RESPONDING"} & set(state.rstrip("*$~#!%@^-").split("+")):
            why = f.get("Reason", "").split(" [")[0]
            out.append(f"{f.get('NodeName', '?')} ({state}" + (f": {why})" if why else ")"))
    return out


def _resumes_from(run_dir: Path) -> str:
    from launcher.train.checkpoint import usable

    found, _ = usable(run_dir / "checkpoints")
    return f"checkpoint step {found[0]}" if found else "the start (no checkpoint yet)"


def _node_trouble(run_dir: Path, known: dict, raw: str) -> str | None:
    """The reason shown for a running job with a node down or not responding, or a job that a node
    failure ended (NODE_FAIL)."""
    unwell = ", ".join(_unwell(known["nodes"])) if known.get("nodes") else ""
    if raw == "NODE_FAIL":
        return (
            f"node failure (Slurm NODE_FAIL): {unwell or 'a node of ' + known.get('nodes', 'the job')}; "
            f"the job was not requeued: `ftlaunch launch {run_dir}` resumes from {_resumes_from(run_dir)}"
        )
    if not unwell:
        return None
    then = (
        "requeues the job, which resumes"
        if known.get("requeue")
        else "ends it (NODE_FAIL); launch again to resume"
    )
    return (
        f"node down or not responding: {unwell}; if it stays so, Slurm {then} from {_resumes_from(run_dir)}"
    )


def status(run_dir: Path) -> dict:
    """The job's state (see the module docstring), with Slurm's own state and reason."""
    run_dir = Path(run_dir).resolve()
    job = _job(run_dir)
    if not job:
        return {"run": str(run_dir), "state": "NOT_STARTED"}
    out = {"run": str(run_dir), "backend": "slurm", "job_id": job["job_id"]}
    step = last_step(run_dir)
    if step is not None:
        out["step"] = step
    cancelled = (run_dir / "cancel_requested").exists()
    known = _query(job["job_id"])
    if known:
        out.update({k: v for k, v in known.items() if k != "requeue"})
        raw = known["slurm_state"].rstrip("+")
        state = _STATES.get(raw, "FAILED")
        if state == "PENDING" and known.get("restarts"):
            state = "REQUEUED"
        elif raw == "FAILED" and known.get("exit_code") == PREEMPTED:
            state = "PREEMPTED"
        out["state"] = state
        if state == "RUNNING" or raw == "NODE_FAIL":
            trouble = _node_trouble(run_dir, known, raw)
            if trouble:
                out["reason"] = trouble
        return out
    ended, code = read_exit_code(run_dir)
    if ended:
        out["exit_code"] = code if code is not None else "unreadable"
        out["state"] = "COMPLETED" if code == 0 else "PREEMPTED" if code == PREEMPTED else "FAILED"
    elif cancelled:
        out["state"] = "CANCELLED"
    else:
        out["state"] = "UNKNOWN"
        out["reason"] = f"Slurm no longer knows job {job['job_id']} and it recorded no exit code"
    return out


def follow(run_dir: Path, write, follow_: bool = True, poll_s: float = 1.0) -> dict:
    """Write the job's output file as it grows; with follow_, until the job has ended (a requeued
    job appends to the same file, so following goes on through requeues)."""
    run_dir = Path(run_dir).resolve()
    job = _job(run_dir)
    if not job:
        return status(run_dir)
    path = log_path(run_dir, job["job_id"])
    pos = 0

    def drain() -> None:
        nonlocal pos
        text, pos = read_new(path, pos)
        if text:
            write(text)

    while True:
        drain()
        st = status(run_dir)
        if not follow_ or st["state"] not in ACTIVE:
            drain()
            return st
        time.sleep(poll_s)


def cancel(run_dir: Path, grace_s: float = 60.0) -> dict:
    """scancel a pending or running job (running ranks get SIGTERM and checkpoint first); waits up
    to grace_s for it to leave the queue."""
    run_dir = Path(run_dir).resolve()
    st = status(run_dir)
    if st["state"] not in ACTIVE:
        raise SlurmError(f"{run_dir.name} is {st['state']}, nothing to cancel")
    write_atomic(run_dir / "cancel_requested", f"{time.time()}\n")
    proc = slurm_cluster.run(["scancel", st["job_id"]])
    if proc.returncode != 0:
        raise SlurmError(f"scancel {st['job_id']} failed: {slurm_cluster.last_line(proc)}")
    deadline = time.time() + grace_s
    while time.time() < deadline:
        st = status(run_dir)
        if st["state"] not in ACTIVE:
            break
        time.sleep(0.5)
    return st


def queue() -> list[dict]:
    """The ftlaunch jobs in the Slurm queue: those whose working directory is a run directory."""
    proc = slurm_cluster.run(["squeue", "-h", "-o", "%i|%T|%Z"])
    out = []
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        job_id, _, rest = line.partition("|")
        slurm_state, _, workdir = rest.partition("|")
        job = _job(Path(workdir)) if (Path(workdir) / "plan.json").is_file() else None
        if job and job.get("job_id") == job_id:
            out.append({"run": workdir, "job_id": job_id, "slurm_state": slurm_state})
    return out
