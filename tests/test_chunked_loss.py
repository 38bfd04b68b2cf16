"""--loss chunked: the same loss and gradients as transformers' own, and the memory the model says.

The loss part is measured alone (the head and the cross-entropy over a given hidden state: the
live-bytes peak against memory.edges.logits_bytes, within 5 %), and inside a whole tiny
Llama's forward + backward (saved activations + the loss part, the estimator's moment).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from launcher.memory import activations as A  # noqa: E402
from launcher.memory import edges as E  # noqa: E402
from launcher.memory import states as S  # noqa: E402
from launcher.memory.constants import LOSS_CHUNK_TOKENS  # noqa: E402
from launcher.models.hf_config import arch_from_hf_config  # noqa: E402
from launcher.parallel.stages import causal_lm_loss  # noqa: E402
from launcher.spec import TrainSpec  # noqa: E402
from launcher.train import chunked_loss  # noqa: E402
from tests.memtrack import LiveBytes  # noqa: E402
from tests.test_memory_activations import CFG, analytic_activations  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
ARCH = arch_from_hf_config(CFG, "tiny-test")
V, H = CFG["vocab_size"], CFG["hidden_size"]


def _labels(batch: int, seq: int) -> torch.Tensor:
    labels = torch.randint(0, V, (batch, seq))
    labels[:, : seq // 4] = -100  # a prompt: unlabelled, as the worker's data makes it
    return labels


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("chunk", [100, 1024, 5000])
def test_chunked_loss_and_gradients_equal_the_whole_ones(precision, chunk):
    dtype = DTYPES[precision]
    torch.manual_seed(0)
    head = torch.nn.Linear(H, V, bias=False).to(dtype)
    hidden = torch.randn(2, 1024, H, dtype=dtype, requires_grad=True)
    labels = _labels(2, 1024)
    whole = causal_lm_loss(head(hidden), labels)
    whole.backward()
    grads = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad = head.weight.grad = None
    chunked = chunked_loss.chunked_loss(head, hidden, labels, chunk)
    chunked.backward()
    tol = dict(rtol=1e-2, atol=1e-4) if precision == "bf16" else dict(rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)  # both sum in fp32
    torch.testing.assert_close(hidden.grad, grads[0], **tol)
    torch.testing.assert_close(head.weight.grad, grads[1], **tol)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("batch,seq", [(4, 1024), (1, 1500), (3, 1000)])
def test_chunked_loss_memory_is_the_models_term(precision, method, batch, seq):
    """Peak live bytes of the head + chunked loss, forward and backward, over a hidden state made
    before: logits_bytes, plus the head's summed weight gradient for a trained head (which the
    estimator counts in its gradients term)."""
    dtype = DTYPES[precision]
    head = torch.nn.Linear(H, V, bias=False).to(dtype).requires_grad_(method == "full")
    hidden = torch.randn(batch, seq, H, dtype=dtype, requires_grad=True)
    labels = _labels(batch, seq)
    with LiveBytes() as live:
        chunked_loss.chunked_loss(head, hidden, labels).backward()
    spec = TrainSpec(method=method, precision=precision, micro_batch=batch, seq_len=seq, loss="chunked")
    predicted = E.logits_bytes(ARCH, spec) + (V * H * dtype.itemsize if method == "full" else 0)
    assert abs(predicted / live.peak - 1) < 0.05, (predicted, live.peak)
    assert predicted < 0.8 * E.logits_bytes(ARCH, spec.with_(loss="full"))


def test_one_chunk_is_the_whole_loss():
    """A micro-batch of at most one chunk runs (and is counted as) the unchunked loss."""
    for tokens in (1, LOSS_CHUNK_TOKENS):
        spec = TrainSpec(micro_batch=1, seq_len=tokens, loss="chunked")
        assert not E.chunked_loss(spec)
        assert E.logits_bytes(ARCH, spec) == E.logits_bytes(ARCH, spec.with_(loss="full"))
        assert E.edge_activations(ARCH, spec, True, True) == E.edge_activations(ARCH, spec.with_(loss="full"), True, True)


def _tiny(precision: str, method: str, ckpt: str, chunked: bool):
    dtype = DTYPES[precision]
    cfg = transformers.LlamaConfig(**{k: v for k, v in CFG.items() if k != "model_type"})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.train()
    if chunked:
        chunked_loss.enable(model)
    if ckpt == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if method == "lora":
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"])).to(dtype)
    return model


@pytest.mark.parametrize("method", ["full", "lora"])
def test_a_model_with_the_chunked_loss_trains_to_the_same_loss(method):
    """transformers' own loss and ours, on the same model: the loss and every trained gradient."""
    ids = torch.randint(0, V, (2, 768))
    labels = _labels(2, 768)
    out = {}
    for chunked in (False, True):
        model = _tiny("fp32", method, "none", chunked)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        out[chunked] = loss, {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
        if chunked:  # without labels the model is unchanged: logits, for generation and eval
            assert model(input_ids=ids[:, :8]).logits.shape == (2, 8, V)
    torch.testing.assert_close(out[True][0], out[False][0], rtol=1e-5, atol=1e-6)
    for name, grad in out[False][1].items():
        torch.testing.assert_close(out[True][1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("ckpt", ["none", "full"])
def test_peak_of_a_step_with_the_chunked_loss(method, ckpt):
    """The whole step's peak (bf16, 4 x 768 tokens: 3 chunks) against the estimator's terms, and
    well below the unchunked step's (its logits are 3x the chunk's)."""
    spec = TrainSpec(
        method=method, precision="bf16", micro_batch=4, seq_len=768, grad_ckpt=ckpt, loss="chunked",
        lora_r=8, lora_targets="q_proj,v_proj" if method == "lora" else "all-linear",
    )
    ids = torch.randint(0, V, (4, 768))
    peaks = {}
    for chunked in (True, False):
        model = _tiny("bf16", method, ckpt, chunked)
        with LiveBytes() as live:
            model(input_ids=ids, labels=ids).loss.backward()
        peaks[chunked] = live.peak
    head_grad = V * H * 2 if method == "full" else 0  # the summed head gradient: the gradients term
    # the estimator's backward-start moment: everything saved, and the loss's working set or (full
    # recompute) the last block's recompute and backward, which come after the loss's backward
    targets = S.lora_targets(ARCH, spec) if method == "lora" else set()
    layer = A.layer_activations(ARCH, spec, targets)
    stored = analytic_activations(spec) - A.recompute_working_set(spec, layer)
    after_loss = A.recompute_working_set(spec, layer) + A.backward_transient(ARCH, spec, layer)
    predicted = stored + max(E.logits_bytes(ARCH, spec) + head_grad, after_loss)
    assert abs(predicted / peaks[True] - 1) < 0.05, (predicted, peaks[True])
    assert peaks[True] < 0.6 * peaks[False]


FAMILIES = {
    # soft-capped logits (final_logit_softcapping): the cap applies per chunk as in the model
    "gemma2": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, vocab_size=512, final_logit_softcapping=30.0),
    # a tied head (the embedding matrix) under a base model named `transformer`
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, vocab_size=512),
    "bloom": dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=512),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_other_families_chunk_to_their_own_loss(family):
    config = transformers.AutoConfig.for_model(family, **FAMILIES[family])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()  # no dropout
    ids = torch.randint(0, 512, (3, 500))
    whole = model(input_ids=ids, labels=ids).loss
    chunked_loss.enable(model, chunk_tokens=256)
    torch.testing.assert_close(model(input_ids=ids, labels=ids).loss, whole, rtol=1e-5, atol=1e-6)
