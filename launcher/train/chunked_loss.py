"""The chunked cross-entropy (`--loss chunked`): the LM head and the loss run a chunk of tokens at a
time, each chunk under non-reentrant activation checkpointing, so forward keeps no logits at all
and backward recomputes one chunk's logits at a time. The logits + loss working set shrinks from
the whole micro-batch's to one chunk's (launcher/memory/edges.py: logits_bytes) for one more
forward of the LM head (launcher/planner/perf.py).

The head is called as the module it is, so ZeRO-3 gathers its weight for each call (and its
recompute) and a LoRA adapter on it trains; the loss is transformers' causal-LM loss (next token,
fp32, mean over the labelled tokens), summed chunk by chunk and divided once.
"""

from __future__ import annotations

from launcher.memory.constants import LOSS_CHUNK_TOKENS

IGNORE = -100


def chunked_loss(head, hidden, labels, chunk_tokens: int = LOSS_CHUNK_TOKENS, logits_fn=None):
    """Mean next-token cross-entropy of `head(hidden)` against `labels`, `chunk_tokens` rows at a
    time. `logits_fn(logits)`: the family's post-processing of the logits (soft-capping), if any."""
    from torch.nn import functional as F
    from torch.utils.checkpoint import checkpoint

    shifted = F.pad(labels, (0, 1), value=IGNORE)[..., 1:].reshape(-1)
    rows = hidden.reshape(-1, hidden.shape[-1])

    def chunk_sum(h, y):
        logits = head(h)
        if logits_fn is not None:
            logits = logits_fn(logits)
        return F.cross_entropy(logits.float(), y, ignore_index=IGNORE, reduction="sum")

    if rows.shape[0] <= chunk_tokens:  # one chunk: nothing to save by recomputing it
        return chunk_sum(rows, shifted) / (shifted != IGNORE).sum().clamp(min=1)
    total = None
    for start in range(0, rows.shape[0], chunk_tokens):
        y = shifted[start : start + chunk_tokens]
        part = checkpoint(chunk_sum, rows[start : start + chunk_tokens], y, use_reentrant=False)
        total = part if total is None else total + part
    count = (shifted != IGNORE).sum()
    # all tokens unlabelled: 0 with a gradient path (transformers' mean would be nan)
    return total / count.clamp(min=1)


def _softcap(config):
    cap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(config, "logit_scale", None)
    if cap is None and scale is None:
        return None

    def post(logits):
        if scale is not None:
            logits = logits * scale
        if cap is not None:
            logits = (logits / cap).tanh() * cap
        return logits

    return post


def enable(lm, chunk_tokens: int = LOSS_CHUNK_TOKENS) -> None:
    """Make the causal LM `lm` (the transformers model, not a PEFT wrapper) compute its training
    loss chunked: a call with `labels` runs the decoder, then chunked_loss over its last hidden
    state, and returns an output with `.loss` and no logits. Calls without labels are unchanged."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    plain = lm.forward
    decoder = lm.base_model
    post = _softcap(lm.config)

    def forward(*args, labels=None, **kwargs):
        if labels is None:
            return plain(*args, **kwargs)
        kwargs.pop("logits_to_keep", None)
        kwargs.pop("num_items_in_batch", None)
        kwargs["return_dict"] = True
        out = decoder(*args, **kwargs)
        loss = chunked_loss(lm.get_output_embeddings(), out.last_hidden_state, labels, chunk_tokens, post)
        return CausalLMOutputWithPast(loss=loss, logits=None)

    lm.forward = forward
