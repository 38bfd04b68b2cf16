"""The pipeline split, torch-free: which blocks each stage holds and which model families the
worker can pipeline. The memory model, the planner and the worker all use these, so the stage
a plan counts is the stage a rank trains."""

from __future__ import annotations

import math

# Families whose Hugging Face decoder layer takes (hidden, attention_mask, position_ids,
# position_embeddings) with rotary embeddings computed by the model: launcher/parallel/stages.py
PIPELINE_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3")
# Families whose checkpoints name every tensor as the model does, so a pipeline rank reads only
# its stage's tensors (launcher/train/weights.py); the others (Mixtral's per-expert tensors, which
# transformers fuses while loading) load whole on every rank, then free the other stages
STAGE_READ_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def stage_blocks(layers: int, pp: int) -> list[int]:
    """Blocks per stage: ceil(layers / pp) on every stage but the last, which keeps the rest and
    also holds the final norm, the LM head and the loss's logits."""
    per = math.ceil(layers / pp)
    return [per] * (pp - 1) + [layers - per * (pp - 1)]


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
