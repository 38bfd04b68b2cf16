"""The search space: every configuration the planner considers for one request.

Dimensions (a dimension the user pinned takes only the pinned value):
  sharding      ZeRO stage 0-3 with optimizer offload none/cpu/nvme (offload needs stage >= 1,
                NVMe needs stage 3) and parameter offload none/cpu/nvme (stage 3 only): 14 choices
  tp            divisors of the GPUs per node that divide the attention heads AND the KV heads
                (tensor parallelism stays inside a node). At pp 1, TP > 1 is DeepSpeed AutoTP, whose
                training support is ZeRO-0/1/2 (deepspeed.ai tutorials/autotp-training;
                deepspeedai/DeepSpeed#7147) on torch.nn.Linear weights, so not with ZeRO-3, LoRA or
                QLoRA; inside pipeline stages it is the worker's Megatron-style layers (3D: TP x PP
                x DP, ZeRO-1, full fine-tuning, the families of parallel/split.py TP_FAMILIES with
                heads, KV heads and vocabulary divisible by tp; launcher/spec.py
                tensor_parallel_conflict).
  hpz           ZeRO++ hierarchical partitioning for ZeRO-3 with the parameters on the GPU, on
                clusters of more than one node: off (1) or a secondary shard over the node's GPUs
                (the backward gathers inside the node; weights / GPUs-per-node more per GPU)
  pp            the degrees that divide world / tp, up to one block per stage, for
                the families with a stage adapter (launcher/parallel/split.py; others: 1); pp > 1
                runs on DeepSpeed's pipeline engine under ZeRO-1, stages placed pipe-major
  grad_ckpt     none, selective, full
  loss          full, chunked (the LM head + cross-entropy LOSS_CHUNK_TOKENS at a time, recomputed in
                backward: launcher/train/chunked_loss.py); chunked only at pp 1 and where a
                micro-batch holds more than one chunk, since below that it is the same loss
  optimizer_step after-backward, in-backward (each parameter stepped inside the backward and its
                gradient freed: launcher/train/in_backward.py); in-backward only where the spec
                allows it (full fine-tuning, ZeRO-0, tp 1, pp 1, fp32 / bf16-pure: spec.py
                in_backward_conflict) and only for the micro-batches that need no accumulation
  micro_batch   MICRO_BATCHES, with the accumulation that reaches the global batch exactly
                (dp = world / (tp x pp)); a (micro-batch, dp) that cannot reach it is not a candidate,
                unless no micro-batch can at this dp: then those that reach the nearest global batch
                this dp splits (noted on the plan; with --grad-accum pinned, none)

A `Group` is the candidates that differ only in micro-batch (and so accumulation): the search
walks a group from the smallest micro-batch up and stops where a lower bound proves the rest
cannot fit (see search.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from launcher.errors import InvalidSpecError
from launcher.memory import states as S
from launcher.memory.activations import selective_is_full
from launcher.memory.constants import LOSS_CHUNK_TOKENS
from launcher.memory.layout import check_parallelism, check_tp_in_node
from launcher.models.hf_families import packing_refusal
from launcher.parallel.split import PIPELINE_ZERO0, pipeline_refusal, tensor_parallel_refusal
from launcher.planner.constants import MICRO_BATCHES
from launcher.planner.plans import Request
from launcher.spec import (
    GRAD_CKPT,
    LOSSES,
    OPTIMIZER_STEPS,
    TrainSpec,
    deepspeed_conflict,
    in_backward_conflict,
    tensor_parallel_conflict,
)

# (zero_stage, offload_optimizer, offload_params), fewest moving parts first: the order breaks
# ties between plans of equal speed.
SHARDINGS = (
    (0, "none", "none"),
    (1, "none", "none"),
    (2, "none", "none"),
    (3, "none", "none"),
    (1, "cpu", "none"),
    (2, "cpu", "none"),
    (3, "cpu", "none"),
    (3, "none", "cpu"),
    (3, "cpu", "cpu"),
    (3, "nvme", "none"),
    (3, "nvme", "cpu"),
    (3, "none", "nvme"),
    (3, "cpu", "nvme"),
    (3, "nvme", "nvme"),
)
SHARDING_RANK = {s: i for i, s in enumerate(SHARDINGS)}
CKPT_RANK = {c: i for i, c in enumerate(GRAD_CKPT)}
LOSS_RANK = {c: i for i, c in enumerate(LOSSES)}
STEP_RANK = {c: i for i, c in enumerate(OPTIMIZER_STEPS)}


@dataclass(frozen=True)
class Group:
    """Candidates sharing everything but the micro-batch: (micro, accum, global batch) each."""

    spec: TrainSpec  # micro_batch / grad_accum are set per candidate
    dp: int
    batches: tuple[tuple[int, int, int], ...]


def effective_base(request: Request) -> tuple[TrainSpec, tuple[str, ...]]:
    """The user's choices adjusted to the GPU (bf16 becomes fp16 where the GPU has no bf16)."""
    base, gpu = request.base, request.cluster.gpu
    notes: tuple[str, ...] = ()
    if gpu.bf16:
        return base, notes
    if base.precision == "bf16":
        note = f"{gpu.name} has no bf16: planned with fp16 mixed precision (same memory, loss scaling)"
        return base.with_(precision="fp16"), (*notes, note)
    if base.precision in ("bf16-pure", "bf16-autocast"):
        raise InvalidSpecError(
            f"--precision {base.precision} needs bf16, which {gpu.name} lacks; use --precision fp16 or fp32"
        )
    return base, notes


