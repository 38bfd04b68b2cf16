"""One builder per architecture family: a Hugging Face config dict -> the exact module tree.

Every builder lists the linears of ONE transformer block under their Hugging Face leaf names,
and the block's norm parameters, embedding, final norm and LM head parameters, so that
`ModelArch.total_params` equals `sum(p.numel() for p in model.parameters())` of the
transformers model built from the same config (tests/test_models.py checks every catalog
entry). Missing keys take the defaults of the transformers config class of that model type.

Names follow the transformers >= 5 module tree. Mixture-of-experts blocks there hold their
experts as two fused 3-D parameters (`experts.gate_up_proj`, `experts.down_proj`) rather than
one nn.Linear per expert (w1/w2/w3 in transformers 4 and in the checkpoints); the router is
`gate`. PEFT reaches those through `target_parameters`, not `target_modules`.
"""

from __future__ import annotations

from collections.abc import Callable

from launcher.models.arch import Linear, ModelArch
from launcher.models.config_reader import ConfigReader

# num_key_value_heads when the key is absent (None = num_attention_heads); an explicit null
# in config.json always means num_attention_heads.
_KV_DEFAULTS = {"llama": None, "mistral": 8, "mixtral": 8, "qwen2": 32, "qwen3": 32, "gemma": 16, "gemma2": 4}
# head_dim when the key is absent (None = hidden_size // num_attention_heads).
_HEAD_DIM_DEFAULTS = {"qwen3": 128, "gemma": 256, "gemma2": 256}


def _attn(q: str, k: str, v: str, o: str, h: int, q_dim: int, kv_dim: int, qkv_bias: bool, o_bias: bool):
    return (
        Linear(q, h, q_dim, qkv_bias, "column", "qkv"),
        Linear(k, h, kv_dim, qkv_bias, "column", "qkv"),
        Linear(v, h, kv_dim, qkv_bias, "column", "qkv"),
        Linear(o, q_dim, h, o_bias, "row", "attn_out"),
    )


def _swiglu(h: int, ffn: int, bias: bool):
    return (
        Linear("gate_proj", h, ffn, bias, "column", "mlp_in"),
        Linear("up_proj", h, ffn, bias, "column", "mlp_in"),
        Linear("down_proj", ffn, h, bias, "row", "mlp_out"),
    )


def _mlp2(up: str, down: str, h: int, ffn: int, bias: bool):
    return (
        Linear(up, h, ffn, bias, "column", "mlp_in"),
        Linear(down, ffn, h, bias, "row", "mlp_out"),
    )


def _fused_block(qkv: str, out: str, up: str, down: str, h: int, qkv_dim: int, ffn: int, bias: bool):
    """Fused query_key_value + dense attention and a two-matrix MLP (bloom, falcon, gpt_neox)."""
    return (
        Linear(qkv, h, qkv_dim, bias, "column", "qkv"),
        Linear(out, h, h, bias, "row", "attn_out"),
    ) + _mlp2(up, down, h, ffn, bias)


# ---- Llama family: llama, mistral, mixtral, qwen2, qwen3, gemma, gemma2 (RMSNorm, SwiGLU/GeGLU) --
def llama_like(c: ConfigReader) -> ModelArch:
    mt = c.model_type
    h = c.num("hidden_size")
    layers = c.num("num_hidden_layers")
    heads = c.num("num_attention_heads")
    vocab = c.num("vocab_size")
    ffn = c.num("intermediate_size")
    kv = c.get("num_key_value_heads", default=_KV_DEFAULTS[mt]) or heads
    head_dim = c.get("head_dim", default=_HEAD_DIM_DEFAULTS.get(mt)) or c.heads_split(h, heads)
    q_dim, kv_dim = heads * head_dim, kv * head_dim

    if mt == "qwen2":
        qkv_bias, o_bias, mlp_bias = True, False, False
    elif mt in ("llama", "qwen3", "gemma", "gemma2"):
        qkv_bias = o_bias = c.flag("attention_bias", default=False)
        mlp_bias = mt == "llama" and c.flag("mlp_bias", default=False)
    else:  # mistral, mixtral
        qkv_bias = o_bias = mlp_bias = False
    linears = _attn("q_proj", "k_proj", "v_proj", "o_proj", h, q_dim, kv_dim, qkv_bias, o_bias)

    experts, per_token = 1, 1
    if mt == "mixtral":
        experts = c.num("num_local_experts", "num_experts", default=8)
        per_token = c.num("num_experts_per_tok", default=2)
        linears += (
            Linear("gate", h, experts, False, "replicated", "router"),
            Linear("gate_up_proj", h, 2 * ffn, False, "column", "mlp_in", count=experts),
            Linear("down_proj", ffn, h, False, "row", "mlp_out", count=experts),
        )
    else:
        linears += _swiglu(h, ffn, mlp_bias)

    norms = 2 * h + (2 * head_dim if mt == "qwen3" else 0)  # qwen3: q_norm, k_norm per head dim
    if mt == "gemma2":  # sandwich norms: also post_attention and pre/post_feedforward RMSNorms
        norms = 4 * h
    tied = c.tied()
    return c.arch(
        hidden=h, layers=layers, heads=heads, kv_heads=kv, head_dim=head_dim, ffn=ffn,
        gated_mlp=True, vocab=vocab, tied_embeddings=tied, norm="rmsnorm", linears=linears,
        layer_norm_params=norms, embedding_params=vocab * h, final_norm_params=h,
        lm_head_params=0 if tied else vocab * h, experts=experts, experts_per_token=per_token,
        max_positions=c.get("max_position_embeddings", default=0) or 0,
    )  # fmt: skip


