"""Which attention kernel runs for a family and a --attention choice: what the memory model
(activations.py: the s² scores of unfused kernels, packed rows' mask) and the speed model
(perf.py: the causal half, the fused kernels' efficiency) count, and what the worker asks
transformers for (train/model.py)."""

from __future__ import annotations

from launcher.models.arch import ModelArch
from launcher.spec import TrainSpec

EAGER_ONLY = {"bloom"}  # transformers implements only eager attention for these
# transformers refuses sdpa for these (gemma2: soft-capped attention scores); flash-attn runs them
EAGER_FOR_SDPA = {"gemma2"}


def sdpa_math_kernel(arch: ModelArch) -> bool:
    """Falcon's multi-query layout (falcon-7b) hands sdpa one K/V head against all query heads,
    without enable_gqa; the flash and memory-efficient kernels refuse unequal head counts, so
    sdpa runs its math kernel, on CUDA as on the CPU. (Falcon's newer layout broadcasts K/V to
    the query shape first and keeps the fused kernels.)"""
    return (
        arch.model_type == "falcon"
        and arch.kv_heads < arch.heads
        and not arch.hf_config.get("new_decoder_architecture", False)
    )


def attention_impl(arch: ModelArch, spec: TrainSpec) -> str:
    """What actually runs: eager, sdpa (a fused kernel), math (sdpa's unfused fallback) or flash."""
    if arch.model_type in EAGER_ONLY or (spec.attention == "sdpa" and arch.model_type in EAGER_FOR_SDPA):
        return "eager"
    if spec.attention == "sdpa" and sdpa_math_kernel(arch):
        return "math"
    return spec.attention


def unfused_attention(arch: ModelArch, spec: TrainSpec) -> bool:
    """Attention as separate matmuls and a softmax (eager, sdpa's math kernel): s²-sized scores,
    the full square computed, nothing a selective-checkpointing policy keeps."""
    return attention_impl(arch, spec) in ("eager", "math")


def masked_sdpa(arch: ModelArch, spec: TrainSpec) -> bool:
    """Packed rows under sdpa: the block-diagonal mask makes sdpa run its masked kernel (memory-
    efficient on CUDA) over the whole s x s square, where unmasked causal attention skips half."""
    return spec.packing and attention_impl(arch, spec) == "sdpa"
