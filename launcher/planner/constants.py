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

# The speed model's error band: the median |error| of its predicted tokens/s on the check rows of
# bench/data/published_speed.jsonl, published runs it was never fitted on (bench/speed_accuracy.py
# prints it; tests/test_speed_bench.py keeps this figure equal to what the bench computes). `ftlaunch
# plan` prints it beside each estimate. Ranking (planner/search.py): plans within the band of each
# other are ties, broken by fewer moving parts: each offload (optimizer, parameters; NVMe counts
# twice), ZeRO-3's per-layer gathers, tensor and pipeline parallelism, the chunked loss, the
# optimizer step in backward. A plan's tokens/s is discounted by the band once per moving part for
# the ranking (the figures printed stay the model's), so a plan with one more part must be faster
# by more than the band to win, one with k more by more than the band k times over: each of those
# terms is uncertain on its own (the offload terms have no calibration row at all).
SPEED_UNCERTAINTY = 0.108

# Micro-batches searched (sequences per GPU per forward/backward).
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)

# Hardware selection (`ftlaunch plan` without --gpus): counts tried per GPU type are 1, 2, 4, ...
# up to a node, then whole nodes up to this many (256 x 8-GPU nodes is beyond what one rents).
SELECT_MAX_NODES = 32
# After the smallest count that fits, this many further rungs of the ladder are planned too, and
# a larger count is shown when it is cheaper per token (e.g. no offload needed any more).
SELECT_EXTRA_RUNGS = 3

# --- Performance model ----------------------------------------------------------------------------

# Fitted (bench/speed_fit.py, on the calibration rows of bench/data/published_speed.jsonl only; the
# check rows are never used to fit and are reported apart by bench/speed_accuracy.py):
#   MATMUL_EFFICIENCY          fraction of the dense 16-bit peak large training matmuls reach on A100-
#                              class GPUs (the GEMM shape factor and the element-wise term come on top)
#   FAST_GPU_EFFICIENCY_RATIO  its ratio on GPUs whose 16-bit peak is FAST_GPU_PEAK_TFLOPS or more
#                              (H100, H200, B200, MI300X): their matmuls got faster than the rest
#   ELEMENTWISE_BYTES          HBM bytes per token, layer and unit of width (hidden + the MLP's
#                              intermediate) of the work between matmuls, forward and backward, 16-bit
#   ATTENTION_EFFICIENCY_RATIO fused attention kernels (flash, sdpa) against large GEMMs: the
#                              softmax between the two matmuls and the backward's recompute of the
#                              scores keep them below (FlashAttention-2 reports 50-73 % of peak
#                              forward, less backward)
#   OVERLAP                    fraction of a transfer that hides behind the compute it overlaps with
#   COMPILE_ELEMENTWISE_RATIO  the element-wise bytes left under --compile (torch.compile of each
#                              block: inductor fuses a norm, its scale and the residual add, or SiLU
#                              and the gate product, into one kernel that reads and writes once)
# What the fit says (2026-12, 16 calibration rows, mean |log error| 0.051, median 4.4 %): large
# GEMMs at 0.82 of peak (cuBLAS's large-matrix rate on A100 is ~0.9) once the GEMM shape factor and
# the work between matmuls are counted apart; H100-class GPUs at 0.94 of that; fused attention at
# 0.67 of the GEMM rate; ~100 bytes per token, layer and unit of width, of which compiled blocks
# leave 0.3 (fitted on torchtune's one compiled calibration row against its eager twin, 1.27x
# measured; its three compiled check rows land within 10 %); 51 % of a transfer hidden. The
# objective is flat along attention and overlap (they trade against the GEMM efficiency on these
# rows), so the fit starts from one fixed point (bench/speed_fit.py) and OVERLAP is the least
# determined.
MATMUL_EFFICIENCY = 0.822
FAST_GPU_PEAK_TFLOPS = 500
FAST_GPU_EFFICIENCY_RATIO = 0.94
ELEMENTWISE_BYTES = 100
ATTENTION_EFFICIENCY_RATIO = 0.673
OVERLAP = 0.51
COMPILE_ELEMENTWISE_RATIO = 0.3

# A matrix dimension d of a GEMM (tokens, fan-in, fan-out) reaches d / (d + GEMM_HALF_DIM) of the
# large-matrix rate: 128 x 128 output tiles and partial waves leave a 128-wide dimension ~half
# used (cuBLAS / CUTLASS tile sizes for 16-bit tensor cores); 4096 reaches 0.97.
GEMM_HALF_DIM = 128

# Eager attention materialises the scores: per score, forward writes them, the softmax reads and
# writes them (in fp32 for transformers' eager path), the value product reads them; backward reads
# them and writes their gradient, the softmax backward reads two and writes one. About 10 16-bit
# passes per score, forward and backward.
EAGER_SCORE_BYTES = 20.0

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


# Latency of one hop of a ring collective across nodes (NCCL's simple-protocol step over
# InfiniBand / RoCE: 5-10 us in nccl-tests' small-message rows); a ring all-gather or
# reduce-scatter over n ranks takes n - 1 hops. ZeRO-3 issues one per linear module and direction.
COLLECTIVE_HOP_LATENCY_S = 5e-6

# Fixed cost per optimizer step outside the modelled terms: the gradient-norm reduction for
# clipping, the loss copied to the host, logging, the next batch's host-to-device copy. Tens of
# milliseconds in DeepSpeed's engine; no published row has a step short enough to fit it.
STEP_OVERHEAD_S = 0.03

# Bytes moved per parameter by a GPU optimizer step (memory-bound fused AdamW: read + write fp32
# master, exp_avg, exp_avg_sq, read the fp32 gradient, write the 16-bit weight: 30 bytes). Used
# for every optimizer as an upper figure; the step is a small term next to compute.
GPU_OPTIMIZER_BYTES_PER_PARAM = 30

# DeepSpeed's CPU Adam (AVX-512, one OpenMP thread per core) streams each parameter's fp32 weight,
# gradient and two moments in and the weight and moments out, plus the 16-bit copy for the GPU:
# CPU_ADAM_BYTES_PER_PARAM. One core sustains ~10 GB/s of that stream (3e8 parameters/s); a node
# is capped at HOST_STREAM_FRACTION of its DRAM channels' theoretical bandwidth (STREAM triad on
# 2-socket servers reaches 60-80 %). hardware.py has each node type's cores and bandwidth;
# --cpu-cores states a node's cores.
CPU_ADAM_BYTES_PER_PARAM = 30
CPU_ADAM_PARAMS_PER_CORE = 3e8
HOST_STREAM_FRACTION = 0.6

# QLoRA: bitsandbytes dequantises every 4-bit weight to 16-bit each time it is used (forward,
# backward, recompute): read 0.5 byte + write 2 bytes per weight through HBM.
DEQUANT_BYTES_PER_PARAM = 2.5
