"""The pipeline split, torch-free: which blocks each stage holds and which model families the
worker can pipeline. The memory model, the planner and the worker all use these, so the stage
a plan counts is the stage a rank trains."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Stack:
    """Where a family's causal LM keeps what the pipeline stages run (module names as the
    checkpoint names them): `base` the decoder stack inside the LM, `embed` / `layers` / `norm`
    inside it, `head` the LM head inside the LM; `first` modules of the first stage besides the
    embedding (learned positions, an embedding norm, an input projection), `last` of the last
    stage besides norm and head, `shared` modules every stage runs (the rotary embedding: every
    block computes its own from the sequence)."""

    base: str
    embed: str = "embed_tokens"
    layers: str = "layers"
    norm: str = "norm"
    head: str = "lm_head"
    first: tuple[str, ...] = ()
    last: tuple[str, ...] = ()
    shared: tuple[str, ...] = ("rotary_emb",)

    def name(self, part: str) -> str:
        return f"{self.base}.{part}"


_ROTARY = Stack("model")
# The families launcher/parallel/stages.py pipelines, each with its modules' names
STACKS = {
    "llama": _ROTARY, "mistral": _ROTARY, "mixtral": _ROTARY, "qwen2": _ROTARY, "qwen3": _ROTARY,
    "gemma": _ROTARY, "stablelm": _ROTARY,
    "phi": Stack("model", norm="final_layernorm"),
    "gpt_neox": Stack("gpt_neox", embed="embed_in", norm="final_layer_norm"),
    "falcon": Stack("transformer", embed="word_embeddings", layers="h", norm="ln_f"),
    "gpt2": Stack("transformer", embed="wte", layers="h", norm="ln_f", first=("wpe",), shared=()),
    "bloom": Stack("transformer", embed="word_embeddings", layers="h", norm="ln_f",
                   first=("word_embeddings_layernorm",), shared=()),
    "opt": Stack("model.decoder", norm="final_layer_norm", first=("embed_positions", "project_in"),
                 last=("project_out",), shared=()),
}  # fmt: skip
PIPELINE_FAMILIES = tuple(STACKS)
# The families whose blocks launcher/parallel/tensor.py splits over a TP group inside pipeline stages
TP_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "bloom")
# Families whose checkpoints name every tensor as the model does and whose modules hold no buffer
# a checkpoint leaves out, so a pipeline rank reads only its stage's tensors
# (launcher/train/weights.py); the others (Mixtral's per-expert tensors, which transformers fuses
# while loading; Gemma's embedding scale; GPT-NeoX's `embed_out`, renamed `lm_head` while loading;
# OPT / GPT-2 / BLOOM / Falcon checkpoints saved under older prefixes) load whole on every rank, then
# free the other stages
STAGE_READ_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi", "stablelm")


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


# Measured with DeepSpeed 0.19.8: under its pipeline engine a bf16 "ZeRO-0" run steps through its
# BF16_Optimizer, which partitions the fp32 master weights and Adam states over the data-parallel
# group exactly as ZeRO-1 does, but writes only data-parallel rank 0's partition into the checkpoint
# and reads it back as a per-rank list (KeyError: 0): nothing it saves can be resumed.
PIPELINE_ZERO0 = (
    "the worker runs pipeline plans with ZeRO-1 (DeepSpeed's pipeline engine cannot resume its own "
    "ZeRO-0 bf16 checkpoints, and in bf16 its ZeRO-0 partitions the optimizer like ZeRO-1 anyway)"
)


def pipeline_refusal(model_type: str, name: str, alibi: bool = False) -> str | None:
    """Why the worker cannot pipeline this model (None if it can)."""
    if model_type not in STACKS:
        return (
            f"{name} ({model_type}) has no pipeline stage adapter yet (pipelined families: "
            f"{', '.join(PIPELINE_FAMILIES)}); plan without --pp (ZeRO-3 shards the model instead)"
        )
    if model_type == "falcon" and alibi:
        return (
            f"{name} is a Falcon with ALiBi, which the worker's Falcon stages do not build (they build "
            "rotary Falcons: falcon-7b, -40b, -180b); plan without --pp"
        )
    return None


def vocab_shards(tp: int, pp: int) -> int:
    """Over how many ranks the embedding, the LM head and the logits are split by vocabulary: the
    worker's TP layers inside pipeline stages split them over the TP group; at pp 1 AutoTP keeps
    the embedding and the logits whole (1)."""
    return tp if pp > 1 else 1


def tensor_parallel_refusal(model_type: str, heads: int, kv_heads: int, vocab: int, tp: int) -> str | None:
    """Why the worker cannot split this model over `tp` ranks inside pipeline stages (None if it
    can): the family's layers, and heads, KV heads and vocabulary dividing evenly."""
    if tp == 1:
        return None
    if model_type not in TP_FAMILIES:
        return (
            f"{model_type} has no tensor-parallel layers inside pipeline stages yet (families: "
            f"{', '.join(TP_FAMILIES)})"
        )
    for what, n in (("attention heads", heads), ("KV heads", kv_heads), ("vocabulary rows", vocab)):
        if n % tp:
            return f"its {n} {what} cannot be split evenly over tp {tp}"
    return None
