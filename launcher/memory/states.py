"""Model states: weights, gradients, fp32 master weights and optimizer states, where they live.

Semantics are DeepSpeed's mixed precision (fp16/bf16): 16-bit weights and gradients on the GPU,
fp32 master weights, fp32 optimizer states and an fp32 copy of the gradient partition for the
optimizer step. `bf16-pure` keeps everything in bf16 (no master copy, torchtune/FSDP style),
`fp32` everything in fp32.

Differences from DeepSpeed's own estimate_zero2/3_model_states_mem_needs (checked in
tests/test_memory_states.py):
  * DeepSpeed counts every parameter as trainable; we count gradients, master weights and
    optimizer states for trainable parameters only (LoRA adapters), and weights by their
    storage dtype (NF4 / int8 base weights under QLoRA).
  * DeepSpeed multiplies CPU memory by a blanket 1.5 "additional_buffer_factor"; we count the
    offloaded states plus the pinned swap buffers DeepSpeed actually allocates.
  * ZeRO-3: DeepSpeed's 18 bytes/param omit the 16-bit gradient partition
    (grad_partitions_flat_buffer in stage3.py, 2 bytes/param/dp); we count it, and we count the
    fp32 gradient copy one optimizer sub-group at a time. Its 4 x largest-layer term is our
    gathered-parameter window (see `zero_buffers`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.errors import InvalidSpecError
from launcher.memory import constants as C
from launcher.memory.memo import ArchMemo
from launcher.models.arch import Linear, ModelArch
from launcher.parallel.split import vocab_shards
from launcher.spec import EDGE_TARGETS, TrainSpec


@dataclass(frozen=True)
class StageParams:
    """Parameters one GPU holds for its pipeline stage, after tensor parallelism (before ZeRO)."""

    quantizable: float  # weights of the block nn.Linear layers (what QLoRA quantises)
    other: float  # biases, norms, embeddings, LM head
    trainable: float  # parameters that get gradients and optimizer states
    adafactor_elems: float  # Adafactor's factored second-moment elements for the trainable ones
    largest_module: float  # largest single module ZeRO-3 gathers at once

    @property
    def total(self) -> float:
        return self.quantizable + self.other


def _shard(lin: Linear, tp: int) -> tuple[float, float, float]:
    """(fan_in, fan_out, bias) of one linear on one TP rank."""
    if lin.parallel == "column":
        return lin.fan_in, lin.fan_out / tp, (lin.fan_out / tp if lin.bias else 0)
    if lin.parallel == "row":
        return lin.fan_in / tp, lin.fan_out, (lin.fan_out if lin.bias else 0)
    return lin.fan_in, lin.fan_out, (lin.fan_out if lin.bias else 0)


def fused_experts(arch: ModelArch, lin: Linear) -> bool:
    """One of a mixture-of-experts block's fused 3-D expert weights (every expert in one tensor)."""
    return arch.experts > 1 and lin.count == arch.experts


def bare_parameter(arch: ModelArch, lin: Linear) -> bool:
    """This "linear" is a bare nn.Parameter, not an nn.Linear: the fused 3-D expert weights and
    the router of transformers >= 5 mixture-of-experts blocks. bitsandbytes quantises only
    nn.Linear, so QLoRA leaves these in the compute dtype; PEFT adapts them through the parameter
    (ParamWrapper), and every forward materialises W + scale * B @ A, kept for backward."""
    return fused_experts(arch, lin) or (arch.experts > 1 and lin.role == "router")


def lora_rank(arch: ModelArch, lin: Linear, r: int) -> int:
    """Rank of one adapter: PEFT's all-linear gives the fused gate+up expert weight 2r (its
    rank_pattern), so that gate and up each keep r."""
    return 2 * r if bare_parameter(arch, lin) and lin.name == "gate_up_proj" else r


def lora_targets(arch: ModelArch, spec: TrainSpec) -> set[str]:
    """Leaf names of the block linears LoRA adapts (`all-linear` is every block linear, as PEFT
    has it), and the EDGE_TARGETS named: embed_tokens, lm_head."""
    names = set(arch.linear_names())
    wanted = spec.lora_target_list()
    edges = {t for t in wanted if t in EDGE_TARGETS}
    if "all-linear" in wanted:
        if edges and arch.experts > 1:
            # PEFT reaches fused experts only from its own "all-linear" (or their v4 names), which
            # takes no additions: the worker cannot name that set plus the edges
            raise InvalidSpecError(
                f"--lora-targets all-linear with {','.join(sorted(edges))} on {arch.name} (mixture of experts): "
                f"name the block linears instead ({','.join(sorted(names))}) or drop {','.join(sorted(edges))}"
            )
        return names | edges
    unknown = [t for t in wanted if t not in names and t not in edges]
    if unknown:
        raise InvalidSpecError(
            f"--lora-targets {','.join(unknown)} matches no linear layer of {arch.name}; its linears are "
            f"{','.join(sorted(names))}, plus {' and '.join(EDGE_TARGETS)} (or use all-linear)"
        )
    return set(wanted)


