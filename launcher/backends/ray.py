"""The Ray backend: a Ray Jobs submission whose entrypoint trains the run under Ray Train.

What is submitted, the request in RUN_DIR/ray_job.json, is written by ray_request.py; this module
sends it and follows the job. Before anything is uploaded: the upload must be under
ray_request.MAX_UPLOAD_MIB, the dashboard must answer within TIMEOUT_S, and its alive nodes must hold
the CPUs / GPUs the workers ask for. Each failure is one RayError line. RUN_DIR/job.json records the
address and submission id for status, logs and cancel. Nothing here imports ray until a cluster is
contacted (planning stays fast).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from launcher.backends.ray_request import (
    REQUEST_FILE,
    RayError,
    check_upload,
    files,
    read_request,
    train_settings,
)
from launcher.rundir import JOB_FILE, last_step, read_job, read_run_dir, write_atomic

TIMEOUT_S = 5.0
# Ray job states -> ftlaunch's (the torchrun backend says CANCELLED for a stopped job)
STATES = {
    "PENDING": "PENDING",
    "RUNNING": "RUNNING",
    "SUCCEEDED": "SUCCEEDED",
    "FAILED": "FAILED",
    "STOPPED": "CANCELLED",
}
ACTIVE = ("PENDING", "RUNNING")


def _get(address: str, path: str) -> dict:
    try:
        with urllib.request.urlopen(address.rstrip("/") + path, timeout=TIMEOUT_S) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RayError(
            f"no Ray dashboard answers at {address} ({reason}); start the cluster (bash cluster/ray_up.sh "
            "for a local one) or pass --address http://HEAD:8265"
        ) from None


def _alive_nodes(address: str, wait_s: float = 20.0) -> list[dict]:
    """The cluster's ALIVE nodes. A cluster that has just started answers before its nodes have
    registered: an empty list is asked again for up to `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            nodes = _get(address, "/api/v0/nodes?limit=1000")["data"]["result"]["result"]
        except (KeyError, TypeError):
            raise RayError(
                f"{address} does not answer like a Ray dashboard (its node list is missing)"
            ) from None
        alive = [n for n in nodes if n.get("state") == "ALIVE"]
        if alive or time.monotonic() >= deadline:
            return alive
        time.sleep(1.0)


def check_cluster(address: str, train: dict) -> None:
    """A RayError when the cluster's alive nodes do not hold the CPUs / GPUs the workers ask for."""
    _get(address, "/api/version")
    alive = _alive_nodes(address)
    have: dict[str, float] = {}
    for node in alive:
        for key, value in node.get("resources_total", {}).items():
            have[key] = have.get(key, 0.0) + value
    workers = train["num_workers"]
    missing = [
        f"{need * workers:g} {key}"
        for key, need in train["resources_per_worker"].items()
        if have.get(key, 0.0) < need * workers
    ]
    if train["placement_strategy"] == "STRICT_SPREAD" and len(alive) < workers:
        missing.append(f"{workers} nodes")
    if missing:
        raise RayError(
            f"the Ray cluster at {address} has {have.get('GPU', 0):g} GPU(s) and {have.get('CPU', 0):g} CPU(s) on "
            f"{len(alive)} node(s); this run's {workers} workers need {' and '.join(missing)}; use a bigger "
            "cluster, plan for the GPUs it has (--gpus), or add --cpu for CPU workers"
        )


def _client(address: str):
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise RayError("the Ray backend needs ray on this machine: pip install -e '.[ray]'") from None
    try:
        return JobSubmissionClient(address)
    except (ConnectionError, RuntimeError) as exc:
        raise RayError(f"cannot use the Ray cluster at {address}: {exc}") from None


def resolve_address(address: str | None) -> str:
    address = address or os.environ.get("RAY_ADDRESS")
    if not address or not address.startswith(("http://", "https://")):
        raise RayError(
            "the Ray backend needs the cluster's dashboard address: --address http://HEAD:8265 "
            "(or RAY_ADDRESS=http://HEAD:8265)"
        )
    return address.rstrip("/")


def submit(run_dir: Path) -> dict:
    """Check, upload and submit the run directory's ray_job.json; job.json records the job."""
    run_dir = Path(run_dir).resolve()
    request = read_request(run_dir)
    if request.get("runtime_env", {}).get("working_dir") != str(run_dir):  # copied or moved here:
        write_atomic(run_dir / REQUEST_FILE, files(run_dir, read_run_dir(run_dir))[REQUEST_FILE])
        request = read_request(run_dir)  # written again for this place, which is what is uploaded
    address = resolve_address(read_run_dir(run_dir).backend["ray"].get("address"))
    if (run_dir / JOB_FILE).exists() and status(run_dir)["state"] in ACTIVE:
        raise RayError(f"{run_dir.name} is already running; `ftlaunch cancel {run_dir}` first")
    check_upload(request)
    train = train_settings(request)
    check_cluster(address, train)
    client = _client(address)
    submission_id = f"{request['metadata']['ftlaunch_run']}-{uuid.uuid4().hex[:8]}"
    try:
        client.submit_job(submission_id=submission_id, **request)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayError(
            f"the Ray cluster at {address} refused the job: {' '.join(str(exc).split())[:300]}"
        ) from None
    job = {
        "backend": "ray",
        "address": address,
        "submission_id": submission_id,
        "cluster_run_dir": str(Path(train["storage"]) / run_dir.name),
        "started": time.time(),
    }
    write_atomic(run_dir / JOB_FILE, json.dumps(job, indent=2) + "\n")
    return job


def _job(run_dir: Path) -> dict:
    job = read_job(run_dir, {"submission_id": str, "address": str, "cluster_run_dir": str})
    if job is None:
        raise RayError(f"{Path(run_dir).name} has not been submitted to Ray (no {JOB_FILE})")
    return job


def status(run_dir: Path) -> dict:
    """The job's state (UNKNOWN, with the reason, while the cluster does not answer)."""
    run_dir = Path(run_dir).resolve()
    job = _job(run_dir)
    out = {
        "run": str(run_dir),
        "backend": "ray",
        "submission_id": job["submission_id"],
        "address": job["address"],
    }
    try:
        _get(job["address"], "/api/version")
    except RayError as exc:
        return {**out, "state": "UNKNOWN", "reason": str(exc)}
    info = _client(job["address"]).get_job_info(job["submission_id"])
    ray_status = str(getattr(info.status, "value", info.status))
    out.update(state=STATES.get(ray_status, "UNKNOWN"), ray_status=ray_status)
    step = last_step(job["cluster_run_dir"])
    if step is not None:
        out["step"] = step
    if out["state"] == "FAILED" and info.message:
        out["reason"] = " ".join(info.message.split())[-300:]
    return out


def follow(run_dir: Path, write, follow_: bool = True) -> dict:
    """Write the job's log (the entrypoint's and, through Ray, every worker's); with follow_, until it ends."""
    job = _job(run_dir)
    _get(job["address"], "/api/version")
    client = _client(job["address"])
    if not follow_:
        write(client.get_job_logs(job["submission_id"]))
        return status(run_dir)

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job["submission_id"]):
            write(chunk)

    asyncio.run(tail())
    st = status(run_dir)
    while st["state"] in ACTIVE:  # the log stream can close a moment before the status settles
        time.sleep(0.5)
        st = status(run_dir)
    return st


def cancel(run_dir: Path, grace_s: float = 60.0) -> dict:
    """stop_job: Ray signals the entrypoint, which takes the Ray Train workers down with it."""
    job = _job(run_dir)
    _get(job["address"], "/api/version")
    st = status(run_dir)
    if st["state"] not in ACTIVE:
        raise RayError(f"{Path(run_dir).name} is {st['state']}, nothing to cancel")
    _client(job["address"]).stop_job(job["submission_id"])
    deadline = time.time() + grace_s
    while st["state"] in ACTIVE and time.time() < deadline:
        time.sleep(0.5)
        st = status(run_dir)
    return st


def list_jobs(address: str | None) -> list[dict]:
    """The ftlaunch jobs the cluster knows, oldest first."""
    address = resolve_address(address)
    _get(address, "/api/version")
    rows = []
    for info in _client(address).list_jobs():
        meta = info.metadata or {}
        if "ftlaunch_run" not in meta or not info.submission_id:
            continue
        ray_status = str(getattr(info.status, "value", info.status))
        rows.append(
            {
                "submission_id": info.submission_id,
                "run": meta["ftlaunch_run"],
                "backend": "ray",
                "state": STATES.get(ray_status, "UNKNOWN"),
                "ray_status": ray_status,
                "start_time": info.start_time,
            }
        )
    return sorted(rows, key=lambda r: r["start_time"] or 0)
