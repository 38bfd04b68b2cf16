"""What DeepSpeed's pipeline engine holds on a stage beyond the model's own saved tensors
(deepspeed/runtime/pipe/engine.py, 0.19.8), per micro-batch in flight on the stage:

- a non-last stage keeps each micro-batch's output (the hidden states it sent on) in its output
  buffer until that micro-batch's backward;
- a non-first stage keeps the received hidden states until it has sent their gradient back, and
  runs its forward on a clone of them (both alive until the backward);
- the last stage keeps its output -- the logits, in the compute dtype -- in the output buffer
  too, and never frees it there: two buffers (the engine's minimum), so the logits of the
  previous micro-batch are still alive while the current one's loss runs backward. In a
  data-parallel step the 16-bit logits are gone by then (the loss keeps only fp32 tensors).

And the stage adapters (launcher/parallel/stages.py) compute the rotary embedding in every block,
where the whole model computes it once: its cos and sin (sequence x head_dim, shared by the
micro-batch's rows) are kept per block and micro-batch in flight, also under full recompute
(they are the checkpointed layer's inputs).

Measured on the CPU (tests/test_pipeline_memory.py): with these, each stage's activation peak
is within a few per cent of the model.
"""

from __future__ import annotations

from launcher.models.arch import ModelArch
from launcher.spec import TrainSpec

LAST_STAGE_OUTPUT_BUFFERS = 2  # TrainSchedule.num_pipe_buffers: max(2, micro-batches in flight)


def engine_buffers(
    arch: ModelArch, spec: TrainSpec, blocks: int, first: bool, last: bool, inflight: int
) -> tuple[float, float]:
    """(hidden-state and rotary bytes, logits bytes) a stage of `blocks` blocks holds beyond the
    model's saved tensors; (0, 0) at pp 1."""
    if spec.pp < 2:
        return 0.0, 0.0
    from launcher.parallel.split import STACKS, vocab_shards

    e = 4 if spec.precision == "fp32" else 2
    tokens = spec.micro_batch * spec.seq_len
    held = (0 if last else inflight) + (0 if first else 2 * inflight)
    stack = STACKS.get(arch.model_type)
    rotary = 2 * spec.seq_len * arch.head_dim * e * blocks * inflight if stack and stack.shared else 0.0
    logits = LAST_STAGE_OUTPUT_BUFFERS * tokens * arch.vocab / vocab_shards(spec.tp, spec.pp) * e if last else 0.0
    return held * tokens * arch.hidden * e + rotary, logits
