"""The Ray backend's request: what `ftlaunch ... --backend ray` writes and submits (ray.py sends it).

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
"""

from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path

import launcher
from launcher import __version__
from launcher.errors import FtlaunchError
from launcher.rundir import JOB_FILE, RunFile

REQUEST_FILE = "ray_job.json"
ENTRYPOINT = "python -m launcher.backends.ray_entry"
MAX_UPLOAD_MIB = 100  # Ray refuses packages over 512 MiB and warns far below; big files belong on storage
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
