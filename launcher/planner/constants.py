"""Every assumption the planner makes, in one place, each with its source or its reasoning.

The memory side has its own constants (launcher/memory/constants.py); these are the search
defaults and the performance model's figures. Rates are per second; bandwidths in bytes/s are
derived from the GB/s figures of launcher/hardware.py (decimal, one direction).
"""

from __future__ import annotations

from launcher.memory.constants import ALLOCATOR_MARGIN_FRACTION, ALLOCATOR_MARGIN_HIGH

# --- Search defaults ------------------------------------------------------------------------------

# Fraction of each GPU's memory kept free on top of what the memory model counts. The estimate's
# GPU total already holds the caching allocator's reserve (ALLOCATOR_MARGIN_FRACTION of the peak
# allocated, the middle of the 3-12 % training runs show) and the CUDA context; the margin is the
# rest of that range: a plan within the budget still fits if its allocator reserves the top of it,
# allocated x (1 + ALLOCATOR_MARGIN_HIGH) + context <= memory, i.e.
# 1 - margin = (1 + ALLOCATOR_MARGIN_FRACTION) / (1 + ALLOCATOR_MARGIN_HIGH): 3.6 %. (Until
# 2026-12 it was a flat 5 % on top, which rejected axolotl's Yi-34B QLoRA on one RTX 4090, a run
# published at 97 % of the card: bench/recipes.py.) `--margin` overrides it.
DEFAULT_MARGIN = round(1 - (1 + ALLOCATOR_MARGIN_FRACTION) / (1 + ALLOCATOR_MARGIN_HIGH), 3)

# Default global batch when --global-batch is not given, in SEQUENCES (fine-tuning recipes state
# it in sequences, whatever their length), by method:
#   adapters (LoRA / QLoRA): 16. QLoRA's Guanaco runs used 16 (Dettmers et al. 2023, hyperparameter
#     table); LitGPT's config_hub LoRA / QLoRA recipes 8-16; torchtune's single-device LoRA
#     recipes 2 x 8-16 accumulation; axolotl's examples 2 x 4 per GPU.
#   full fine-tuning: 64. Llama-2-chat's SFT: 64 x 4096 (Touvron et al. 2023, sec. 3.1); Stanford
#     Alpaca and Vicuna: 128; torchtune's distributed full recipes: 2 per GPU.
# Rounded up to a multiple of the GPU count, so every data-parallel degree can reach it and every
# plan on one cluster trains the same batch (their tokens/s are comparable): one sequence per GPU
# on clusters larger than the default. (Until 2026-12 the default was 2^18 tokens, a pre-training
# figure: with a short --seq-len it asked for accumulation in the thousands.)
DEFAULT_GLOBAL_BATCH = {"full": 64, "lora": 16, "qlora": 16}

# Ranking (planner/search.py): a plan with more moving parts must be faster by more than the speed
# model's uncertainty to win. Moving parts: each offload (optimizer, parameters; NVMe counts twice),
# ZeRO-3's per-layer gathers, tensor and pipeline parallelism, the chunked loss. Each discounts a
# plan's tokens/s by SPEED_UNCERTAINTY for the ranking (the figures printed stay the model's): the
# speed model's error on the published rows it is checked against (bench/speed_accuracy.py:
# -1.1 %, +3.9 %, +6.8 %) is about 5 %, and the offload and communication terms, never checked
# against a measurement, are the least certain of its terms.
SPEED_UNCERTAINTY = 0.05

# Micro-batches searched (sequences per GPU per forward/backward).
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)

# Hardware selection (`ftlaunch plan` without --gpus): counts tried per GPU type are 1, 2, 4, ...
# up to a node, then whole nodes up to this many (256 x 8-GPU nodes is beyond what one rents).
SELECT_MAX_NODES = 32
# After the smallest count that fits, this many further rungs of the ladder are planned too, and
# a larger count is shown when it is cheaper per token (e.g. no offload needed any more).
SELECT_EXTRA_RUNGS = 3

