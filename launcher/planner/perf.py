"""The performance model: step time and tokens/s of one configuration, with a breakdown.

Time per optimizer step on the slowest pipeline stage, each term in seconds (constants and their
sources in launcher/planner/constants.py; "exposed" = what overlap leaves on the critical path,
exposed(c, w) = c - OVERLAP x min(c, w) for a transfer c that can hide behind compute w):

  compute    training FLOPs at peak x matmul_efficiency (fp32: the non-tensor-core rate) x the
             GEMM shape factor of each linear (gemm_shape: every dimension d of its matrices -
             tokens per micro-batch, fan-in, fan-out after the TP split - reaches d / (d +
             GEMM_HALF_DIM) of the large-matrix rate: tiles and waves left part-empty). Per token
             and layer: linears 2·N forward; attention 4·s·d forward (half with causal sdpa/flash,
             whole again with packed rows' masked sdpa);
             backward twice the forward for full fine-tuning (6·N in all); LoRA skips the frozen
             weights' gradients (4·N) and adds 6·n per adapter parameter. The LM head (2·V·h) is
             not split by tensor parallelism (AutoTP), the blocks are.
  recompute  full: one more forward of every block; selective: the matmuls the per-op policy
             does not keep (activations.selective_matmuls: every other bias-free linear), and
             eager / math attention (only fused attention kernels' outputs are kept); the chunked
             loss: one more forward of the LM head (2·V·h per token).
  elementwise the memory-bound work between the matmuls (norms, activation functions, residual
             adds, rotary, dropout, eager attention's softmax over materialised scores) at HBM
             bandwidth: ELEMENTWISE_BYTES per token and layer per unit of width (hidden + the MLP's
             active intermediate per TP rank), EAGER_SCORE_BYTES per attention score; a recompute
             runs their forward share (a third) again. It is why small models and fast GPUs reach a
             smaller fraction of their peak. --compile: inductor fuses chains of them into one
             kernel each, COMPILE_ELEMENTWISE_RATIO of the bytes (the scores' passes stay).
  dequant    QLoRA: every 4-bit weight dequantised per use (forward, backward, recompute) at HBM
             bandwidth.
  tp_comm    per layer and micro-batch, 2 all-reduces forward + 2 backward (+2 in a full
             recompute) of tokens x hidden 16-bit values, ring 2(t-1)/t, over the intra-node link;
             not overlapped (on the critical path in Megatron-style TP).
  zero_comm  ring volumes (n-1)/n over the data-parallel group's bandwidth (see dp_bandwidth):
             ZeRO-0 all-reduces gradients once per step; ZeRO-1 reduce-scatters them once per step
             and all-gathers the updated weights; ZeRO-2 reduce-scatters every micro-batch (its
             gradients are partitioned) and all-gathers the weights once; ZeRO-3 all-gathers the
             weights in forward and in backward and reduce-scatters gradients every micro-batch,
             one collective per linear module and direction (DeepSpeed fetches per submodule; the
             emitted prefetch bucket, 0.9 h^2, and reduce bucket, h^2, are smaller than a block's
             large linears, so they group only the small ones), each paying the ring's latency
             (COLLECTIVE_HOP_LATENCY_S per hop, dp - 1 hops) on top of its bytes: at large dp and
             small micro-batches that floor no longer hides behind compute. ZeRO++ hpZ (--hpz N):
             the backward gathers from secondary shards over N ranks inside the node (its link,
             N - 1 hops) instead of across the data-parallel group.
             Gradient reduction and stage-3 gathers overlap with compute (exposed(), below), the
             post-step gather not.
  pp_comm    activations forward and their gradients backward between pipeline stages.
  pp_bubble  1F1B: a step takes (accumulation + pp - 1) micro-batch slots, pp - 1 of them idle.
  offload    PCIe: gradients down, updated weights up (optimizer offload), weights up in forward
             and backward (parameter offload); NVMe: optimizer states read and written every step,
             offloaded weights read per micro-batch and written per step, per node bandwidth; a
             paged optimizer's states that do not fit beside forward / backward, out and back.
  optimizer  GPU: memory-bound fused step; CPU (offload): CPU Adam over the node's ranks' shards,
             at the lower of its cores' rate (CPU_ADAM_PARAMS_PER_CORE x cores, --cpu-cores) and
             its memory bandwidth (CPU_ADAM_BYTES_PER_PARAM per parameter).
  overhead   a fixed cost per optimizer step (STEP_OVERHEAD_S: gradient-norm clipping's reduction,
             the loss read back to the host, logging, the next batch).

The efficiency constants are fitted on the calibration rows of bench/data/published_speed.jsonl
by bench/speed_fit.py; bench/speed_accuracy.py reports the check rows it never saw.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.gpus import GpuType
from launcher.hardware import ClusterSpec, NodeSpec
from launcher.memory import states as S
from launcher.memory.activations import selective_matmuls
from launcher.memory.attention import masked_sdpa, unfused_attention
from launcher.memory.edges import chunked_loss
from launcher.memory.estimate import estimate, stage_split
from launcher.models.arch import ModelArch
from launcher.parallel.split import vocab_shards
from launcher.planner import constants as C
from launcher.spec import PAGED_OPTIMIZERS, TrainSpec

TERMS = (
    "compute",
    "recompute",
    "elementwise",
    "dequant",
    "tp_comm",
    "zero_comm",
    "pp_comm",
    "pp_bubble",
    "offload",
    "optimizer",
    "overhead",
)


@dataclass(frozen=True)
class Perf:
    """Estimated speed of one plan; `breakdown` sums to `step_time_s`."""

    tokens_per_s: float
    step_time_s: float
    mfu: float  # model FLOPs (no recompute) per second over the peak of every GPU
    breakdown: dict[str, float]  # seconds per optimizer step, see TERMS

    def to_dict(self) -> dict:
        return {
            "tokens_per_s": round(self.tokens_per_s, 3),
            "step_time_s": round(self.step_time_s, 4),
            "mfu": round(self.mfu, 4),
            "breakdown_s": {k: round(v, 4) for k, v in self.breakdown.items()},
        }


def peak_flops(gpu: GpuType, precision: str) -> float:
    """Dense FLOP/s of one GPU in the precision the matmuls run in."""
    if precision == "fp32":
        tflops = C.FP32_TFLOPS.get(gpu.name, gpu.peak_bf16_tflops * C.FP32_FALLBACK_FRACTION)
        return tflops * 1e12
    return gpu.peak_bf16_tflops * 1e12


def matmul_efficiency(gpu: GpuType, precision: str) -> float:
    """Fraction of `peak_flops` large training matmuls reach on this GPU (constants.py says why)."""
    fast = precision != "fp32" and gpu.peak_bf16_tflops >= C.FAST_GPU_PEAK_TFLOPS
    return C.MATMUL_EFFICIENCY * (C.FAST_GPU_EFFICIENCY_RATIO if fast else 1.0)


def _shape(*dims: float) -> float:
    out = 1.0
    for d in dims:
        out *= d / (d + C.GEMM_HALF_DIM)
    return out


def gemm_shape(arch: ModelArch, tp: int, tokens: int) -> float:
    """The FLOP-weighted shape factor of one block's linears at `tokens` per micro-batch: each
    matrix dimension d (tokens, or the tokens routed to one expert; fan-in; fan-out, after the TP
    split) reaches d / (d + GEMM_HALF_DIM) of the large-matrix rate."""
    macs = slow = 0.0
    for lin in arch.linears:
        fused = S.fused_experts(arch, lin)
        m = tokens * arch.experts_per_token / arch.experts if fused else tokens
        k = lin.fan_in / tp if lin.parallel == "row" else lin.fan_in
        n = lin.fan_out / tp if lin.parallel == "column" else lin.fan_out
        work = (arch.experts_per_token if fused else lin.count) * lin.fan_in * lin.fan_out
        macs += work
        slow += work / _shape(max(m, 1.0), k, n)
    return macs / slow if slow else 1.0


def attention_efficiency(arch: ModelArch, spec: TrainSpec) -> float:
    """The attention scores' matmuls relative to large GEMMs: fused kernels (flash, sdpa's) reach
    ATTENTION_EFFICIENCY_RATIO of the GEMM rate; eager attention runs batched GEMMs of one head
    (sequence x head_dim x sequence), at their shape factor."""
    if unfused_attention(arch, spec):
        return _shape(spec.seq_len, arch.head_dim, spec.seq_len)
    return C.ATTENTION_EFFICIENCY_RATIO


def elementwise_bytes(arch: ModelArch, spec: TrainSpec) -> float:
    """HBM bytes per token of one block's memory-bound work, forward and backward (one TP rank)."""
    ffn = arch.ffn * arch.experts_per_token * (2 if arch.gated_mlp else 1)
    width = arch.hidden + ffn / spec.tp
    e = 4 if spec.precision == "fp32" else 2
    scores = arch.heads / spec.tp * spec.seq_len if unfused_attention(arch, spec) else 0.0
    fused = C.COMPILE_ELEMENTWISE_RATIO if spec.compile else 1.0
    return C.ELEMENTWISE_BYTES * fused * width * e / 2 + C.EAGER_SCORE_BYTES * scores * e / 2