def stage_params(arch: ModelArch, spec: TrainSpec, layers: int, first: bool, last: bool) -> StageParams:
    """Parameters one TP rank holds for a stage of `layers` blocks (memoised per arch)."""
    return _stage_params(arch, spec, spec.tp, layers, first, last)


def trainable_params(arch: ModelArch, spec: TrainSpec) -> float:
    """Trainable parameters of the whole model (no TP or PP split)."""
    return _stage_params(arch, spec, 1, arch.layers, True, True).trainable


_MEMO = ArchMemo()


def _stage_params(arch: ModelArch, spec: TrainSpec, tp: int, layers: int, first: bool, last: bool):
    # every TrainSpec field _count_stage_params reads is in the key
    key = (tp, spec.pp > 1, spec.method, spec.lora_r, spec.lora_targets, layers, first, last)
    return _MEMO.get(arch, key, lambda: _count_stage_params(arch, spec, tp, layers, first, last))


def _count_stage_params(
    arch: ModelArch, spec: TrainSpec, tp: int, layers: int, first: bool, last: bool
) -> StageParams:
    targets = lora_targets(arch, spec) if spec.trains_adapters else set()
    quantizable = other = trainable = ada = 0.0
    largest = experts_module = 0.0
    for lin in arch.linears:
        fin, fout, bias = _shard(lin, tp)
        if bare_parameter(arch, lin):
            other += layers * lin.count * fin * fout  # never quantised (see bare_parameter)
        else:
            quantizable += layers * lin.count * fin * fout
        other += layers * lin.count * bias
        largest = max(largest, lin.count * fin * fout)
        if fused_experts(arch, lin):
            experts_module += lin.count * fin * fout
        if spec.method == "full":
            trainable += layers * lin.count * (fin * fout + bias)
            ada += layers * lin.count * (fin + fout + bias)
        elif lin.name in targets:
            r = lora_rank(arch, lin, spec.lora_r)
            trainable += layers * lin.count * r * (fin + fout)
            ada += layers * lin.count * 2 * (r + (fin + fout) / 2)
    # transformers >= 5 keeps a block's experts in one module (both fused weights): gathered together
    largest = max(largest, experts_module)
    r, width = spec.lora_r, arch.embed_dim or arch.hidden
    for edge_target, held in (("embed_tokens", first), ("lm_head", last)):
        if held and edge_target in targets:  # PEFT's adapters: A (r x in) and B (out x r)
            trainable += r * (arch.vocab + width)
            ada += 2 * r + arch.vocab + width
    norms = layers * arch.layer_norm_params
    mats = []  # (rows, cols) of the vocabulary matrices this stage holds
    v = vocab_shards(tp, spec.pp)
    if first:
        mats.append((arch.vocab / v, width))
        largest = max(largest, arch.embed_matrix_params / v)
    if last and arch.lm_head_params:
        # DeepSpeed's AutoTP training splits an untied LM head by its output rows (column-parallel,
        # the logits gathered whole; measured on 2 CPU ranks). A tied head is counted whole: AutoTP
        # makes it and the embedding vocabulary-parallel only for the families it recognises.
        mats.append((arch.lm_head_params / width / tp, width))
    elif last and not first:
        mats.append((arch.vocab / v, width))  # tied head held again by the last pipeline stage
    mat_params = sum(r * c for r, c in mats)
    edge = mat_params + (arch.embedding_params - arch.embed_matrix_params if first else 0.0)
    edge += arch.final_norm_params if last else 0.0
    other += norms + edge
    if spec.method == "full":
        trainable += norms + edge
        # Adafactor factors every matrix (rows + cols values) and keeps 1-D params whole;
        # positions, norms and biases are kept whole
        ada += norms + sum(r + c for r, c in mats) + (edge - mat_params)
    return StageParams(quantizable, other, trainable, ada, largest)


