#!/usr/bin/env bash
# The main job, from a fresh clone: install ftlaunch, ask it how to fine-tune BLOOM-176B on one
# node of 8 A100s (full, LoRA, QLoRA), then run a real fine-tune of a tiny Llama on this machine's
# CPU: 2 ranks, DeepSpeed ZeRO-3 on the CPU accelerator, 30 steps, loss going down.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${PIP[@]}" torch==2.13.0           # the CPU build on this kind of machine; install it first
"${PIP[@]}" -e ".[train]"
FT=.venv/bin/ftlaunch

echo "== plan: full fine-tuning of bloom-176b on 8xA100"
$FT plan --model bloom-176b --gpus 8xA100 --top 3
echo; echo "== plan: LoRA";  $FT plan --model bloom-176b --gpus 8xA100 --method lora --top 3
echo; echo "== plan: QLoRA"; $FT plan --model bloom-176b --gpus 8xA100 --method qlora --top 3
echo; echo "== the run directory for the bloom plan (written, not started: no A100s here)"
$FT --model bloom-176b --gpus 8xA100 --dry-run --name bloom-176b-demo | tail -3

echo; echo "== a real fine-tune here: tiny Llama, 2 CPU ranks, ZeRO-3, 30 steps"
$FT --model tiny-llama --gpus 1x2xA100 --cpu --init random --zero-stage 3 --max-steps 30 --lr 1e-3 \
    --name "tiny-demo-$(date +%Y%m%d-%H%M%S)" | grep -E '^\[default0\]:\[ftlaunch\]|SUCCEEDED|FAILED|run directory'
