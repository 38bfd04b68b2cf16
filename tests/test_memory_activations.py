"""The activation and logits terms against what torch really keeps, on the CPU, for a tiny Llama.

Two measurements (tests/memtrack.py): the bytes autograd saves for backward in the forward
(saved_tensors_hooks, distinct storages, parameters excluded) against the analytic activations;
and the peak of live bytes over forward + backward of the loss against activations + logits
(the term that includes the fp32 cross-entropy working set and full-recompute's working layer).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from launcher.memory import activations as A  # noqa: E402
from launcher.memory import edges as E  # noqa: E402
from launcher.memory import states as S  # noqa: E402
from launcher.memory.attention import attention_impl  # noqa: E402
from launcher.models.hf_config import arch_from_hf_config  # noqa: E402
from launcher.spec import TrainSpec  # noqa: E402
from tests.memtrack import LiveBytes, SavedBytes  # noqa: E402

CFG = dict(
    model_type="llama",
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=8192,
    tie_word_embeddings=False,
    max_position_embeddings=1024,
)
BATCH, SEQ = 4, 256
TOL = 0.10


def build(precision: str, attention: str, method: str, ckpt: str):
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    cfg = transformers.LlamaConfig(**{k: v for k, v in CFG.items() if k != "model_type"})
    cfg._attn_implementation = attention
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.train()
    if ckpt == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if method == "lora":
        lora = peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
        # DeepSpeed casts the whole module (adapters included) to the compute dtype; do the same
        model = peft.get_peft_model(model, lora).to(dtype)
    spec = TrainSpec(
        method=method,
        precision=precision,
        micro_batch=BATCH,
        seq_len=SEQ,
        attention=attention,
        grad_ckpt=ckpt,
        lora_r=8,
        lora_targets="q_proj,v_proj" if method == "lora" else "all-linear",
    )
    return model, spec


def analytic_activations(spec: TrainSpec) -> float:
    arch = arch_from_hf_config(CFG, "tiny-test")
    targets = S.lora_targets(arch, spec) if spec.trains_adapters else set()
    layer = A.layer_activations(arch, spec, targets)
    acts = arch.layers * A.stored_per_layer(arch, spec, layer) + A.recompute_working_set(spec, layer)
    return acts + E.edge_activations(arch, spec, True, True)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("method", ["full", "lora"])
def test_saved_activations_match(precision, attention, method):
    model, spec = build(precision, attention, method, "none")
    ids = torch.randint(0, CFG["vocab_size"], (BATCH, SEQ))
    with SavedBytes(model) as saved:
        model(input_ids=ids)
    predicted = analytic_activations(spec)
    assert abs(predicted / saved.total - 1) < TOL, (predicted, saved.total)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("ckpt", ["none", "full"])
@pytest.mark.parametrize("method", ["full", "lora"])
def test_peak_activations_and_logits_match(precision, ckpt, method):
    model, spec = build(precision, "sdpa", method, ckpt)
    ids = torch.randint(0, CFG["vocab_size"], (BATCH, SEQ))
    with LiveBytes() as live:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    arch = arch_from_hf_config(CFG, "tiny-test")
    predicted = analytic_activations(spec) + E.logits_bytes(arch, spec)
    assert abs(predicted / live.peak - 1) < TOL, (predicted, live.peak)


@pytest.mark.parametrize("edges", ["lm_head", "embed_tokens", "embed_tokens,lm_head"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_adapters_on_the_embedding_and_the_head_save_what_the_model_says(edges, precision):
    """PEFT's Embedding adapter keeps its A lookup (r per token); a head adapter its input and
    lora_A's output: the saved bytes and the step's peak with them, as with the block adapters."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    cfg = transformers.LlamaConfig(**{k: v for k, v in CFG.items() if k != "model_type"})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    spec = TrainSpec(method="lora", precision=precision, micro_batch=BATCH, seq_len=SEQ, lora_r=8,
                     lora_targets=f"q_proj,v_proj,{edges}")
    from launcher.train.model import peft_targets

    lora = peft.LoraConfig(r=8, target_modules=peft_targets(model, spec), lora_dropout=0.0)
    model = peft.get_peft_model(model, lora, autocast_adapter_dtype=False)
    ids = torch.randint(0, CFG["vocab_size"], (BATCH, SEQ))
    with SavedBytes(model) as saved:
        model(input_ids=ids)
    # within 3 %: with frozen embeddings the first block's norm keeps no input, which the model counts
    assert abs(analytic_activations(spec) / saved.total - 1) < 0.05, (analytic_activations(spec), saved.total)
    with LiveBytes() as live:
        model(input_ids=ids, labels=ids).loss.backward()
    arch = arch_from_hf_config(CFG, "tiny-test")
    adapter_grads = S.trainable_params(arch, spec) * dtype.itemsize
    predicted = analytic_activations(spec) + E.logits_bytes(arch, spec) + adapter_grads
    assert abs(predicted / live.peak - 1) < TOL, (predicted, live.peak)  # as the peak test above


def test_full_recompute_saves_far_less_than_none():
    _, none = build("bf16", "sdpa", "full", "none")
    _, full = build("bf16", "sdpa", "full", "full")
    assert analytic_activations(full) < 0.5 * analytic_activations(none)


