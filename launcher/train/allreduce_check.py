"""`python -m launcher.train.allreduce_check RUN_DIR`, run under the job's own torchrun command:
one all-reduce across every rank with a timeout, and a shared-filesystem check of the run dir (and
of the user's program and the directory it starts in, for --script / --module runs).

Each rank writes logs/preflight/rank-N.json: its host, whether it sees rank 0's marker file,
and the all-reduce result; `ftlaunch preflight` reads them and names the failing host.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path


def _missing_program(run_dir: Path) -> str | None:
    """The path of the user's program (or the directory it starts in) this rank cannot see."""
    try:
        program = json.loads((run_dir / "plan.json").read_text()).get("program")
    except (OSError, ValueError):
        return None
    if not program:
        return None
    for path in (program.get("script"), program.get("workdir")):
        if path and not Path(path).exists():
            return path
    return None


def main(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist

    run_dir = Path(argv[0])
    timeout = float(argv[1]) if len(argv) > 1 else 60.0
    out = run_dir / "logs" / "preflight"
    out.mkdir(parents=True, exist_ok=True)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    report = {"rank": rank, "host": socket.gethostname(), "world": world, "gpus": torch.cuda.device_count()}
    if report["gpus"]:
        report["gpu_memory_gib"] = min(
            torch.cuda.get_device_properties(i).total_memory / 2**30 for i in range(report["gpus"])
        )
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    marker = out / "marker"
    if rank == 0:
        marker.write_text(str(time.time()))
    started = time.perf_counter()
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
        t = torch.ones(1, device="cuda" if backend == "nccl" else "cpu")
        dist.all_reduce(t)
        report["allreduce"] = "ok" if int(t.item()) == world else f"wrong sum {t.item()} != {world}"
        dist.barrier()
        report["sees_run_dir"] = marker.exists()
        report["missing"] = _missing_program(run_dir)
    except Exception as exc:  # noqa: BLE001 - the report is the point
        report["allreduce"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    report["seconds"] = round(time.perf_counter() - started, 2)
    (out / f"rank-{rank}.json").write_text(json.dumps(report))
    return 0 if report.get("allreduce") == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