def tp_degrees(request: Request) -> list[int]:
    arch, g = request.arch, request.cluster.gpus_per_node
    pinned = request.pinned.get("tp")
    if pinned is not None:
        check_tp_in_node(pinned, g)
        check_parallelism(arch, TrainSpec(tp=pinned), request.cluster.world_size)
        return [pinned]
    if arch.experts > 1:
        return [1]  # AutoTP cannot split fused experts (check_parallelism says why)
    return [t for t in range(1, g + 1) if g % t == 0 and arch.heads % t == 0 and arch.kv_heads % t == 0]


def hpz_degrees(request: Request, stage: int, params: str) -> list[int]:
    """1 (off), and the node's GPU count for ZeRO-3 without parameter offload across nodes."""
    pinned = request.pinned.get("hpz")
    if pinned is not None:
        return [pinned]
    g = request.cluster.gpus_per_node
    return [1, g] if stage == 3 and params == "none" and request.cluster.nodes > 1 and g > 1 else [1]


def _check_hpz(request: Request) -> None:
    pinned, g = request.pinned.get("hpz", 1), request.cluster.gpus_per_node
    if pinned > g or g % pinned:
        raise InvalidSpecError(
            f"--hpz {pinned}: hpZ's secondary shards stay inside a node of {g} GPUs; use --hpz {g} "
            f"(or a divisor of {g})"
        )


def pp_degrees(request: Request, tp: int) -> list[int]:
    layers, rest = request.arch.layers, request.cluster.world_size // tp
    pinned = request.pinned.get("pp")
    if pinned is not None:
        if request.cluster.world_size % (tp * pinned):
            return []  # this TP degree does not combine with the pinned PP; others may
        check_parallelism(request.arch, TrainSpec(tp=tp, pp=pinned), request.cluster.world_size)
        arch = request.arch
        why = pipeline_refusal(arch.model_type, arch.name, arch.hf_config.get("alibi", False)) if pinned > 1 else None
        if why is not None:
            raise InvalidSpecError(f"--pp {pinned}: {why}")
        why = _stage_tp_refusal(arch, tp) if pinned > 1 else None
        if why is not None:
            if "tp" in request.pinned:
                raise InvalidSpecError(f"--tp {tp} with --pp {pinned}: {arch.name} {why}; use --tp 1 or --pp 1")
            return []  # other TP degrees may split it
        return [pinned]
    # Unpinned: every degree that divides the GPUs left by TP, up to a block per stage, for
    # a model the worker can pipeline (the others stay at pp 1 without a word: ZeRO shards them)
    arch = request.arch
    if pipeline_refusal(arch.model_type, arch.name, arch.hf_config.get("alibi", False)) is not None:
        return [1]
    if _stage_tp_refusal(arch, tp) is not None:
        return [1]
    return [p for p in range(1, min(layers, rest) + 1) if rest % p == 0]


