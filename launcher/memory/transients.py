"""Gradient memory around DeepSpeed's optimizer step: the short-lived copies its engine makes as the
backward ends and while it steps, on top of the gradient buffers `states.model_states` counts.

Read from DeepSpeed 0.19's code and measured in its own engine on 2 CPU ranks, where model states
set the peak (tests/test_zero_memory.py, live bytes of every storage a step allocates):
  * ZeRO-0 flattens the gradients into all-reduce buckets after the backward (engine.py
    allreduce_no_retain: tensors are added until a bucket passes 5e8 elements, then it is flattened,
    all-reduced and copied back), even on one rank;
  * ZeRO-0 with fp16, or bf16 outside a pipeline, runs FP16_Optimizer (DeepSpeed's DDP_BFLOAT16, not
    BF16_Optimizer): at the step it casts every gradient to fp32, flattens the casts into the fp32
    gradient the master weights step on, then frees the 16-bit gradients: 2 + 4 + 4 bytes per
    parameter for a moment, and no fp32 gradient buffer during the backward;
  * ZeRO-1/2 copy each reduced gradient of the rank's partition into a partition buffer made in
    the backward and freed after the step; ZeRO-1 keeps the other gradients until the step. At the
    step they take the gradient norm one partition piece at a time in fp64 (8 bytes per element),
    then flatten the partition (a copy in the gradient dtype) and cast it to fp32;
  * ZeRO-3 flattens each sub-group of its gradient partition before casting it to fp32;
  * with the optimizer offloaded, ZeRO-1/2/3 take each piece's fp64 norm on the GPU in the
    backward before copying it to the host, and ZeRO-1/2 clone gradients larger than the reduce
    bucket (`offload_norm`; the LM head's is a moment of its own, estimate._head_backward);
  * tied embeddings: the LM head's and the embedding's gradients and their sum are alive at once
    as the backward ends (with accumulation also the earlier sum).
The busiest rank is counted (ZeRO-1/2 partitions differ by rank).
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.memory import constants as C
from launcher.memory import states as S
from launcher.models.arch import ModelArch
from launcher.spec import TrainSpec


@dataclass(frozen=True)
class GradientMoments:
    """All gradient bytes (persistent buffers included) at two moments of a step."""

    backward_end: float
    optimizer_step: float


def fp16_optimizer(spec: TrainSpec) -> bool:
    """DeepSpeed steps this configuration with FP16_Optimizer: no ZeRO and 16-bit mixed precision,
    except bf16 in a pipeline (BF16_Optimizer)."""
    return spec.zero_stage == 0 and (spec.precision == "fp16" or (spec.precision == "bf16" and spec.pp == 1))


def gradient_moments(
    arch: ModelArch, spec: TrainSpec, p: S.StageParams, st: S.States, dp: int, first: bool, last: bool
) -> GradientMoments:
    stage = spec.zero_stage
    gbytes = S.trained_bytes(spec)
    persistent = (st.grads if st.grads_persistent else 0.0) + (st.fp32_grads if st.fp32_grads_persistent else 0.0)
    grads = st.grads - (st.grads if st.grads_persistent else 0.0)  # made during this step
    fp32 = st.fp32_grads - (st.fp32_grads if st.fp32_grads_persistent else 0.0)
    largest = min(p.largest_module, p.trainable)  # the largest gradient (elements)
    part = p.trainable / dp  # a ZeRO-1/2/3 rank's partition
    tied = 0.0  # tied embeddings: the LM head's gradient waits for the embedding's, then both are summed
    if arch.tied_embeddings and spec.method == "full" and first and last:
        tied = arch.embed_matrix_params * (4 if spec.precision == "fp32" else 2) / spec.tp
    offload = spec.offload_optimizer != "none"
    if stage == 0:
        end = persistent + grads + 2 * tied
        if spec.optimizer_step != "in-backward" and spec.pp == 1:
            bucket = min(p.trainable, C.ALLREDUCE_BUCKET_ELEMENTS + largest) * gbytes
            end = persistent + grads + max(2 * tied, bucket)  # flattened after the backward, not during it
        step = persistent + grads + fp32
        if fp16_optimizer(spec):
            step += p.trainable * 4  # fp32 casts of every gradient, flattened into `fp32`
        return GradientMoments(end, step)
    norm = 8 * min(largest, part)  # fp64 copy of one partition piece
    if offload and stage in (1, 2):
        # each piece's norm and its copy to the host happen in the backward, and the copied
        # gradient is freed (ZeRO-1 keeps the other partitions'); the step runs on the host
        if stage == 1:
            grads -= min(grads, gbytes * part)
        arriving = largest * gbytes + offload_norm(arch, spec, largest, p.trainable, dp)
        return GradientMoments(persistent + grads + max(3 * tied, arriving), persistent + grads)
    if stage == 3:
        flat = 0.0 if offload else gbytes * min(part, C.STAGE3_SUB_GROUP_SIZE)
        return GradientMoments(persistent + grads + 3 * tied, persistent + grads + fp32 + flat)
    flat = gbytes * part
    if stage == 1:
        buffer = gbytes * part
        end = persistent + grads + _zero1_arrival(spec, tied, largest, part, persistent > 0)
        return GradientMoments(end, buffer + max(norm, fp32 + flat))
    # ZeRO-2: `grads` is the partition buffer; each gradient lives until it is reduced into it
    return GradientMoments(
        persistent + grads + max(3 * tied, largest * gbytes), persistent + grads + max(norm, fp32 + flat)
    )


def offload_norm(arch: ModelArch, spec: TrainSpec, elements: float, trainable: float, dp: int) -> float:
    """With the optimizer offloaded, what DeepSpeed makes on the GPU beside a gradient of `elements`
    as it arrives: the fp64 norm of the rank's piece of it (ZeRO-3: its partition, 1/dp; ZeRO-1/2:
    as much as the rank's partition holds), and under ZeRO-1/2 a clone of a gradient larger than
    the reduce bucket (hidden² elements), which replaces it."""
    if spec.offload_optimizer == "none" or spec.zero_stage == 0:
        return 0.0
    if spec.zero_stage == 3:  # in chunks of 2.5e8 elements (stage3.py _constant_buffered_norm2)
        return 8 * min(elements / dp, 2.5e8)
    clone = elements * S.trained_bytes(spec) if elements > arch.hidden * arch.hidden else 0.0
    return max(clone, 8 * min(elements, trainable / dp))


def _zero1_arrival(spec, tied: float, largest: float, part: float, accumulated: bool) -> float:
    """ZeRO-1: gradient bytes beyond every gradient of the step as the last one arrives. The rank's
    partition's gradients move into the partition buffer as they come, so only the one in flight is
    extra. With tied embeddings the LM head's and the embedding's gradients and their sum are alive
    beside the buffer on the ranks whose partition does not hold the embedding (3 gradient-sized
    tensors), and with accumulation also the embedding's earlier gradient (4): measured in
    DeepSpeed's engine (busiest rank) and in the trace."""
    if not tied:
        return min(largest, part) * S.trained_bytes(spec)
    return (3 + int(accumulated)) * tied
