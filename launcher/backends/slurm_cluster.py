"""What the Slurm cluster offers, and whether a request fits it, checked before anything is queued.

A job that cannot run would otherwise sit in the queue (or be refused with a terse message):
Slurm not installed here, a partition that does not exist, more nodes than the partition has,
more GPUs (or CPUs, memory) per node than any node has. Each is one SlurmError line saying what
the cluster has. Only the configuration counts, not the nodes' current state: Slurm queues a
job for nodes that are down or busy, and so does ftlaunch.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess

from launcher.backends.slurm_script import SlurmOptions
from launcher.errors import FtlaunchError

_SIZE_MB = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


class SlurmError(FtlaunchError):
    """Slurm is missing, refused the job, or cannot satisfy the request."""


def run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a Slurm command; a one-line SlurmError when Slurm is not installed here."""
    if not shutil.which(argv[0]):
        raise SlurmError(
            f"Slurm is not installed here (no `{argv[0]}` on PATH): run ftlaunch on a Slurm login node, "
            "or try the local test cluster (sudo bash cluster/slurm_up.sh)"
        )
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{argv[0]}` did not answer within {timeout:.0f} s: is slurmctld up?") from None


def last_line(proc: subprocess.CompletedProcess) -> str:
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    return lines[-1].strip() if lines else f"exit code {proc.returncode}"


def fields(line: str) -> dict[str, str]:
    """One line of `scontrol show ... -o`: Key=Value pairs (values may hold spaces)."""
    return {k: v.strip() for k, v in re.findall(r"(\S+?)=(.*?)(?= \S+?=|\s*$)", line.strip())}


def _records(argv: list[str]) -> list[dict[str, str]]:
    proc = run(argv)
    if proc.returncode != 0:
        raise SlurmError(f"`{' '.join(argv)}` failed: {last_line(proc)} (is slurmctld up?)")
    return [fields(line) for line in proc.stdout.splitlines()]


@functools.cache
def has_accounting() -> bool:
    """Whether sacct has data: an accounting storage other than none."""
    if not shutil.which("sacct"):
        return False
    proc = run(["scontrol", "show", "config"])
    m = re.search(r"^AccountingStorageType\s*=\s*(\S+)", proc.stdout, re.M)
    return bool(m) and m.group(1) != "accounting_storage/none"


def gpus(gres: str) -> int:
    """GPUs in a node's Gres field: 'gpu:4', 'gpu:a100:4(S:0-1)', 'gpu:a100:2,gpu:v100:2' -> 4."""
    total = 0
    for entry in re.split(r",(?![^(]*\))", gres or ""):
        parts = re.sub(r"\(.*\)$", "", entry).split(":")
        if parts[0] == "gpu" and len(parts) > 1 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def _mb(size: str) -> float:
    m = re.match(r"^(\d+)([KMGT]?)$", size)
    return int(m.group(1)) * _SIZE_MB[m.group(2)] if m else 0


def minutes(limit: str) -> float | None:
    """A Slurm time limit in minutes ('30', '1:30:00', '2-12', '2-12:00:00', ...); None = unlimited."""
    if limit.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    days, _, rest = limit.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:  # days-hours[:minutes[:seconds]]
        hours, mins, secs = (parts + [0, 0])[:3]
    else:  # minutes[:seconds] or hours:minutes:seconds
        hours, mins, secs = [0, *parts, 0][:3] if len(parts) < 3 else parts
    return int(days or 0) * 1440 + hours * 60 + mins + secs / 60


def check(opts: SlurmOptions, nnodes: int, gpus_per_node: int) -> None:
    """Raise SlurmError unless the partition exists, allows the time limit asked for and has
    `nnodes` nodes that each have `gpus_per_node` GPUs (and the CPUs and memory asked for)."""
    run(["sbatch", "--version"])  # Slurm installed
    parts = _records(["scontrol", "show", "partition", "-o"])
    names = [p.get("PartitionName", "?") for p in parts]
    if opts.partition:
        name = opts.partition
        if name not in names:
            raise SlurmError(
                f"partition {name!r} does not exist; this cluster has: {', '.join(names) or 'none'} (`sinfo`)"
            )
    else:
        defaults = [p["PartitionName"] for p in parts if p.get("Default") == "YES"]
        if not defaults:
            raise SlurmError(f"this cluster has no default partition; pass --partition ({', '.join(names)})")
        name = defaults[0]
    part = parts[names.index(name)]
    max_time = part.get("MaxTime", "UNLIMITED")
    if (
        opts.time
        and minutes(max_time) is not None
        and (minutes(opts.time) or float("inf")) > minutes(max_time)
    ):
        raise SlurmError(
            f"partition {name!r} allows jobs of at most {max_time}; --time {opts.time} is longer"
        )
    max_nodes = part.get("MaxNodes", "UNLIMITED")
    if max_nodes.isdigit() and int(max_nodes) < nnodes:
        raise SlurmError(
            f"partition {name!r} allows at most {max_nodes} nodes per job; the plan needs {nnodes}"
        )
    nodes = [
        n for n in _records(["scontrol", "show", "node", "-o"]) if name in n.get("Partitions", "").split(",")
    ]
    most = max((gpus(n.get("Gres", "")) for n in nodes), default=0)
    if most < gpus_per_node:
        raise SlurmError(
            f"partition {name!r}: no node has {gpus_per_node} GPUs (the most is {most}); "
            f"plan for at most {most} GPUs per node (e.g. --gpus {nnodes}x{most}x<GPU>)"
        )
    if len(nodes) < nnodes:
        raise SlurmError(f"partition {name!r} has {len(nodes)} node(s); the plan needs {nnodes}")
    want = f"{gpus_per_node} GPUs"
    fits = [n for n in nodes if gpus(n.get("Gres", "")) >= gpus_per_node]
    if opts.cpus_per_node:
        want += f", {opts.cpus_per_node} CPUs"
        fits = [n for n in fits if int(n.get("CPUTot", "0") or 0) >= opts.cpus_per_node]
    if _mb(opts.mem):
        want += f", {opts.mem} of memory"
        fits = [n for n in fits if int(n.get("RealMemory", "0") or 0) >= _mb(opts.mem)]
    if len(fits) < nnodes:
        raise SlurmError(
            f"partition {name!r} has {len(fits)} node(s) with {want}; the plan needs {nnodes} such nodes"
        )