def _stage_tp_refusal(arch, tp: int) -> str | None:
    """Why the worker's tensor-parallel layers cannot split this model's stages over `tp` ranks."""
    return tensor_parallel_refusal(arch.model_type, arch.heads, arch.kv_heads, arch.vocab, tp)


def _pinned_spec(request: Request, base: TrainSpec) -> None:
    """Raise TrainSpec's own error when the pins contradict each other (e.g. --pp 2 with
    --offload-params cpu), taking the unpinned stage as the lowest the pinned offloads allow;
    likewise for a pinned --tp that AutoTP cannot train."""
    _check_hpz(request)
    why = packing_refusal(request.arch.model_type) if base.packing else None
    if why is not None:
        raise InvalidSpecError(f"--packing: {why}")
    pins = dict(request.pinned)
    if "zero_stage" not in pins:
        needs3 = (
            pins.get("offload_params", "none") != "none"
            or pins.get("offload_optimizer") == "nvme"
            or pins.get("hpz", 1) > 1
        )
        pins["zero_stage"] = 3 if needs3 else 1 if pins.get("offload_optimizer", "none") != "none" else 0
    try:
        spec = base.with_(**pins)
    except InvalidSpecError as err:
        if "zero_stage" in request.pinned:
            raise
        given = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in request.pins)
        needed = f" (ZeRO-{pins['zero_stage']} needed)" if pins["zero_stage"] else ""
        raise InvalidSpecError(f"{given} cannot be combined{needed}: {err}") from None
    why = tensor_parallel_conflict(spec)
    if why is not None:
        raise InvalidSpecError(
            f"--tp {pins['tp']} with this configuration: {why}; drop --tp or change the rest"
        )
    why = deepspeed_conflict(spec)
    if why is not None and "zero_stage" in request.pinned:
        # unless the step in backward (searched where the rest allows it) is what runs it
        if "optimizer_step" in request.pinned or in_backward_conflict(spec) is not None:
            raise InvalidSpecError(why)
    if request.pinned.get("zero_stage") == 0 and spec.pp > 1:
        raise InvalidSpecError(f"--pp {spec.pp} with --zero-stage 0: {PIPELINE_ZERO0}; use --zero-stage 1")