def test_longer_sequence_never_lowers_activations():
    arch = arch_from_hf_config(CFG, "tiny-test")
    for attention in ("sdpa", "eager"):
        for ckpt in ("none", "selective", "full"):
            prev = 0.0
            for seq in (128, 256, 512, 1024, 4096):
                spec = TrainSpec(seq_len=seq, attention=attention, grad_ckpt=ckpt)
                layer = A.layer_activations(arch, spec, set())
                total = A.stored_per_layer(arch, spec, layer) + E.logits_bytes(arch, spec)
                assert total >= prev
                prev = total


FALCON_MQA = dict(
    model_type="falcon",
    hidden_size=256,
    num_hidden_layers=2,
    num_attention_heads=8,
    multi_query=True,
    new_decoder_architecture=False,
    parallel_attn=True,
    bias=False,
    vocab_size=1024,
)


def predicted_peak(arch, spec: TrainSpec, stored: float) -> float:
    """The estimator's backward-start moment: saved activations plus the loss's working set, or
    the last block's recompute and backward transient if larger."""
    layer = A.layer_activations(arch, spec, set())
    after_loss = A.recompute_working_set(spec, layer) + A.backward_transient(arch, spec, layer)
    return stored + max(E.logits_bytes(arch, spec), after_loss)


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
@pytest.mark.parametrize("ckpt", ["none", "full"])
def test_eager_attention_scores_and_their_backward(model_type, ckpt):
    """Eager attention keeps the softmax output (fp32 + a 16-bit copy for Llama, the compute dtype
    for GPT-2) and its backward holds two score-sized gradients for a moment."""
    batch, seq = 2, 512
    if model_type == "gpt2":
        hf = dict(
            model_type="gpt2",
            n_embd=128,
            n_layer=2,
            n_head=4,
            vocab_size=512,
            n_positions=seq,
            activation_function="gelu_new",
            attn_pdrop=0.0,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
        )
        cfg = transformers.GPT2Config(**{k: v for k, v in hf.items() if k != "model_type"})
    else:
        hf = {**CFG, "num_hidden_layers": 2, "vocab_size": 512}
        cfg = transformers.LlamaConfig(**{k: v for k, v in hf.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).train()
    if ckpt == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    spec = TrainSpec(micro_batch=batch, seq_len=seq, attention="eager", grad_ckpt=ckpt, method="full")
    arch = arch_from_hf_config(hf, "tiny-eager")
    layer = A.layer_activations(arch, spec, set())
    stored = arch.layers * A.stored_per_layer(arch, spec, layer) + E.edge_activations(arch, spec, True, True)
    ids = torch.randint(0, 512, (batch, seq))
    with SavedBytes(model) as saved:
        model(input_ids=ids)
    if ckpt == "none":
        assert abs(stored / saved.total - 1) < TOL, (stored, saved.total)
    with LiveBytes() as live:
        model(input_ids=ids, labels=ids).loss.backward()
    predicted = predicted_peak(arch, spec, stored)
    assert abs(predicted / live.peak - 1) < TOL, (predicted, live.peak)


@pytest.mark.parametrize("batch", [1, 3])
def test_falcon_multi_query_sdpa_runs_the_math_kernel_and_is_counted_as_such(batch):
    """falcon-7b's layout hands sdpa one K/V head against every query head: the fused kernels
    refuse it, the math kernel keeps fp32 scores (s² per layer) and a moment of two more in
    backward; K/V are copied out to every head once a micro-batch holds more than one sequence."""
    seq = 512  # the s² terms dominate the weight gradients (not in the prediction) that backward creates
    cfg = transformers.FalconConfig(**{k: v for k, v in FALCON_MQA.items() if k != "model_type"})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).train()
    spec = TrainSpec(precision="bf16", micro_batch=batch, seq_len=seq, attention="sdpa", method="full")
    arch = arch_from_hf_config(FALCON_MQA, "tiny-falcon-mqa")
    assert attention_impl(arch, spec) == "math"
    layer = A.layer_activations(arch, spec, set())
    assert layer.attention_scores == 4 * batch * arch.heads * seq * seq
    stored = arch.layers * A.stored_per_layer(arch, spec, layer) + E.edge_activations(arch, spec, True, True)

    ids = torch.randint(0, FALCON_MQA["vocab_size"], (batch, seq))
    with SavedBytes(model) as saved:
        model(input_ids=ids)
    assert abs(stored / saved.total - 1) < TOL, (stored, saved.total)

    with LiveBytes() as live:
        model(input_ids=ids, labels=ids).loss.backward()
    assert A.backward_transient(arch, spec, layer) > E.logits_bytes(arch, spec)  # attention sets the peak
    predicted = predicted_peak(arch, spec, stored)
    assert abs(predicted / live.peak - 1) < TOL, (predicted, live.peak)


