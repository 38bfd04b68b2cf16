"""Every constant the analytic memory model uses, in one place, each with where it comes from.

Where each comes from:
  * byte counts per element: the dtypes;
  * DeepSpeed buffer sizes and thresholds: what our emitter writes into ds_config.json
    (DeepSpeed's defaults where we keep them), read from DeepSpeed 0.19's source;
  * CALIBRATED AGAINST TRACES (`ftlaunch estimate --trace`, bench/accuracy.py): the terms a
    training step's tensors decide - 12 bytes per logit for the loss (edges.py), the
    ZeRO-3 window of STAGE3_MAX_LIVE_PARAMETERS gathered parameters, the tied-embedding
    gradient moment and the first block's backward moment (estimate.py), the
    selective-checkpointing matmul set, qk-norms, sdpa's math kernel (falcon-7b), eager's
    softmax dtype per family and unfused attention's backward working set, PEFT's merged
    expert weights and the expert-weight gradient moment (activations.py), Adafactor on flat
    partitions, PEFT's 2r rank for fused gate+up experts and ZeRO-3 gathering a block's experts
    as one module (states.py). The traces agree with the analytic model within
    0.5 % on the configurations of tests/test_trace.py and bench/;
  * EMPIRICAL: what no trace can see (the caching allocator's rounding, the CUDA context,
    NCCL's buffers, host RAM per process). Still literature values: bench/gpu_memory.py
    measures allocated vs reserved on the first GPU we get, which calibrates the margin.
"""

GIB = 1024**3

# --loss chunked (launcher/train/chunked_loss.py): tokens per chunk of the LM head + cross-entropy.
# 1024 rows keep the head's GEMM large (1024 x hidden x vocab) while a 128k vocabulary's working
# set drops from 12 B x tokens x vocab (5.9 GiB at 2 x 2048 tokens) to one chunk's (1.5 GiB).
LOSS_CHUNK_TOKENS = 1024

# Bytes per element of the storage dtypes.
BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}

# bitsandbytes NF4 (QLoRA): 4 bits per weight + one 8-bit absmax per 64-weight block, and with
# double quantisation one fp32 constant per 256 blocks (Dettmers et al. 2023, sec. 3):
# 0.5 + 1/64 + 4/(64*256) bytes per weight.
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)
# bitsandbytes LLM.int8: 1 byte per weight + one fp32 scale per output row (added per layer).
INT8_BYTES_PER_PARAM = 1.0

# Optimizer state bytes per trainable parameter (excluding fp32 master weights):
#   AdamW: exp_avg + exp_avg_sq in fp32 (8) or in bf16 under bf16-pure (4).
#   8-bit AdamW (bitsandbytes >= 0.45): two uint8 states + one fp32 absmax per 256-block each
#   (0.43 and older: per 2048-block); tensors under 4096 elements keep fp32 states, which under
#   ZeRO never happens (DeepSpeed hands the optimizer flat partitions). Measured on the CPU:
#   tests/test_memory_quantized.py.
#   SGD with momentum: one buffer.
#   Adafactor (HF defaults: no first moment, factored second moment) is computed per matrix
#   as rows + cols fp32 values, see states.py.
ADAMW_8BIT_BYTES = 2 + 2 * 4 / 256

# DeepSpeed ZeRO buffer sizes, in elements, as the emitter sets them ("auto" rule of the
# HF integration: reduce bucket = h*h, stage-3 prefetch bucket = 0.9*h*h, persistence
# threshold = 10*h). Stage 1/2 keep two reduce buckets (double buffering, contiguous grads).
REDUCE_BUCKETS_STAGE12 = 2
STAGE3_PREFETCH_FACTOR = 0.9
STAGE3_MAX_LIVE_PARAMETERS = 1_000_000_000
# Parameters smaller than this many x hidden stay gathered (stage3_param_persistence_threshold);
# a released parameter that is used again within this many elements stays gathered
# (stage3_max_reuse_distance, DeepSpeed's default, which ds_configs/zero3.json keeps).
STAGE3_PERSISTENCE_FACTOR = 10
STAGE3_MAX_REUSE_DISTANCE = 1_000_000_000
# Without ZeRO, DeepSpeed's engine all-reduces the gradients after the backward in buckets it
# flattens: tensors are added until a bucket passes this many elements (engine.py
# MEMORY_OPT_ALLREDUCE_SIZE; ds_config has no setting for it).
ALLREDUCE_BUCKET_ELEMENTS = 500_000_000
# DeepSpeed's stage-3 optimizer converts 16-bit gradient partitions to fp32 one sub-group at a
# time; the emitter sets sub_group_size to this many elements.
STAGE3_SUB_GROUP_SIZE = 1_000_000_000

# Host-side (CPU RAM) buffers of ZeRO-Infinity's NVMe swapper, per rank (aio defaults the
# emitter writes: buffer_count x buffer_size elements).
NVME_OPTIMIZER_BUFFERS = 4 * 100_000_000  # fp32 elements
NVME_PARAM_BUFFERS = 5 * 100_000_000  # 16-bit elements

# EMPIRICAL: the caching allocator reserves more than it hands out (block rounding,
# fragmentation between differently sized activations). Reserved = allocated * (1 + this),
# with at least ALLOCATOR_MARGIN_MIN_GIB. Typical training runs show 3-12 %: the estimate counts
# the middle, and the planner's default margin (planner/constants.py DEFAULT_MARGIN) keeps room
# for the top of that range (ALLOCATOR_MARGIN_HIGH).
ALLOCATOR_MARGIN_FRACTION = 0.08
ALLOCATOR_MARGIN_HIGH = 0.12
ALLOCATOR_MARGIN_MIN_GIB = 0.25

# EMPIRICAL: memory on the GPU that PyTorch's allocator does not see: the CUDA context and
# kernels (lazy loading, CUDA 12), cuBLAS/cuDNN handles, and NCCL's communicator buffers when
# there is more than one rank. Counts against the GPU, not in allocated/reserved.
CUDA_CONTEXT_GIB = 0.6
NCCL_BUFFERS_GIB = 0.5

# EMPIRICAL: host RAM each rank uses besides tensors it holds (Python, torch, CUDA host
# allocations, data loader, tokenizer).
HOST_BASELINE_PER_RANK_GIB = 3.0