# ---- Qwen (1.0) remote-code format: QWenLMHeadModel ------------------------------------------
def qwen(c: ConfigReader) -> ModelArch:
    h = c.num("hidden_size")
    layers = c.num("num_hidden_layers")
    heads = c.num("num_attention_heads")
    vocab = c.num("vocab_size")
    head_dim = c.num("kv_channels", default=128)
    proj = heads * head_dim
    ffn = c.num("intermediate_size") // 2  # config holds 2x the size of each of w1 / w2
    bias = not c.flag("no_bias", default=True)
    linears = (
        Linear("c_attn", h, 3 * proj, True, "column", "qkv"),
        Linear("c_proj", proj, h, bias, "row", "attn_out"),
        Linear("w1", h, ffn, bias, "column", "mlp_in"),
        Linear("w2", h, ffn, bias, "column", "mlp_in"),
        Linear("c_proj", ffn, h, bias, "row", "mlp_out"),
    )
    tied = c.tied()
    return c.arch(
        hidden=h, layers=layers, heads=heads, kv_heads=heads, head_dim=head_dim, ffn=ffn,
        gated_mlp=True, vocab=vocab, tied_embeddings=tied, norm="rmsnorm", linears=linears,
        layer_norm_params=2 * h, embedding_params=vocab * h, final_norm_params=h,
        lm_head_params=0 if tied else vocab * h,
        max_positions=c.get("max_position_embeddings", "seq_length", default=0) or 0,
    )  # fmt: skip


# ---- StableLM (LayerNorm, SwiGLU, partial rotary) --------------------------------------------
def stablelm(c: ConfigReader) -> ModelArch:
    h = c.num("hidden_size")
    layers = c.num("num_hidden_layers")
    heads = c.num("num_attention_heads")
    vocab = c.num("vocab_size")
    ffn = c.num("intermediate_size")
    kv = c.get("num_key_value_heads", default=32) or heads
    head_dim = c.heads_split(h, heads)  # transformers ignores any head_dim key here
    qkv_bias = c.flag("use_qkv_bias", default=False)
    linears = _attn("q_proj", "k_proj", "v_proj", "o_proj", h, h, kv * head_dim, qkv_bias, False)
    linears += _swiglu(h, ffn, False)
    norms = 2 * h if c.flag("use_parallel_residual", default=False) else 4 * h
    if c.flag("qk_layernorm", default=False):
        norms += (heads + kv) * head_dim  # one bias-free LayerNorm per head
    tied = c.tied()
    return c.arch(
        hidden=h, layers=layers, heads=heads, kv_heads=kv, head_dim=head_dim, ffn=ffn,
        gated_mlp=True, vocab=vocab, tied_embeddings=tied, norm="layernorm", linears=linears,
        layer_norm_params=norms, embedding_params=vocab * h, final_norm_params=2 * h,
        lm_head_params=0 if tied else vocab * h,
        max_positions=c.get("max_position_embeddings", default=4096) or 0,
    )  # fmt: skip