def _batches(request: Request, dp: int) -> tuple[tuple[int, int, int], ...]:
    pins = request.pinned
    micros = (pins["micro_batch"],) if "micro_batch" in pins else MICRO_BATCHES
    accum_pin = pins.get("grad_accum")
    gb = request.resolved_global_batch()
    out = []
    for micro in micros:
        if gb is None:
            out.append((micro, accum_pin, micro * dp * accum_pin))
        elif gb % (micro * dp) == 0:
            accum = gb // (micro * dp)
            if accum_pin is None or accum == accum_pin:
                out.append((micro, accum, gb))
    if out or gb is None or accum_pin is not None:
        return tuple(out)
    # no micro-batch splits the global batch over this data-parallel degree (e.g. 2048 over the
    # 384 ranks of ZeRO-3 on 48 nodes): the nearest global batch it can split, which the plan
    # shows beside the one asked for (Plan.batch_note)
    reach = [m * dp * max(1, round(gb / (m * dp))) for m in micros]
    near = min(reach, key=lambda g: (abs(g - gb), g))
    return tuple((m, near // (m * dp), near) for m in micros if near % (m * dp) == 0)


def groups(request: Request, base: TrainSpec) -> Iterator[Group]:
    """Every group of the space, in a fixed order (sharding, tp, pp, recompute)."""
    _pinned_spec(request, base)
    pins = request.pinned
    shardings = [
        s
        for s in SHARDINGS
        if pins.get("zero_stage", s[0]) == s[0]
        and pins.get("offload_optimizer", s[1]) == s[1]
        and pins.get("offload_params", s[2]) == s[2]
    ]
    ckpts = (pins["grad_ckpt"],) if "grad_ckpt" in pins else GRAD_CKPT
    if "grad_ckpt" not in pins:
        targets = S.lora_targets(request.arch, base) if base.trains_adapters else set()
        if selective_is_full(request.arch, base, targets):
            ckpts = tuple(c for c in ckpts if c != "selective")  # a duplicate of full: not offered
    world = request.cluster.world_size
    layouts = [(tp, pp) for tp in tp_degrees(request) for pp in pp_degrees(request, tp)]
    if not layouts:
        check_parallelism(request.arch, TrainSpec(pp=pins.get("pp", 1), tp=pins.get("tp", 1)), world)
    for stage, opt, params in shardings:
        for tp, pp in layouts:
            if pp > 1 and stage != 1:
                # ZeRO-1 only (launcher/parallel/split.py: PIPELINE_ZERO0)
                continue
            dp = world // (tp * pp)
            batches = _batches(request, dp)
            if not batches:
                continue
            for hpz, ckpt in ((h, c) for h in hpz_degrees(request, stage, params) for c in ckpts):
                for loss in _losses(request, pp, batches):
                    for step in _steps(request):
                        # in-backward: only the micro-batches that need no accumulation
                        members = tuple(b for b in batches if step == "after-backward" or b[1] in (1, None))
                        try:
                            spec = base.with_(
                                zero_stage=stage,
                                offload_optimizer=opt,
                                offload_params=params,
                                tp=tp,
                                pp=pp,
                                grad_ckpt=ckpt,
                                loss=loss,
                                optimizer_step=step,
                                hpz=hpz,
                            )
                        except InvalidSpecError:
                            continue  # e.g. an 8-bit optimizer cannot be offloaded
                        if members and tensor_parallel_conflict(spec) is None and deepspeed_conflict(spec) is None:
                            yield Group(spec, dp, members)


def _steps(request: Request) -> tuple[str, ...]:
    """after-backward, and in-backward where this request's fixed choices allow it (the layout
    and accumulation are checked per candidate by TrainSpec)."""
    if "optimizer_step" in request.pinned:
        return (request.pinned["optimizer_step"],)
    probe = request.base.with_(zero_stage=0, tp=1, pp=1, grad_accum=1)
    return OPTIMIZER_STEPS if in_backward_conflict(probe) is None else OPTIMIZER_STEPS[:1]


def _losses(request: Request, pp: int, batches) -> tuple[str, ...]:
    if "loss" in request.pinned:
        return (request.pinned["loss"],)
    if pp > 1 or max(micro for micro, _, _ in batches) * request.base.seq_len <= LOSS_CHUNK_TOKENS:
        return ("full",)
    return LOSSES


def unreachable_batch_error(request: Request) -> InvalidSpecError:
    """The error when no (micro-batch, data-parallel) pair reaches the requested global batch."""
    world = request.cluster.world_size
    tps = tp_degrees(request)
    dps = sorted({world // (tp * pp) for tp in tps for pp in pp_degrees(request, tp)})
    gb = request.resolved_global_batch()
    what = f"--global-batch {gb}" if request.global_batch is not None else f"the global batch {gb}"
    pins = request.pinned
    step = min(dps) * pins.get("micro_batch", 1) * pins.get("grad_accum", 1)
    fixed = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in request.pins) or "nothing pinned"
    return InvalidSpecError(
        f"{what} cannot be split as micro-batch x data-parallel x accumulation on {world} GPUs "
        f"(data-parallel degrees possible: {', '.join(map(str, dps))}; {fixed}); use a multiple of {step}"
    )
