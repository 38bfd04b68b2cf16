"""The Ray backend: a Ray Jobs submission whose entrypoint trains the run under Ray Train.

The request is written to RUN_DIR/ray_job.json with the run directory (`--dry-run` prints it).
It is a Ray Jobs request and nothing else: Ray's own JobSubmissionClient.submit_job(**request)
and `ray job submit` (submit_command) take it as written, and submit sends exactly that:

    entrypoint   python -m launcher.backends.ray_entry       (launcher/backends/ray_entry.py)
    runtime_env  working_dir: the run directory, without its outputs (logs/, checkpoints/,
                 output/, ray/) or weight files; py_modules: this launcher package and, for a
                 user's program (--script / --module), the directory it was planned from (its
                 runs directory excluded), where its ranks start on the cluster; env_vars
                 (DS_ACCELERATOR=cpu for --cpu runs); excludes also drop .git, .venv, caches
                 (local paths, which Ray's client and CLI upload before the REST call)
    metadata     the ftlaunch run name and version (how `ftlaunch jobs --address` finds its
                 jobs) and, as the JSON string Ray's metadata values must be, ftlaunch_train:
                 what the entrypoint gives Ray Train: workers, resources per worker, placement
                 strategy, max_failures, and `storage`, the directory every Ray node sees, in
                 which the run directory lives on the cluster (STORAGE/NAME; default: the run
                 directory's own parent, right for a cluster on this machine or one that mounts
                 the same path)

The dashboard address is not part of a request: plan.json keeps the one given with --address.

Before anything is uploaded: the upload must be under MAX_UPLOAD_MIB, the dashboard must answer
within TIMEOUT_S, and its alive nodes must hold the CPUs / GPUs the workers ask for. Each failure
is one RayError line. RUN_DIR/job.json records the address and submission id for status, logs
and cancel. Nothing here imports ray until a cluster is contacted (planning stays fast).
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import launcher
from launcher import __version__
from launcher.errors import FtlaunchError
from launcher.rundir import JOB_FILE, RunFile, last_step, read_job, read_run_dir, write_atomic

REQUEST_FILE = "ray_job.json"
ENTRYPOINT = "python -m launcher.backends.ray_entry"
MAX_UPLOAD_MIB = 100  # Ray refuses packages over 512 MiB and warns far below; big files belong on storage
TIMEOUT_S = 5.0
# gitignore patterns (Ray's syntax); a leading "/" anchors at the top of the run directory
EXCLUDES = [
    ".git",
    ".venv",
    "__pycache__",
    "*.pyc",
    "/logs",
    "/checkpoints",
    "/output",
    "/ray",
    f"/{JOB_FILE}",
    "*.safetensors",
    "*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "*.gguf",
]
CPU_ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
# Ray job states -> ftlaunch's (the torchrun backend says CANCELLED for a stopped job)
STATES = {
    "PENDING": "PENDING",
    "RUNNING": "RUNNING",
    "SUCCEEDED": "SUCCEEDED",
    "FAILED": "FAILED",
    "STOPPED": "CANCELLED",
}
ACTIVE = ("PENDING", "RUNNING")


class RayError(FtlaunchError):
    pass


def scaling(run: RunFile, cpu: bool) -> dict:
    """Ray Train's ScalingConfig for the plan: one worker per rank; one GPU each, or CPU workers.

    One node: PACK. Several nodes with one GPU each: STRICT_SPREAD (one worker per node);
    otherwise SPREAD, the GPU requests keep gpus_per_node workers on each node.
    """
    nodes, per_node = int(run.cluster["nodes"]), int(run.cluster["gpus_per_node"])
    if nodes == 1:
        strategy = "PACK"
    elif per_node == 1:
        strategy = "STRICT_SPREAD"
    else:
        strategy = "SPREAD"
    return {
        "num_workers": nodes * per_node,
        "use_gpu": not cpu,
        "resources_per_worker": {"CPU": 1} if cpu else {"CPU": 1, "GPU": 1},
        "placement_strategy": strategy,
    }


def job_request(
    run_dir: Path,
    run: RunFile,
    cpu: bool,
    storage: str | Path | None = None,
    max_failures: int = 2,
) -> dict:
    """The exact Ray Jobs request for the run directory (what ray_job.json holds)."""
    run_dir = Path(run_dir).resolve()
    storage = Path(storage).resolve() if storage else run_dir.parent
    train = {**scaling(run, cpu), "max_failures": max_failures, "storage": str(storage)}
    modules, excludes = [str(Path(launcher.__file__).resolve().parent)], list(EXCLUDES)
    if run.program is not None:  # the directory the user's program was planned from ships beside
        workdir = Path(run.program.workdir)
        modules.append(str(workdir))
        for inside in (run_dir.parent, run_dir):  # runs/ inside the project: not its checkpoints
            if inside != workdir and inside.is_relative_to(workdir):
                excludes.append("/" + inside.relative_to(workdir).as_posix())
                break
    return {
        "entrypoint": ENTRYPOINT,
        "runtime_env": {
            "working_dir": str(run_dir),
            "py_modules": modules,
            "excludes": excludes,
            "env_vars": dict(CPU_ENV) if cpu else {},
        },
        "metadata": {
            "ftlaunch_run": run.name,
            "ftlaunch_version": __version__,
            "ftlaunch_train": json.dumps(train, sort_keys=True),
        },
    }


def train_settings(request: dict) -> dict:
    """What the entrypoint gives Ray Train, from a request's metadata (see job_request)."""
    return json.loads(request["metadata"]["ftlaunch_train"])