@dataclass(frozen=True)
class TokenFlops:
    """FLOPs per token: one block (all layers alike; of which the attention scores' `attn_*`) and
    the LM head."""

    layer_train: float
    layer_recompute: float
    head_train: float
    head_recompute: float = 0.0
    attn_train: float = 0.0
    attn_recompute: float = 0.0


def token_flops(arch: ModelArch, spec: TrainSpec) -> TokenFlops:
    mm = lora = 0.0
    targets = S.lora_targets(arch, spec) if spec.trains_adapters else set()
    for lin in arch.linears:
        active = arch.experts_per_token if S.fused_experts(arch, lin) else lin.count
        mm += active * lin.fan_in * lin.fan_out
        if lin.name in targets:
            lora += active * spec.lora_r * (lin.fan_in + lin.fan_out)
    unfused = unfused_attention(arch, spec)
    causal = 1.0 if unfused or masked_sdpa(arch, spec) else C.CAUSAL_FRACTION
    attn = 4 * spec.seq_len * arch.heads * arch.head_dim * causal
    head = 2 * arch.vocab * arch.hidden
    if spec.method == "full":
        layer_train, head_train = 3 * (2 * mm + attn), 3 * head
    else:  # frozen weights: input gradients only; adapters forward + both gradients
        layer_train, head_train = 4 * mm + 3 * attn + 6 * lora, 2 * head
        width = arch.embed_dim or arch.hidden
        # adapters on the head (two matmuls) and the embedding (B's matmul; A is a lookup), per token
        head_train += 6 * spec.lora_r * ((arch.vocab + width) * ("lm_head" in targets) + width * ("embed_tokens" in targets))
    attn_recompute = attn if spec.grad_ckpt == "full" or (spec.grad_ckpt == "selective" and unfused) else 0.0
    if spec.grad_ckpt == "full":
        recompute = 2 * mm + attn + 2 * lora
    elif spec.grad_ckpt == "selective":  # the matmuls the policy does not keep, and the rest
        # (the policy keeps only fused attention kernels' outputs)
        recompute = 2 * sum(macs for kept, _, macs in selective_matmuls(arch, spec, targets) if not kept)
        recompute += attn_recompute
    else:
        recompute = 0.0
    # the chunked loss runs the head's forward again in backward, a chunk at a time
    return TokenFlops(layer_train, recompute, head_train, head if chunked_loss(spec) else 0.0, 3 * attn, attn_recompute)