# --- Performance model ----------------------------------------------------------------------------

# Fraction of the GPU's dense 16-bit peak the training matmuls reach (compute only; communication
# is modelled separately). From published throughput of eager PyTorch fine-tuning, checked by
# bench/speed_accuracy.py (bench/data/published_speed.jsonl, its "implied efficiency" column):
# torchtune's Llama-3.2-3B full fine-tune on one A100 (7,075 tokens/s, no compile) implies 0.506.
MATMUL_EFFICIENCY = 0.50
# GPUs whose 16-bit peak is this high (H100, H200, B200, MI300X) reach a smaller fraction of it: the
# matmuls got faster than everything around them (memory-bound element-wise ops, kernel launches,
# the Python between them). MosaicML's llm-foundry benchmarks ran one codebase on A100-80GB and
# H100-80GB: at the same model, sequence length and checkpointing the H100's MFU is 0.64-0.72 of the
# A100's (median 0.70 over eight pairs, 760M-30B), so the matmul efficiency is scaled by 0.70 there
# (0.35). torchtitan's Llama-3.1-8B FSDP rows on 500 W H100s imply 0.33-0.34. Measured for H100;
# taken for the other cards of this class, for which no like-for-like pair was at hand.
FAST_GPU_PEAK_TFLOPS = 500
FAST_GPU_EFFICIENCY_RATIO = 0.70

# Dense fp32 TFLOPS without tensor cores (datasheets). PyTorch does not use TF32 for matmuls by
# default (torch.backends.cuda.matmul.allow_tf32 = False since 1.12), so fp32 training runs here.
FP32_TFLOPS = {
    "A100-40GB": 19.5,
    "A100-80GB": 19.5,
    "H100-80GB": 67.0,
    "H100-PCIe": 51.0,
    "H100-96GB": 67.0,
    "H200": 67.0,
    "B200": 80.0,
    "V100-16GB": 15.7,
    "V100-32GB": 15.7,
    "A10": 31.2,
    "A10G": 31.2,
    "L4": 30.3,
    "T4": 8.1,
    "L40S": 91.6,
    "RTX3090": 35.6,
    "RTX4090": 82.6,
    "RTX-A6000": 38.7,
    "MI300X": 163.4,
}
# GPUs not in the table (a --gpu-memory variant keeps its name): datacenter cards run fp32 at
# 1/16 .. 1/8 of their 16-bit tensor rate; the lower end is taken.
FP32_FALLBACK_FRACTION = 1 / 16

# Causal attention with sdpa / flash skips the masked half of the score matrix; eager computes
# all of it.
CAUSAL_FRACTION = 0.5


# Fraction of a communication or transfer that hides behind the compute it can overlap with
# (DeepSpeed overlap_comm and stage-3 prefetching; async offload copies). Overlap is imperfect:
# collectives steal SMs and memory bandwidth, and prefetching stalls on the first layers.
OVERLAP = 0.5

# Bytes moved per parameter by a GPU optimizer step (memory-bound fused AdamW: read + write fp32
# master, exp_avg, exp_avg_sq, read the fp32 gradient, write the 16-bit weight: 30 bytes). Used
# for every optimizer as an upper figure; the step is a small term next to compute.
GPU_OPTIMIZER_BYTES_PER_PARAM = 30

# DeepSpeed's CPU Adam (AVX-512, multi-threaded) is bound by host memory bandwidth: ~30 bytes per
# parameter, and a 2-socket server sustains ~200 GB/s with all its cores busy, ~6.4 G params/s
# for 128 cores: 50 M params/s per core, taken per core so smaller VMs get their share.
CPU_ADAM_PARAMS_PER_CORE = 5e7

# QLoRA: bitsandbytes dequantises every 4-bit weight to 16-bit each time it is used (forward,
# backward, recompute): read 0.5 byte + write 2 bytes per weight through HBM.
DEQUANT_BYTES_PER_PARAM = 2.5
