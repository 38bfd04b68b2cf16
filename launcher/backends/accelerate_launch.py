"""`--launcher accelerate`: the user's program starts under `accelerate launch` with the run's
accelerate_config.yaml, in place of torchrun; the rest of the backend (launch.sh, job.sbatch, the
supervisor, status / logs / cancel) is the torchrun backend's.

`accelerate launch` reads the plan from the config (DeepSpeed file, processes, machines) and runs
torchrun itself (DeepSpeed's "standard" multi-node launcher), so the command only adds what belongs
to this launch: the c10d rendezvous at the head node's address (accelerate's own default is a static
rendezvous, which cannot restart a group across nodes), its restarts, and the per-rank log files at
RUN_DIR/logs/ranks as torchrun's. Words the backend fills in per node (Slurm's head address, node
rank) are passed through as given.
"""

from __future__ import annotations

import sys
from pathlib import Path

LAUNCHERS = ("torchrun", "accelerate")
CONFIG = "accelerate_config.yaml"


def command(
    run_dir: Path,
    nproc_per_node: int,
    nnodes: int,
    program: list[str],
    endpoint: str | None = None,
    max_restarts: int = 0,
    python: str | None = None,
    machine_rank: str | None = None,
    rdzv_conf: str | None = None,
) -> list[str]:
    """`program`: SCRIPT ARGS or -m MODULE ARGS, as for torchrun.command. `endpoint` HOST:PORT of the
    rendezvous (multi-node; the words may be shell expressions the backend expands)."""
    run_dir = Path(run_dir)
    argv = [python or sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(run_dir / CONFIG)]
    argv += ["--num_machines", str(nnodes), "--num_processes", str(nnodes * nproc_per_node)]
    if nnodes > 1 or endpoint is not None:
        host, _, port = (endpoint or "").rpartition(":")
        argv += ["--rdzv_backend", "c10d", "--main_process_ip", host, "--main_process_port", port]
        if machine_rank is not None:
            argv += ["--machine_rank", machine_rank]
        if rdzv_conf:
            argv += ["--rdzv_conf", rdzv_conf]
    else:
        argv += ["--main_process_port", "0"]  # a free port, as torchrun --standalone finds one
    argv += ["--max_restarts", str(max_restarts), "--log_dir", str(run_dir / "logs" / "ranks"), "--tee", "3"]
    if program[0] == "-m":
        return argv + ["--module", *program[1:]]
    return argv + program