def dp_bandwidth(cluster: ClusterSpec, tp: int, dp: int) -> float:
    """Bytes/s of one data-parallel group's ring (NCCL bus bandwidth).

    Ranks are laid out TP innermost, then DP, then PP (Megatron's order). A group inside one node
    runs at the intra-node link. A group spanning nodes with k ranks per node drives k NICs (NCCL
    spreads its rings over them): k x the per-GPU share of the node's network, as the node's other
    groups use the rest (for k = all GPUs of a node, the node's bandwidth: what nccl-tests shows
    as bus bandwidth across nodes).
    """
    g = cluster.gpus_per_node
    intra = cluster.gpu.intra_node_bandwidth_gbs * 1e9
    if tp * dp <= g:
        return intra
    k = max(1, g // tp)
    return min(intra, cluster.node.inter_node_bandwidth_gbs * 1e9 * k / g)


def cpu_adam_rate(node: NodeSpec) -> float:
    """Parameters per second DeepSpeed's CPU Adam updates on one node: its cores' rate, or its
    memory bandwidth (every parameter's fp32 state read and written), whichever is lower."""
    cores = C.CPU_ADAM_PARAMS_PER_CORE * node.cpu_cores
    memory = node.host_memory_bandwidth_gbs * 1e9 * C.HOST_STREAM_FRACTION / C.CPU_ADAM_BYTES_PER_PARAM
    return min(cores, memory)


def _exposed(comm: float, window: float) -> float:
    return comm - C.OVERLAP * min(comm, window)


def performance(arch: ModelArch, spec: TrainSpec, cluster: ClusterSpec, dp: int) -> Perf:
    """Estimated step time, tokens/s and MFU of `spec` on `cluster` with data-parallel degree dp."""
    gpu, node = cluster.gpu, cluster.node
    tp, pp, accum = spec.tp, spec.pp, spec.grad_accum
    e = 4 if spec.precision == "fp32" else 2
    tokens = spec.micro_batch * spec.seq_len  # per GPU per micro-batch
    rate = peak_flops(gpu, spec.precision) * matmul_efficiency(gpu, spec.precision)
    block_rate = rate * gemm_shape(arch, tp, tokens)
    # the LM head is split over the TP group (AutoTP: column-parallel; Megatron: vocabulary-parallel)
    head_rate = rate * _shape(tokens, arch.hidden, arch.vocab / tp) * tp
    f = token_flops(arch, spec)
    attn_rate = rate * attention_efficiency(arch, spec)

    def block_time(layer: float, attn: float) -> float:  # seconds per token of one block
        return ((layer - attn) / block_rate + attn / attn_rate) / tp

    if pp == 1:
        layers, with_head = arch.layers, True
        p = S.stage_params(arch, spec, arch.layers, True, True)
    else:
        # the slowest stage sets the pace of 1F1B; the largest one the ZeRO / offload traffic
        split = stage_split(arch, spec, cluster, dp)
        times = [
            n * block_time(f.layer_train, f.attn_train) + (f.head_train / head_rate if s == pp - 1 else 0.0)
            for s, n in enumerate(split)
        ]
        slow = max(range(pp), key=times.__getitem__)
        layers, with_head = split[slow], slow == pp - 1
        sizes = [S.stage_params(arch, spec, n, s == 0, s == pp - 1) for s, n in enumerate(split)]
        p = max(sizes, key=lambda q: q.total)
    head = f.head_train / head_rate if with_head else 0.0
    compute = tokens * (layers * block_time(f.layer_train, f.attn_train) + head)
    recompute = tokens * (
        layers * block_time(f.layer_recompute, f.attn_recompute) + (f.head_recompute / head_rate if with_head else 0.0)
    )
    hbm = gpu.hbm_bandwidth_gbs * 1e9
    again = {"none": 0.0, "selective": 1 / 6, "full": 1 / 3}[spec.grad_ckpt]
    elementwise = tokens * layers * elementwise_bytes(arch, spec) * (1 + again) / hbm
    window = compute + recompute + elementwise  # one micro-batch's compute, what transfers can hide behind

    dequant = 0.0
    if spec.method == "qlora":
        # base weights dequantised per use: forward, backward, and the recompute (selective:
        # about half of the linears)
        uses = 2 + {"none": 0.0, "selective": 0.5, "full": 1.0}[spec.grad_ckpt]
        dequant = uses * p.quantizable * C.DEQUANT_BYTES_PER_PARAM / hbm

    intra = gpu.intra_node_bandwidth_gbs * 1e9
    tp_comm = 0.0
    if tp > 1:
        n = 4 + (2 if spec.grad_ckpt == "full" else 0)
        tp_comm = layers * n * 2 * (tp - 1) / tp * tokens * arch.hidden * e / intra
        if with_head:  # the split head: its input's gradient all-reduced, and at pp 1 (AutoTP) its
            # logits gathered whole; the vocabulary-parallel loss inside pipeline stages keeps them split
            gathered = arch.vocab if vocab_shards(tp, pp) == 1 else 0
            tp_comm += (tp - 1) / tp * tokens * (gathered + 2 * arch.hidden) * e / intra

    pp_comm = 0.0
    if pp > 1:
        link = node.inter_node_bandwidth_gbs * 1e9 / cluster.gpus_per_node if cluster.nodes > 1 else intra
        pp_comm = 2 * tokens * arch.hidden * e / link

    # ZeRO collectives
    weights = S.weight_bytes(spec, p)  # 16-bit (or quantised) weights of this TP rank's stage
    grads = p.trainable * e
    zero_mb = zero_step = 0.0
    if dp > 1:
        bw = dp_bandwidth(cluster, tp, dp)
        ring = (dp - 1) / dp
        stage = spec.zero_stage
        if stage == 0:
            zero_step = _exposed(2 * ring * grads / bw, window)
        elif stage == 1:
            zero_step = _exposed(ring * grads / bw, window) + ring * grads / bw
        elif stage == 2:
            zero_mb = _exposed(ring * grads / bw, window)
            zero_step = ring * grads / bw
        else:
            # per linear module of each layer: gather forward, gather backward, reduce-scatter the
            # gradients; under hpZ the backward gathers from the secondary shards inside the node
            hops = 2 * (dp - 1)
            if spec.hpz > 1:
                back = (spec.hpz - 1) / spec.hpz * weights / intra
                hops += spec.hpz - 1
            else:
                back = ring * weights / bw
                hops += dp - 1
            latency = layers * len(arch.linears) * hops * C.COLLECTIVE_HOP_LATENCY_S
            zero_mb = _exposed(ring * (weights + grads) / bw + back + latency, window)

    # offload traffic and the optimizer step
    pcie = gpu.pcie_bandwidth_gbs * 1e9
    nvme_bw = node.nvme_bandwidth_gbs * 1e9
    ranks = min(cluster.world_size, cluster.gpus_per_node)
    shard = p.trainable / dp if spec.zero_stage >= 1 else p.trainable
    offload_mb = offload_step = 0.0
    if spec.offload_optimizer != "none":
        down = shard * e / pcie
        if spec.zero_stage >= 2:
            offload_mb += _exposed(down, window)
        else:
            offload_step += down
        offload_step += shard * e / pcie  # updated 16-bit weights back up
        optimizer = shard * ranks / cpu_adam_rate(node)
        if spec.offload_optimizer == "nvme":
            states = (p.trainable * 4 if S.mixed(spec) else 0.0) + S.optimizer_bytes(spec, p)
            offload_step += 2 * states / dp * ranks / nvme_bw  # read and write back every step
    else:
        optimizer = shard * C.GPU_OPTIMIZER_BYTES_PER_PARAM / (gpu.hbm_bandwidth_gbs * 1e9)
    if spec.optimizer in PAGED_OPTIMIZERS:
        # the states that do not fit beside forward / backward go out to host RAM and come back for
        # the step, over PCIe (the memory model says how much: paged_overflow)
        offload_step += 2 * estimate(arch, spec, cluster).paged_overflow / pcie
    if spec.offload_params != "none":
        fetch = 2 * weights / dp  # forward and backward, this rank's shard
        t = fetch / pcie
        if spec.offload_params == "nvme":
            t = max(t, fetch * ranks / nvme_bw)
            offload_step += weights / dp * ranks / nvme_bw  # updated weights written back
        offload_mb += _exposed(t, window)

    slot = compute + recompute + elementwise + dequant + tp_comm + pp_comm + zero_mb + offload_mb
    breakdown = {
        "compute": accum * compute,
        "recompute": accum * recompute,
        "elementwise": accum * elementwise,
        "dequant": accum * dequant,
        "tp_comm": accum * tp_comm,
        "zero_comm": accum * zero_mb + zero_step,
        "pp_comm": accum * pp_comm,
        "pp_bubble": (pp - 1) * slot,
        "offload": accum * offload_mb + offload_step,
        "optimizer": optimizer,
        "overhead": C.STEP_OVERHEAD_S,
    }
    step = sum(breakdown.values())
    tokens_per_step = tokens * dp * accum
    tokens_per_s = tokens_per_step / step
    model_flops = arch.layers * (f.layer_train) + f.head_train
    mfu = model_flops * tokens_per_s / (cluster.world_size * peak_flops(gpu, spec.precision))
    return Perf(tokens_per_s, step, mfu, breakdown)
