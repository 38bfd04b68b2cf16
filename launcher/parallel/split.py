"""The pipeline split, torch-free: which blocks each stage holds and which model families the
worker can pipeline. The memory model, the planner and the worker all use these, so the stage
a plan counts is the stage a rank trains."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

# Families whose Hugging Face decoder layer takes (hidden, attention_mask, position_ids,
# position_embeddings) with rotary embeddings computed by the model: launcher/parallel/stages.py
PIPELINE_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3")
# Families whose checkpoints name every tensor as the model does, so a pipeline rank reads only
# its stage's tensors (launcher/train/weights.py); the others (Mixtral's per-expert tensors, which
# transformers fuses while loading) load whole on every rank, then free the other stages
STAGE_READ_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def even_blocks(layers: int, pp: int) -> list[int]:
    """The split by layer count: layers // pp each, the remainder one more on the middle stages
    (the first holds the embeddings, the last the LM head)."""
    base, extra = divmod(layers, pp)
    order = [*range(1, pp - 1), 0, pp - 1] if pp > 2 else list(range(pp))
    blocks = [base] * pp
    for s in order[:extra]:
        blocks[s] += 1
    return blocks


def balanced_blocks(layers: int, pp: int, peak: Callable[[int, int], float], head_blocks: float) -> list[int]:
    """Blocks per stage that keep the largest stage peak lowest without slowing 1F1B down:
    `peak(stage, blocks)` is the memory model's peak of that stage (about affine in its blocks:
    each adds its weights, states and in-flight activations); no stage may take longer than the
    slowest of the layer-count split, the LM head counting as `head_blocks` blocks of compute on
    the last stage. One block each, then every further block to the stage it raises least among
    those with room (optimal for affine peaks); ties go to the earlier stage."""
    if pp == 1:
        return [layers]
    even = even_blocks(layers, pp)
    slowest = max(n + (head_blocks if s == pp - 1 else 0.0) for s, n in enumerate(even))
    cap = [max(1, math.floor(slowest - (head_blocks if s == pp - 1 else 0.0) + 1e-9)) for s in range(pp)]
    one = [peak(s, 1) for s in range(pp)]
    step = [max(peak(s, 2) - one[s], 1e-9) for s in range(pp)]
    blocks = [1] * pp
    heap = [(one[s] + step[s], s) for s in range(pp) if cap[s] > 1]
    heapq.heapify(heap)
    for _ in range(layers - pp):
        _, s = heapq.heappop(heap)
        blocks[s] += 1
        if blocks[s] < cap[s]:
            heapq.heappush(heap, (one[s] + blocks[s] * step[s], s))
    return blocks


def pipeline_refusal(model_type: str, tied_embeddings: bool, name: str) -> str | None:
    """Why the worker cannot pipeline this model (None if it can)."""
    if model_type not in PIPELINE_FAMILIES:
        return (
            f"{name} ({model_type}) has no pipeline stage adapter yet (pipelined families: "
            f"{', '.join(PIPELINE_FAMILIES)}); plan without --pp (ZeRO-3 shards the model instead)"
        )
    if tied_embeddings:
        return (
            f"{name} ties its LM head to its embeddings, which would sit on the first and the last "
            "stage; the worker does not keep them tied across stages yet; plan without --pp"
        )
    return None
