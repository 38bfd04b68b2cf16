#!/usr/bin/env bash
# The main job: install ftlaunch (planning needs no torch) and ask it how to fine-tune BLOOM-176B
# on one node of 8 A100s.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
FT=.venv/bin/ftlaunch
echo "== full fine-tuning of bloom-176b on 8xA100, ZeRO-3 with NVMe offload and full recompute"
$FT estimate --model bloom-176b --gpus 8xA100 --zero-stage 3 --offload-optimizer nvme --offload-params nvme --grad-ckpt full
if $FT plan --help >/dev/null 2>&1; then
  echo; echo "== what the planner picks"
  $FT plan --model bloom-176b --gpus 8xA100 || true
  echo; $FT plan --model bloom-176b --gpus 8xA100 --method lora || true
  echo; $FT plan --model bloom-176b --gpus 8xA100 --method qlora || true
fi