def weight_bytes(spec: TrainSpec, p: StageParams) -> float:
    e = 4 if spec.precision == "fp32" else 2
    a = trained_bytes(spec)  # adapters
    if spec.method != "qlora":
        return p.total * e + (p.trainable * a if spec.trains_adapters else 0)
    per = C.NF4_BYTES_PER_PARAM if spec.quant == "nf4" else C.INT8_BYTES_PER_PARAM
    return p.quantizable * per + p.other * e + p.trainable * a


def trained_bytes(spec: TrainSpec) -> int:
    """Bytes per element of the trained parameters and their gradients: fp32 under fp32 and under
    bf16-autocast (fp32 adapters beside a bf16 base, no master copy), else the 16-bit dtype."""
    return 4 if spec.precision in ("fp32", "bf16-autocast") else 2


def mixed(spec: TrainSpec) -> bool:
    return spec.precision in ("fp16", "bf16")


def optimizer_bytes(spec: TrainSpec, p: StageParams) -> float:
    if spec.optimizer == "adamw":
        return p.trainable * (4 if spec.precision == "bf16-pure" else 8)
    if spec.optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        return p.trainable * C.ADAMW_8BIT_BYTES
    if spec.optimizer == "paged-adamw":
        return p.trainable * 8  # bitsandbytes' 32-bit states, whatever the parameters' dtype
    if spec.optimizer == "sgd":
        return p.trainable * (2 if spec.precision == "bf16-pure" else 4)
    if adafactor_flattened(spec):
        # DeepSpeed hands the optimizer flat 1-D partitions: nothing left to factor, one
        # second-moment value per element in the partition's dtype (seen in the trace)
        return p.trainable * (2 if spec.precision == "bf16-pure" else 4)
    return p.adafactor_elems * 4  # adafactor on the model's own matrices


def adafactor_flattened(spec: TrainSpec) -> bool:
    """DeepSpeed flattens parameters for mixed precision (fp16/bf16 optimizers) and for ZeRO
    partitions; only fp32 without ZeRO gives the client optimizer the model's matrices."""
    return spec.optimizer == "adafactor" and (spec.zero_stage >= 1 or mixed(spec) or spec.precision == "bf16-pure")


@dataclass(frozen=True)
class States:
    """Bytes per GPU (and what moved to host RAM / NVMe) for the model states of one stage."""

    weights: float
    grads: float  # 16-bit (or fp32) gradients of trainable params, after ZeRO-2/3 partitioning
    grads_persistent: bool  # a DeepSpeed buffer that exists for the whole step
    master: float
    optimizer: float
    fp32_grads: float  # fp32 gradient the optimizer steps on (mixed precision)
    fp32_grads_persistent: bool
    host: float  # offloaded states on host RAM (per rank)
    nvme: float  # offloaded states on NVMe (per rank)
    # ZeRO++ hpZ: this rank's secondary shards of the 16-bit weights, made as the backward releases
    # each module and dropped after the optimizer step (DeepSpeed's invalidate_secondary_tensor)
    secondary: float = 0.0


def in_backward_window(spec: TrainSpec, p: StageParams, dp: int, hidden: int) -> float:
    """Gradient bytes alive at once when the optimizer steps inside the backward
    (launcher/train/in_backward.py): on one rank the parameter being stepped; data parallel, the
    gradients waiting for their all-reduce, drained once they reach hidden² elements, so under
    that bucket plus the parameter that tips it. The largest module stands for the largest
    parameter (equal for dense models; a fused-experts module holds two)."""
    largest = min(p.largest_module, p.trainable)
    return (largest + (hidden * hidden if dp > 1 else 0)) * trained_bytes(spec)


