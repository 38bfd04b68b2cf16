"""What activation memory lies outside the transformer blocks: the embedding- and head-side
saved tensors, the LM head's logits and the cross-entropy over them, whole or chunked (--loss
chunked, launcher/train/chunked_loss.py)."""

from __future__ import annotations

from launcher.memory.activations import dropout_rate, norm_bytes
from launcher.memory.constants import LOSS_CHUNK_TOKENS
from launcher.memory.states import lora_targets
from launcher.models.arch import ModelArch
from launcher.parallel.split import vocab_shards
from launcher.spec import TrainSpec


def edge_activations(arch: ModelArch, spec: TrainSpec, first: bool, last: bool) -> float:
    """Embedding-side and head-side saved tensors outside the blocks (without logits)."""
    e = 4 if spec.precision == "fp32" else 2
    T = spec.micro_batch * spec.seq_len
    out = 0.0
    if first:
        if arch.model_type == "bloom":  # word_embeddings_layernorm
            out += norm_bytes(arch, T, e, spec.method == "full")
        if dropout_rate(arch, "embd_pdrop", "embed_dropout") > 0:
            out += T * arch.hidden
    edges = lora_targets(arch, spec) if spec.trains_adapters else set()
    if first and "embed_tokens" in edges:
        out += T * spec.lora_r * e  # PEFT's embedding adapter: the A lookup, kept for B's gradient
    if last:
        out += norm_bytes(arch, T, e, spec.method == "full")
        head_adapter = "lm_head" in edges
        if spec.method == "full" or chunked_loss(spec) or head_adapter:
            # lm_head input, kept for its weight gradient (or its adapter's lora_A), or by the chunked
            # loss for its recompute
            out += T * arch.hidden * e
        if chunked_loss(spec):
            out += 8 * T  # the shifted labels (int64), kept for the recompute
        elif head_adapter:
            out += T * spec.lora_r * e  # lora_A's output, for lora_B's gradient
    return out


def chunked_loss(spec: TrainSpec) -> bool:
    """Whether the loss runs in more than one chunk (--loss chunked over more tokens than a chunk)."""
    return spec.loss == "chunked" and spec.micro_batch * spec.seq_len > LOSS_CHUNK_TOKENS


def logits_bytes(arch: ModelArch, spec: TrainSpec) -> float:
    """Peak of the LM head + cross-entropy: logits, their fp32 upcast and log-softmax, and the
    gradients flowing back through them.

    In transformers' ForCausalLMLoss the 16-bit logits are upcast to fp32 and log-softmax keeps
    its fp32 output; in backward the log-softmax output, its incoming gradient and its outgoing
    gradient (fp32 each) are alive together: 12 bytes per logit element, in 16-bit and fp32 alike.
    At pp 1 tp does not divide it: AutoTP's column-parallel head gathers its logits whole (a tied
    head, which AutoTP makes vocabulary-parallel, would split them; counted whole, conservatively).
    Inside pipeline stages the worker's head is vocabulary-parallel and so is its cross-entropy
    (launcher/parallel/tensor.py): each rank holds vocab / tp logits, with the same bytes each.

    --loss chunked (launcher/train/chunked_loss.py) recomputes the logits one chunk of
    LOSS_CHUNK_TOKENS rows at a time in backward: the same 12 bytes per logit of one chunk, plus
    what chunking adds -- the gradient of the head's input, one slice per chunk summed into a
    full-size buffer (2 x tokens x hidden), and for a trained head its weight gradient of the
    chunk before it is added to the others' (vocab x hidden; the summed one is in the gradients
    term). A micro-batch of one chunk or less runs the whole loss, unchanged. Measured on the CPU in tests/test_chunked_loss.py.
    """
    T = spec.micro_batch * spec.seq_len
    e = 4 if spec.precision == "fp32" else 2
    # soft-capped logits (gemma2: cap * tanh(logits / cap)): tanh keeps its output, per logit
    per_logit = 12.0 + (e if arch.hf_config.get("final_logit_softcapping") else 0)
    if not chunked_loss(spec):
        return per_logit * T * arch.vocab / vocab_shards(spec.tp, spec.pp)
    out = per_logit * LOSS_CHUNK_TOKENS * arch.vocab + 2.0 * T * arch.hidden * e
    if spec.method == "full":
        out += arch.vocab * arch.hidden * e
    return out