# ---- Phi (1, 1.5, 2): LayerNorm, parallel attention + GELU MLP, biased LM head ---------------
def phi(c: ConfigReader) -> ModelArch:
    h = c.num("hidden_size")
    layers = c.num("num_hidden_layers")
    heads = c.num("num_attention_heads")
    vocab = c.num("vocab_size")
    ffn = c.num("intermediate_size")
    kv = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or c.heads_split(h, heads)
    linears = _attn("q_proj", "k_proj", "v_proj", "dense", h, heads * head_dim, kv * head_dim, True, True)
    linears += _mlp2("fc1", "fc2", h, ffn, True)
    norms = 2 * h
    if c.flag("qk_layernorm", default=False):
        norms += 2 * 2 * (h // heads)
    tied = c.tied()
    return c.arch(
        hidden=h, layers=layers, heads=heads, kv_heads=kv, head_dim=head_dim, ffn=ffn,
        gated_mlp=False, vocab=vocab, tied_embeddings=tied, norm="layernorm", linears=linears,
        layer_norm_params=norms, embedding_params=vocab * h, final_norm_params=2 * h,
        lm_head_params=vocab + (0 if tied else vocab * h),  # the LM head has a bias
        max_positions=c.get("max_position_embeddings", default=2048) or 0,
    )  # fmt: skip


# ---- BLOOM: ALiBi, fused QKV, embedding LayerNorm, tied head ---------------------------------
def bloom(c: ConfigReader) -> ModelArch:
    h = c.num("hidden_size", "n_embed")
    layers = c.num("n_layer", "num_hidden_layers")
    heads = c.num("n_head", "num_attention_heads")
    vocab = c.num("vocab_size")
    head_dim = c.heads_split(h, heads)
    linears = _fused_block(
        "query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h", h, 3 * h, 4 * h, True
    )
    tied = c.tied()
    return c.arch(
        hidden=h, layers=layers, heads=heads, kv_heads=heads, head_dim=head_dim, ffn=4 * h,
        gated_mlp=False, vocab=vocab, tied_embeddings=tied, norm="layernorm", linears=linears,
        layer_norm_params=4 * h, embedding_params=vocab * h + 2 * h, final_norm_params=2 * h,
        lm_head_params=0 if tied else vocab * h,
        max_positions=c.get("seq_length", "max_position_embeddings", default=0) or 0,
    )  # fmt: skip


# ---- Falcon: 7b (multi-query, one LayerNorm) and the 40b/180b "new decoder architecture" ------
def falcon(c: ConfigReader) -> ModelArch:
    h = c.num("hidden_size", "n_embed")
    layers = c.num("num_hidden_layers", "n_layer")
    heads = c.num("num_attention_heads", "n_head")
    vocab = c.num("vocab_size")
    head_dim = c.heads_split(h, heads)
    new_arch = c.flag("new_decoder_architecture", default=c.get("model_type") == "RefinedWeb")
    multi_query = c.flag("multi_query", default=True)
    bias = c.flag("bias", default=False)
    if new_arch:
        kv = c.get("num_kv_heads", "n_head_kv") or heads
        qkv_dim = (2 * kv + heads) * head_dim
    elif multi_query:
        kv, qkv_dim = 1, h + 2 * head_dim
    else:
        kv, qkv_dim = heads, 3 * h
    ffn = c.get("ffn_hidden_size") or 4 * h
    linears = _fused_block(
        "query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h", h, qkv_dim, ffn, bias
    )
    n_ln = c.get("num_ln_in_parallel_attn")
    if n_ln is None and new_arch:
        n_ln = 2
    parallel = c.flag("parallel_attn", default=True)
    norms = 2 * (2 * h) if (not parallel or n_ln == 2) else 2 * h
    tied = c.tied()
    return c.arch(
        hidden=h, layers=layers, heads=heads, kv_heads=kv, head_dim=head_dim, ffn=ffn,
        gated_mlp=False, vocab=vocab, tied_embeddings=tied, norm="layernorm", linears=linears,
        layer_norm_params=norms, embedding_params=vocab * h, final_norm_params=2 * h,
        lm_head_params=0 if tied else vocab * h,
        max_positions=c.get("max_position_embeddings", default=2048) or 0,
    )  # fmt: skip


# ---- GPT-NeoX / Pythia: fused QKV, parallel residual, untied embed_out -----------------------
def gpt_neox(c: ConfigReader) -> ModelArch:
    h = c.num("hidden_size")
    layers = c.num("num_hidden_layers")
    heads = c.num("num_attention_heads")
    vocab = c.num("vocab_size")
    ffn = c.num("intermediate_size")
    head_dim = c.heads_split(h, heads)
    attn_bias = c.flag("attention_bias", default=True)
    linears = (
        Linear("query_key_value", h, 3 * h, attn_bias, "column", "qkv"),
        Linear("dense", h, h, attn_bias, "row", "attn_out"),
    ) + _mlp2("dense_h_to_4h", "dense_4h_to_h", h, ffn, True)
    tied = c.tied()
    return c.arch(
        hidden=h, layers=layers, heads=heads, kv_heads=heads, head_dim=head_dim, ffn=ffn,
        gated_mlp=False, vocab=vocab, tied_embeddings=tied, norm="layernorm", linears=linears,
        layer_norm_params=4 * h, embedding_params=vocab * h, final_norm_params=2 * h,
        lm_head_params=0 if tied else vocab * h,
        max_positions=c.get("max_position_embeddings", default=2048) or 0,
    )  # fmt: skip


# ---- OPT: learned positions (+2 offset), optional word-embedding projection ------------------
def opt(c: ConfigReader) -> ModelArch:
    h = c.num("hidden_size")
    layers = c.num("num_hidden_layers")
    heads = c.num("num_attention_heads")
    vocab = c.num("vocab_size")
    ffn = c.num("ffn_dim")
    max_pos = c.num("max_position_embeddings", default=2048)
    head_dim = c.heads_split(h, heads)
    emb_dim = c.get("word_embed_proj_dim") or h
    bias = c.flag("enable_bias", default=True)
    ln = 2 * h if c.flag("layer_norm_elementwise_affine", default=True) else 0
    linears = _attn("q_proj", "k_proj", "v_proj", "out_proj", h, h, h, bias, bias)
    linears += _mlp2("fc1", "fc2", h, ffn, bias)
    final_ln = c.flag("do_layer_norm_before", default=True) and not c.flag(
        "_remove_final_layer_norm", default=False
    )
    project = emb_dim * h if emb_dim != h else 0  # project_in (embedding side), project_out (head side)
    tied = c.tied()
    return c.arch(
        hidden=h, layers=layers, heads=heads, kv_heads=heads, head_dim=head_dim, ffn=ffn,
        gated_mlp=False, vocab=vocab, tied_embeddings=tied, norm="layernorm", linears=linears,
        layer_norm_params=2 * ln, embedding_params=vocab * emb_dim + (max_pos + 2) * h + project,
        final_norm_params=(ln if final_ln else 0) + project,
        lm_head_params=0 if tied else vocab * emb_dim, max_positions=max_pos, embed_dim=emb_dim,
    )  # fmt: skip


# ---- GPT-2: Conv1D layers (weight stored [in, out]), learned positions, tied head ------------
def gpt2(c: ConfigReader) -> ModelArch:
    h = c.num("n_embd", "hidden_size")
    layers = c.num("n_layer", "num_hidden_layers")
    heads = c.num("n_head", "num_attention_heads")
    vocab = c.num("vocab_size")
    max_pos = c.num("n_positions", "max_position_embeddings", default=1024)
    head_dim = c.heads_split(h, heads)
    ffn = c.get("n_inner") or 4 * h
    linears = (
        Linear("c_attn", h, 3 * h, True, "column", "qkv"),
        Linear("c_proj", h, h, True, "row", "attn_out"),
        Linear("c_fc", h, ffn, True, "column", "mlp_in"),
        Linear("c_proj", ffn, h, True, "row", "mlp_out"),
    )
    tied = c.tied()
    return c.arch(
        hidden=h, layers=layers, heads=heads, kv_heads=heads, head_dim=head_dim, ffn=ffn,
        gated_mlp=False, vocab=vocab, tied_embeddings=tied, norm="layernorm", linears=linears,
        layer_norm_params=4 * h, embedding_params=(vocab + max_pos) * h, final_norm_params=2 * h,
        lm_head_params=0 if tied else vocab * h, max_positions=max_pos,
    )  # fmt: skip


BUILDERS: dict[str, Callable[[ConfigReader], ModelArch]] = {
    "llama": llama_like,
    "mistral": llama_like,
    "mixtral": llama_like,
    "qwen2": llama_like,
    "qwen3": llama_like,
    "gemma": llama_like,
    "gemma2": llama_like,
    "qwen": qwen,
    "stablelm": stablelm,
    "phi": phi,
    "bloom": bloom,
    "falcon": falcon,
    "gpt_neox": gpt_neox,
    "opt": opt,
    "gpt2": gpt2,
}
# Older model_type spellings of the same module trees (remote-code era configs).
ALIASES = {"RefinedWeb": "falcon", "RefinedWebModel": "falcon", "stablelm_epoch": "stablelm"}


# model types whose loss on a packed row equals the unpacked loss with --packing (per-sample position ids
# restart the attention at each sample; tests/test_packing.py checks each)
PACKED_FAMILIES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "phi", "stablelm", "gpt_neox",
    "falcon", "gpt2",
})


def packing_refusal(model_type: str) -> str | None:
    """Why --packing cannot train this family, or None."""
    if model_type in PACKED_FAMILIES:
        return None
    return (
        f"{model_type} models do not take per-sample position ids (their attention would cross the "
        f"samples of a packed row); packing trains {', '.join(sorted(PACKED_FAMILIES))}: drop --packing"
    )