def model_states(spec: TrainSpec, p: StageParams, dp: int, hidden: int = 0) -> States:
    """`hidden` sizes the in-backward all-reduce bucket (in_backward_window) when dp > 1."""
    stage = spec.zero_stage
    gbytes = trained_bytes(spec)
    weights = weight_bytes(spec, p)
    grads = p.trainable * gbytes
    if spec.optimizer_step == "in-backward":
        grads = min(grads, in_backward_window(spec, p, dp, hidden))
    master = p.trainable * 4 if mixed(spec) else 0.0
    opt = optimizer_bytes(spec, p)
    fp32g = p.trainable * 4 if mixed(spec) else 0.0
    # bf16 in a pipeline without ZeRO runs DeepSpeed's BF16_Optimizer: master weights and optimizer
    # states partitioned over the data-parallel ranks, the fp32 gradient buffer whole
    bf16_optimizer = stage == 0 and spec.precision == "bf16" and spec.pp > 1
    if stage >= 1 or bf16_optimizer:
        master, opt = master / dp, opt / dp
    if stage >= 1:
        fp32g /= dp
    if stage >= 2:
        grads /= dp
    secondary = 0.0
    if stage == 3:
        # QLoRA's NF4 constants are not parameters: every rank keeps its layers' whole
        consts = p.quantizable * (C.NF4_BYTES_PER_PARAM - 0.5) if spec.method == "qlora" and spec.quant == "nf4" else 0.0
        if spec.hpz > 1:
            secondary = (weights - consts) / spec.hpz
        weights = (weights - consts) / dp + consts
        fp32g = min(fp32g, 4 * C.STAGE3_SUB_GROUP_SIZE) if mixed(spec) else fp32g
    host = nvme = 0.0
    if spec.offload_optimizer != "none" and stage >= 2:
        # Reduced gradients go where the optimizer runs: stage 2 copies them straight into the
        # fp32 gradient buffer on the CPU (counted below); stage 3 keeps its 16-bit gradient
        # partition buffer in pinned host memory.
        if stage == 3:
            host += grads
        grads = 0.0
    # The fp32 gradient copy lives with the optimizer: a whole pinned partition under
    # ZeRO-1/2, one sub-group at a time under ZeRO-3 (as on the GPU).
    if spec.offload_optimizer == "cpu":
        host += master + opt + fp32g
        master = opt = fp32g = 0.0
    elif spec.offload_optimizer == "nvme":
        nvme += master + opt
        host += fp32g + C.NVME_OPTIMIZER_BUFFERS * 4
        master = opt = fp32g = 0.0
    if spec.offload_params == "cpu":
        host += weights
        weights = 0.0
    elif spec.offload_params == "nvme":
        nvme += weights
        host += C.NVME_PARAM_BUFFERS * 2
        weights = 0.0
    # Which gradient buffers exist during the forward/backward (not only at the step): ZeRO-3's
    # contiguous partition buffer (made once); BF16_Optimizer's fp32 gradient buffer; with
    # accumulation > 1 every gradient (ZeRO-2: its partition buffer) survives between
    # micro-batches. ZeRO-2 makes its partition buffer in each backward and frees it after the
    # step; what else lives around the step is launcher/memory/transients.py's.
    grads_persistent = stage == 3 or spec.grad_accum > 1
    fp32_persistent = bf16_optimizer
    return States(weights, grads, grads_persistent, master, opt, fp32g, fp32_persistent, host, nvme, secondary)


def zero_buffers(spec: TrainSpec, arch: ModelArch, p: StageParams) -> tuple[float, float]:
    """(gathered-parameter window while forward/backward run, communication buckets always)."""
    h2 = arch.hidden * arch.hidden
    e = 4 if spec.precision == "fp32" else 2
    if spec.zero_stage in (1, 2):
        return 0.0, C.REDUCE_BUCKETS_STAGE12 * h2 * e
    if spec.zero_stage == 3:
        # DeepSpeed's prefetch queue runs ahead of the compute (each fetch prefetches the next
        # not-yet-gathered parameters, gathered ones are skipped for free) until the gathered
        # parameters reach stage3_max_live_parameters; a module is always gathered whole, and
        # no more than the stage's parameters can be. Measured by the ZeRO-3 trace
        # (launcher/trace/zero3.py follows DeepSpeed's coordinator). Released by the optimizer
        # step; one reduce bucket stays. The limit counts the elements DeepSpeed holds: QLoRA's
        # NF4 weights are packed four to a 16-bit element, LLM.int8's are 1-byte elements.
        elems, nbytes = p.total, p.total * e
        if spec.method == "qlora":
            per = 0.25 if spec.quant == "nf4" else 1.0
            elems = p.quantizable * per + p.other
            nbytes = p.quantizable * per * (e if spec.quant == "nf4" else 1) + p.other * e
        window = max(p.largest_module, min(C.STAGE3_MAX_LIVE_PARAMETERS, elems))
        return window * nbytes / elems, h2 * e
    return 0.0, 0.0


def layers_per_stage(layers: int, pp: int) -> int:
    if pp > layers:
        raise InvalidSpecError(
            f"--pp {pp} is larger than the model's {layers} layers; use --pp {layers} or fewer"
        )
    return math.ceil(layers / pp)