def test_falcon_new_layout_keeps_the_fused_kernel():
    arch = arch_from_hf_config({**FALCON_MQA, "new_decoder_architecture": True, "num_kv_heads": 2}, "t")
    assert attention_impl(arch, TrainSpec(attention="sdpa")) == "sdpa"
    spec = TrainSpec(attention="sdpa")
    # no score-sized transient: only the MLP backward's two input-sized gradients remain
    mlp = 2 * spec.micro_batch * spec.seq_len * arch.ffn * 2
    assert A.backward_transient(arch, spec, A.layer_activations(arch, spec, set())) == mlp


@pytest.mark.parametrize("targets", ["q_proj,v_proj", "all-linear", "all-linear,embed_tokens,lm_head"])
def test_bf16_autocast_adapters_each_keep_their_own_input(targets):
    """--precision bf16-autocast (the worker's model under torch.autocast, as DeepSpeed's
    torch_autocast runs it): PEFT casts each adapter's input to fp32 and autocast back to bf16, so
    q, k and v keep three copies of the input that plain bf16 LoRA keeps once; saved bytes within 5 %."""
    from launcher.train.model import build_model

    saved = {}
    for precision in ("bf16", "bf16-autocast"):
        spec = TrainSpec(method="lora", precision=precision, micro_batch=BATCH, seq_len=SEQ, lora_r=8,
                         lora_targets=targets)
        model = build_model(CFG, "", spec, init="random", seed=0, lora_dropout=0.0)
        model.train()
        ids = torch.randint(0, CFG["vocab_size"], (BATCH, SEQ))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-autocast"):
            with SavedBytes(model) as saved_bytes:
                model(input_ids=ids)
        saved[precision] = saved_bytes.total
        assert abs(analytic_activations(spec) / saved_bytes.total - 1) < 0.05, (precision, saved_bytes.total)
    assert saved["bf16-autocast"] > saved["bf16"]


GEMMA2 = dict(
    model_type="gemma2", hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, vocab_size=4096, final_logit_softcapping=30.0,
    attn_logit_softcapping=50.0, max_position_embeddings=1024, attention_dropout=0.0,
)


@pytest.mark.parametrize("method", ["full", "lora"])
def test_gemma2_soft_capping_is_counted(method):
    """Gemma-2 runs eager (transformers refuses sdpa for it) and soft-caps its attention scores
    and logits (cap * tanh(x / cap)); tanh keeps its output: 2 bytes per score and per logit more."""
    from launcher.train.model import build_model

    arch = arch_from_hf_config(GEMMA2, "tiny-gemma2")
    spec = TrainSpec(method=method, precision="bf16", micro_batch=2, seq_len=256, lora_r=8)
    model = build_model(GEMMA2, "", spec, init="random", seed=0, lora_dropout=0.0)
    model.train()
    assert model.config._attn_implementation == "eager"
    ids = torch.randint(0, GEMMA2["vocab_size"], (2, 256))
    with SavedBytes(model) as saved:
        model(input_ids=ids)
    targets = S.lora_targets(arch, spec) if method == "lora" else set()
    layer = A.layer_activations(arch, spec, targets)
    predicted = arch.layers * A.stored_per_layer(arch, spec, layer) + E.edge_activations(arch, spec, True, True)
    tanh_logits = 2 * 2 * 256 * GEMMA2["vocab_size"]  # the capped logits' tanh output, kept from the forward
    # within TOL as the other families (Gemma's RMSNorm keeps its normalised tensor in fp32: -8 % uncapped)
    assert abs((predicted + tanh_logits) / saved.total - 1) < TOL, (predicted + tanh_logits, saved.total)
    with LiveBytes() as live:
        model(input_ids=ids, labels=ids).loss.backward()
    capped = E.logits_bytes(arch, spec)
    assert capped == 14 * 2 * 256 * GEMMA2["vocab_size"]  # 12 B/logit + tanh's bf16 output
    assert abs((predicted + capped) / live.peak - 1) < TOL, (predicted + capped, live.peak)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_rows_keep_what_the_model_counts(precision, attention):
    """--packing: per-sample position ids make transformers build a block-diagonal mask; under sdpa
    each layer then keeps the mask's float bias and K/V repeated to every head. Both the total and
    the increase over unpacked rows are what the model says."""
    model, spec = build(precision, attention, "full", "none")
    packed_spec = spec.with_(packing=True)
    ids = torch.randint(0, CFG["vocab_size"], (BATCH, SEQ))
    # three samples a row, of unequal lengths
    positions = torch.cat([torch.arange(100), torch.arange(SEQ - 160), torch.arange(60)]).repeat(BATCH, 1)
    with SavedBytes(model) as plain:
        model(input_ids=ids, use_cache=False)
    with SavedBytes(model) as packed:  # no cache: as the worker runs (transformers packs only so)
        model(input_ids=ids, position_ids=positions, use_cache=False)
    predicted = analytic_activations(packed_spec)
    assert abs(predicted / packed.total - 1) < TOL, (predicted, packed.total)
    more = predicted - analytic_activations(spec)
    if attention == "sdpa":  # the eager kernel had its s² scores and expanded heads already
        assert abs(more / (packed.total - plain.total) - 1) < TOL, (more, packed.total - plain.total)
    else:
        assert more == 0 and abs(packed.total / plain.total - 1) < 0.01
