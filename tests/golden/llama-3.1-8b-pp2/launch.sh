#!/usr/bin/env bash
# Written by ftlaunch: the exact command the torchrun backend runs.
set -euo pipefail
RUN_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -f "$RUN_DIR"/logs/.rank_exit-*  # exit codes 75 / 2 of the last launch's ranks (backends/rank_exit.py)
[ -x <PYTHON> ] || { echo "launch.sh: "<PYTHON>" is not on $(hostname): run this where ftlaunch wrote it, or write the run again here (ftlaunch ... --name NAME --replan --dry-run)" >&2; exit 2; }
export FTLAUNCH_RUN_DIR="$RUN_DIR"
export FTLAUNCH_PLAN="$RUN_DIR"/plan.json
export FTLAUNCH_DS_CONFIG="$RUN_DIR"/ds_config.json
export FTLAUNCH_ACCELERATE_CONFIG="$RUN_DIR"/accelerate_config.yaml
exec <PYTHON> -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node 8 --max-restarts 2 --log-dir "$RUN_DIR"/logs/ranks --tee 3 -m launcher.train "$RUN_DIR"
