"""The training options shared by `estimate`, `plan` and `launch`, validated once.

`TrainSpec` says HOW one configuration trains (method, precision, optimizer, batch, sharding);
what the model is lives in `models`, what the hardware is in `hardware`. Every check here is an
error a user can cause, so each raises `InvalidSpecError` with one line that says what to do.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

from launcher.errors import InvalidSpecError

METHODS = ("full", "lora", "qlora")
PRECISIONS = ("fp32", "fp16", "bf16", "bf16-pure", "bf16-autocast")
OPTIMIZERS = ("adamw", "adamw-8bit", "paged-adamw", "paged-adamw-8bit", "adafactor", "sgd")
# bitsandbytes' optimizers; the paged ones keep their states in CUDA unified memory, which the driver
# moves to host RAM when the GPU needs the room and back for the optimizer step
BNB_OPTIMIZERS = ("adamw-8bit", "paged-adamw", "paged-adamw-8bit")
PAGED_OPTIMIZERS = ("paged-adamw", "paged-adamw-8bit")
GRAD_CKPT = ("none", "selective", "full")
ATTENTION = ("eager", "sdpa", "flash")
OFFLOAD = ("none", "cpu", "nvme")
QUANT = ("nf4", "int8")
LOSSES = ("full", "chunked")
# when the optimizer steps: after the whole backward (every gradient alive at once), or inside it,
# each parameter as its gradient is complete, the gradient freed right after (torchtune's
# optimizer_in_bwd; launcher/train/in_backward.py)
OPTIMIZER_STEPS = ("after-backward", "in-backward")

DEFAULT_LORA_TARGETS = "all-linear"
# LoRA targets outside the blocks, by these names in every family (the worker finds the model's own
# input embedding and LM head modules): PEFT's Embedding and Linear adapters.
EDGE_TARGETS = ("embed_tokens", "lm_head")


@dataclass(frozen=True)
class TrainSpec:
    """One training configuration. Defaults are what a careful user would pick on modern GPUs."""

    method: str = "full"
    lora_r: int = 16
    lora_alpha: int = 32
    lora_targets: str = DEFAULT_LORA_TARGETS
    quant: str = "nf4"  # only used by qlora
    precision: str = "bf16"
    optimizer: str = "adamw"
    micro_batch: int = 1
    seq_len: int = 2048
    grad_accum: int = 1
    grad_ckpt: str = "none"
    attention: str = "sdpa"
    loss: str = "full"  # chunked: cross-entropy a chunk of tokens at a time (memory.constants.LOSS_CHUNK_TOKENS)
    optimizer_step: str = "after-backward"  # in-backward: OPTIMIZER_STEPS
    # samples concatenated into full rows, attention kept within each (launcher/train/packing.py)
    packing: bool = False
    # torch.compile of every transformer block (launcher/train/model.py compile_blocks): inductor
    # fuses the element-wise work between the matmuls
    compile: bool = False
    zero_stage: int = 0
    offload_optimizer: str = "none"
    offload_params: str = "none"
    tp: int = 1
    pp: int = 1
    # ZeRO++ hierarchical partitioning (DeepSpeed's zero_hpz_partition_size): ZeRO-3 keeps a second
    # copy of the 16-bit weights sharded over this many ranks (a node's GPUs), so the backward
    # gathers them inside the node instead of across the network; 1 = off
    hpz: int = 1

    def __post_init__(self) -> None:
        _choice("--method", self.method, METHODS)
        _choice("--precision", self.precision, PRECISIONS)
        _choice("--optimizer", self.optimizer, OPTIMIZERS)
        _choice("--grad-ckpt", self.grad_ckpt, GRAD_CKPT)
        _choice("--attention", self.attention, ATTENTION)
        _choice("--offload-optimizer", self.offload_optimizer, OFFLOAD)
        _choice("--offload-params", self.offload_params, OFFLOAD)
        _choice("--quant", self.quant, QUANT)
        _choice("--loss", self.loss, LOSSES)
        _choice("--optimizer-step", self.optimizer_step, OPTIMIZER_STEPS)
        for flag, value, hi in (
            ("--lora-r", self.lora_r, 65536),
            ("--lora-alpha", self.lora_alpha, 1 << 20),
            ("--micro-batch", self.micro_batch, 1 << 16),
            ("--seq-len", self.seq_len, 1 << 24),
            ("--grad-accum", self.grad_accum, 1 << 20),
            ("--tp", self.tp, 1024),
            ("--pp", self.pp, 4096),
            ("--hpz", self.hpz, 1024),
        ):
            _positive_int(flag, value, hi)
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise InvalidSpecError(f"--zero-stage must be 0, 1, 2 or 3, not {self.zero_stage!r}")
        if self.offload_params != "none" and self.zero_stage != 3:
            raise InvalidSpecError(
                f"--offload-params {self.offload_params} needs --zero-stage 3 "
                "(DeepSpeed offloads parameters only under ZeRO-3)"
            )
        if self.hpz > 1 and (self.zero_stage != 3 or self.offload_params != "none"):
            raise InvalidSpecError(
                f"--hpz {self.hpz} needs --zero-stage 3 with the parameters on the GPU (ZeRO++'s secondary "
                "weight shards live in GPU memory); use --zero-stage 3 without --offload-params, or drop --hpz"
            )
        if self.offload_optimizer != "none" and self.zero_stage == 0:
            raise InvalidSpecError(
                f"--offload-optimizer {self.offload_optimizer} needs --zero-stage 1, 2 or 3 (ZeRO-Offload)"
            )
        if self.offload_optimizer == "nvme" and self.zero_stage != 3:
            raise InvalidSpecError("--offload-optimizer nvme needs --zero-stage 3 (ZeRO-Infinity)")
        if self.offload_optimizer != "none" and self.optimizer not in ("adamw", "adafactor", "sgd"):
            raise InvalidSpecError(
                f"--optimizer {self.optimizer} cannot run offloaded (DeepSpeed's CPU optimizers are "
                "Adam, Adagrad, Lion); use --optimizer adamw with offload"
            )
        if self.method == "full" and self.lora_targets != DEFAULT_LORA_TARGETS:
            raise InvalidSpecError(
                "--lora-targets only applies to --method lora or qlora; drop it or pick a method"
            )
        if self.pp > 1 and self.zero_stage >= 2:
            raise InvalidSpecError(
                f"--pp {self.pp} with --zero-stage {self.zero_stage}: DeepSpeed pipeline parallelism "
                "works with ZeRO-0/1 only; use --zero-stage 1 or --pp 1"
            )
        if self.precision == "bf16-autocast":
            _autocast_fits(self)
        if self.loss == "chunked" and self.pp > 1:
            raise InvalidSpecError(
                f"--loss chunked with --pp {self.pp}: the chunked loss runs on the data-parallel engine, and "
                "DeepSpeed's pipeline engine hands the whole logits to its loss; use --pp 1 or --loss full"
            )
        if self.packing and self.pp > 1:
            raise InvalidSpecError(
                f"--packing with --pp {self.pp}: packed rows need per-sample position ids, and DeepSpeed's "
                "pipeline engine passes the token ids alone between stages; use --pp 1 or drop --packing"
            )
        why = compile_conflict(self) if self.compile else None
        if why is not None:
            raise InvalidSpecError(f"--compile {why}")
        if self.optimizer_step == "in-backward":
            why = in_backward_conflict(self)
            if why is not None:
                raise InvalidSpecError(f"--optimizer-step in-backward {why}")
        targets = [t for t in self.lora_targets.split(",") if t.strip()]
        edges = [t for t in targets if t in EDGE_TARGETS]
        if edges and self.pp > 1:
            raise InvalidSpecError(
                f"--lora-targets {','.join(edges)} with --pp {self.pp}: adapters on the embedding or LM head are "
                "trained at pp 1 only; use --pp 1 or adapt the block linears"
            )
        if not targets:
            raise InvalidSpecError(
                "--lora-targets is empty; pass module names like q_proj,v_proj or all-linear"
            )

    @property
    def trains_adapters(self) -> bool:
        return self.method in ("lora", "qlora")

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.micro_batch * self.seq_len

    def techniques(self) -> list[str]:
        """The memory techniques this configuration adds, as plans name them."""
        return [name for name, on in (
            ("chunked loss", self.loss == "chunked"),
            ("optimizer in backward", self.optimizer_step == "in-backward"),
        ) if on]

    def lora_target_list(self) -> list[str]:
        return [t.strip() for t in self.lora_targets.split(",") if t.strip()]

    def with_(self, **changes) -> TrainSpec:
        return replace(self, **changes)

    def base_model(self, **changes) -> TrainSpec:
        """The full-model configuration of the base an adapter is trained on (or merged into): its
        16-bit dtype, without the adapters' targets."""
        precision = "bf16" if self.precision == "bf16-autocast" else self.precision
        return replace(self, method="full", lora_targets=DEFAULT_LORA_TARGETS, precision=precision, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def tensor_parallel_conflict(spec: TrainSpec) -> str | None:
    """Why the worker cannot train this configuration with tensor parallelism, or None when it
    can (or tp is 1). At pp 1 the worker's TP is DeepSpeed AutoTP; inside pipeline stages it is
    ftlaunch's own Megatron-style layers (launcher/parallel/tensor.py; the model's family, heads
    and vocabulary: parallel/split.py tensor_parallel_refusal).

    Measured with the worker on DeepSpeed 0.19 (2 CPU ranks, gloo): AutoTP full fine-tuning trains;
    LoRA fails in deepspeed.initialize, because AutoTP also replaces the adapters' own nn.Linear
    layers (lora_A / lora_B, matched by their parent's name) and the optimizer's parameters are no
    longer the model's; a split lora_A would not meet its lora_B either.
    """
    if spec.tp == 1:
        return None
    if spec.pp > 1:
        if spec.method == "qlora":
            return (
                "the tensor-parallel layers inside pipeline stages cut the base weights, and bitsandbytes' packed "
                "4-bit weights cannot be cut"
            )
        return None
    if spec.method == "qlora":
        return "AutoTP cannot split bitsandbytes' packed 4-bit weights"
    if spec.method == "lora":
        return "AutoTP splits LoRA's own adapter layers too and DeepSpeed cannot train them"
    if spec.zero_stage == 3:
        return "AutoTP training supports ZeRO-0/1/2 only"
    return None


def uses_autotp(spec: TrainSpec) -> bool:
    """Whether DeepSpeed's AutoTP splits the model (tp > 1 at pp 1); its engine then counts a
    TP group's ranks in train_batch_size, the pipeline engine counts data-parallel ranks only."""
    return spec.tp > 1 and spec.pp == 1


def deepspeed_conflict(spec: TrainSpec) -> str | None:
    """Why DeepSpeed's engine cannot train this configuration although the memory model can count
    it (estimates of other trainers' recipes keep it), or None."""
    if spec.precision == "bf16-pure" and spec.zero_stage == 0 and spec.optimizer_step == "after-backward":
        return (
            "--precision bf16-pure needs --zero-stage 1 or more under DeepSpeed (its bf16 optimizer keeps master "
            "weights and states in bf16), or --optimizer-step in-backward at ZeRO-0"
        )
    return None


def compile_conflict(spec: TrainSpec) -> str | None:
    """Why the worker cannot torch.compile this configuration's blocks (the rest of the error line,
    with what to do), or None. The blocks are compiled on the data-parallel engine; the pipeline's
    stage modules and the tensor-parallel layers (AutoTP's, ftlaunch's own) put collectives inside
    the block, which the worker does not compile."""
    if spec.tp > 1 or spec.pp > 1:
        return (
            f"with --tp {spec.tp} --pp {spec.pp}: the worker compiles blocks on the data-parallel engine only "
            "(tensor and pipeline layers put collectives inside them); use --tp 1 --pp 1 or drop --compile"
        )
    return None


def in_backward_conflict(spec: TrainSpec) -> str | None:
    """Why the optimizer cannot step inside the backward for this configuration (the rest of the
    error line, with what to do), or None. Each parameter is stepped alone the moment its gradient
    is complete, so nothing may need every gradient first: no accumulation, no ZeRO partitioning
    (DeepSpeed owns the gradients and the step), no fp32 master copy or loss scaling."""
    if spec.method != "full":
        return (
            "frees each gradient as its parameter is stepped, which pays where gradients are as large as the "
            "model: use it with --method full (adapters' gradients are small)"
        )
    if spec.zero_stage != 0:
        return (
            f"with --zero-stage {spec.zero_stage}: under ZeRO DeepSpeed partitions the gradients and steps the "
            "optimizer itself; use --zero-stage 0"
        )
    if spec.tp > 1 or spec.pp > 1:
        return "runs on the data-parallel engine without tensor or pipeline parallelism; use --tp 1 --pp 1"
    if spec.grad_accum > 1:
        return (
            f"with --grad-accum {spec.grad_accum}: a gradient is freed as soon as it is applied, so it cannot "
            "accumulate over micro-batches; use --grad-accum 1 (a larger --micro-batch or more GPUs)"
        )
    if spec.precision not in ("fp32", "bf16-pure"):
        return (
            f"with --precision {spec.precision}: "
            + ("fp16 scales the loss and checks every gradient for overflow before any step"
               if spec.precision == "fp16" else "bf16 steps an fp32 master copy after the backward")
            + "; use --precision bf16-pure (torchtune's recipe) or fp32"
        )
    return None


def _autocast_fits(spec: TrainSpec) -> None:
    """--precision bf16-autocast is the adapters' recipe (PEFT + bitsandbytes): a 16-bit frozen
    base, fp32 adapters and optimizer states, matmuls in bf16 under DeepSpeed's torch_autocast."""
    if spec.method == "full":
        raise InvalidSpecError(
            "--precision bf16-autocast keeps the trained weights in fp32 beside a bf16 frozen base: it is for "
            "--method lora or qlora; full fine-tuning uses --precision bf16 (fp32 master copy) or bf16-pure"
        )
    if spec.pp > 1:
        raise InvalidSpecError(
            f"--precision bf16-autocast with --pp {spec.pp}: DeepSpeed's pipeline engine does not run torch_autocast; "
            "use --pp 1 or --precision bf16"
        )


def _choice(flag: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InvalidSpecError(f"{flag} must be one of {', '.join(allowed)}, not {value!r}")


def _positive_int(flag: str, value: object, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            raise InvalidSpecError(f"{flag} must be a whole number, not {value!r}")
        raise InvalidSpecError(f"{flag} must be a positive whole number, not {value!r}")
    if value < 1:
        raise InvalidSpecError(f"{flag} must be at least 1, not {value}")
    if value > hi:
        raise InvalidSpecError(f"{flag} {value} is implausibly large (at most {hi})")
