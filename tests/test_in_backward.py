"""--optimizer-step in-backward (launcher/train/in_backward.py): each parameter stepped from its
gradient hook and its gradient freed at once. The same updates as one optimizer step after the
backward, the state that checkpoints carry, the memory the model counts (measured with live-byte
tracking on the CPU), the configurations it refuses, and the planner choosing it where it is what
fits. The 2-rank run (gradients averaged as they come) is in test_train_e2e.py, its exact resume in
test_resume_exact.py."""

from __future__ import annotations

import copy

import pytest

from launcher.errors import InvalidSpecError
from launcher.spec import TrainSpec

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from launcher.hardware import parse_gpus  # noqa: E402
from launcher.memory.estimate import estimate  # noqa: E402
from launcher.models.hf_config import arch_from_hf_config  # noqa: E402
from launcher.train import in_backward  # noqa: E402
from tests.memtrack import ActivationPeak  # noqa: E402
from tests.test_memory_activations import CFG  # noqa: E402

ARCH = arch_from_hf_config(CFG, "tiny-test")
DTYPES = {"fp32": torch.float32, "bf16-pure": torch.bfloat16}


def _model(precision: str, ckpt: str = "none"):
    cfg = transformers.LlamaConfig(**{k: v for k, v in CFG.items() if k != "model_type"})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=DTYPES[precision])
    model.train()
    if ckpt == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True)  # as the worker builds it


def _step(model, opt, ids) -> float:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


@pytest.mark.parametrize("precision", ["fp32", "bf16-pure"])
def test_stepping_in_backward_makes_the_updates_of_one_step_after_it(precision):
    models = {k: _model(precision) for k in ("after", "in")}
    opts = {
        "after": _adamw(models["after"].parameters()),
        "in": in_backward.optimizer(models["in"].parameters(), _adamw, 1e-3, bucket_elems=128 * 128),
    }
    torch.manual_seed(1)
    batches = [torch.randint(0, CFG["vocab_size"], (2, 64)) for _ in range(3)]
    for ids in batches:
        losses = {k: _step(models[k], opts[k], ids) for k in models}
        assert losses["in"] == pytest.approx(losses["after"], rel=1e-6)
    for (name, p), q in zip(models["after"].named_parameters(), models["in"].parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=0, msg=name)
        assert q.grad is None


def test_its_state_resumes_the_same_updates():
    """state_dict / load_state_dict (what DeepSpeed's ZeRO-0 checkpoint holds): a fresh optimizer
    loaded with the state after two steps makes the third step's update exactly."""
    ids = [torch.randint(0, CFG["vocab_size"], (2, 32)) for _ in range(3)]
    model = _model("fp32")
    opt = in_backward.optimizer(model.parameters(), _adamw, 1e-3, bucket_elems=1)
    for x in ids[:2]:
        _step(model, opt, x)
    state = copy.deepcopy(opt.state_dict())  # as written to disk: not the live tensors
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    _step(model, opt, ids[2])
    again = _model("fp32")
    again.load_state_dict(saved)
    opt2 = in_backward.optimizer(again.parameters(), _adamw, 1e-3, bucket_elems=1)
    opt2.load_state_dict(state)
    _step(again, opt2, ids[2])
    for (name, p), q in zip(model.named_parameters(), again.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=0, msg=name)
    with pytest.raises(ValueError, match="optimizer state for"):
        opt2.load_state_dict({"lr": 1e-3, "per_parameter": state["per_parameter"][:3]})


@pytest.mark.parametrize("step", ["after-backward", "in-backward"])
def test_memory_of_a_step_is_the_models(step):
    """A step (after a first one made the optimizer states) on a model whose gradients dominate
    (bf16-pure, 1 x 32 tokens, full recompute): the gradient bytes alive at once are the memory
    model's term (every gradient after the backward; the largest parameter's in backward), and in
    backward the whole step's peak of new storages is its estimate less the weights and states made
    before. (After the backward DeepSpeed's engine also flattens its all-reduce bucket, which this
    plain loop does not: tests/test_zero_memory.py measures that step in the engine.)"""
    spec = TrainSpec(precision="bf16-pure", micro_batch=1, seq_len=32, grad_ckpt="full", optimizer_step=step)
    model = _model("bf16-pure", "full")
    params = list(model.parameters())
    tracker = ActivationPeak(params)  # its gradient hooks first: they see each gradient before it is freed
    opt = in_backward.optimizer(params, _adamw, 1e-3, bucket_elems=1) if step == "in-backward" else _adamw(params)
    ids = torch.randint(0, CFG["vocab_size"], (1, 32))
    _step(model, opt, ids)
    tracker.grad_peak = 0
    with tracker:
        _step(model, opt, ids)
    est = estimate(ARCH, spec, parse_gpus("1xA100"))
    c = est.components
    assert tracker.grad_peak == pytest.approx(est.gradients_full, rel=0.05)
    if step == "in-backward":
        made_before = c["weights"] + c["optimizer_states"] + c["master_weights"]
        assert tracker.peak == pytest.approx(est.peak_allocated - made_before, rel=0.05)
        whole = sum(p.numel() * p.element_size() for p in params)
        assert tracker.grad_peak < 0.4 * whole  # one 1.05M embedding-sized matrix of the 2.84M parameters


@pytest.mark.parametrize(
    "changes, says",
    [
        (dict(method="lora"), "use it with --method full"),
        (dict(zero_stage=2), "use --zero-stage 0"),
        (dict(grad_accum=4), "use --grad-accum 1"),
        (dict(precision="bf16"), "master copy"),
        (dict(precision="fp16"), "overflow"),
        (dict(pp=2), "--tp 1 --pp 1"),
    ],
)
def test_what_cannot_step_in_backward_is_refused_with_the_way_out(changes, says):
    base = dict(precision="bf16-pure", optimizer_step="in-backward")
    with pytest.raises(InvalidSpecError, match=says) as err:
        TrainSpec(**{**base, **changes})
    assert "\n" not in str(err.value)