def submit_command(request: dict, address: str | None) -> list[str]:
    """The `ray job submit` command line that sends the same request."""
    return [
        "ray", "job", "submit", "--address", address or "$RAY_ADDRESS",
        "--runtime-env-json", json.dumps(request["runtime_env"]),
        "--metadata-json", json.dumps(request["metadata"]),
        "--no-wait", "--", *request["entrypoint"].split(),
    ]


def files(run_dir: Path, run: RunFile) -> dict[str, str]:
    """The Ray backend's files in a run directory: the request and an example cluster config."""
    from launcher.backends.ray_cluster import FILE, cluster_yaml

    opts = run.backend["ray"]
    request = job_request(run_dir, run, opts["cpu"], opts.get("storage"), run.backend.get("max_restarts", 0))
    c = run.cluster
    return {
        REQUEST_FILE: json.dumps(request, indent=2) + "\n",
        FILE: cluster_yaml(run.name, c["gpu"], c["nodes"], c["gpus_per_node"]),
    }


def read_request(run_dir: Path) -> dict:
    path = Path(run_dir) / REQUEST_FILE
    if not path.is_file():
        raise RayError(f"{run_dir} has no {REQUEST_FILE}; write it with `ftlaunch ... --backend ray --dry-run`")
    try:
        request = json.loads(path.read_bytes()[: 16 * 2**20])
    except (OSError, ValueError, RecursionError):
        request = None
    try:
        train_settings(request)["storage"]
    except (TypeError, KeyError, ValueError, AttributeError):  # edited or broken
        raise RayError(f"{path} is not a Ray job request ftlaunch wrote; write it again with --dry-run --replan") from None
    return request


def _excluded(rel: Path, patterns: list[str]) -> bool:
    """gitignore matching for the simple patterns in EXCLUDES: a name anywhere, or '/name' at the top."""
    parts = rel.parts
    for pat in patterns:
        if pat.startswith("/"):
            if fnmatch.fnmatch(parts[0], pat[1:]):
                return True
        elif any(fnmatch.fnmatch(part, pat) for part in parts):
            return True
    return False


def upload_size(request: dict) -> tuple[int, Path | None, int]:
    """Bytes that would be uploaded (working_dir + py_modules, before compression), and the biggest file."""
    env = request["runtime_env"]
    total, biggest, biggest_size = 0, None, -1
    for root in [env["working_dir"], *env.get("py_modules", [])]:
        root = Path(root)
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            dirnames[:] = [
                d for d in dirnames if not _excluded((here / d).relative_to(root), env["excludes"])
            ]
            for f in filenames:
                path = here / f
                if _excluded(path.relative_to(root), env["excludes"]) or not path.is_file():
                    continue
                size = path.stat().st_size
                total += size
                if size > biggest_size:
                    biggest, biggest_size = path, size
    return total, biggest, biggest_size


def check_upload(request: dict) -> None:
    total, biggest, biggest_size = upload_size(request)
    if total > MAX_UPLOAD_MIB * 2**20:
        raise RayError(
            f"the Ray upload would be {total / 2**20:.0f} MiB (limit {MAX_UPLOAD_MIB} MiB), the biggest file "
            f"{biggest} ({biggest_size / 2**20:.0f} MiB); move large files out of the run directory onto "
            "storage the cluster reads (e.g. --data /shared/train.jsonl)"
        )


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
