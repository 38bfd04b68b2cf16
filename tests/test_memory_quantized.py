"""QLoRA's and 8-bit AdamW's memory terms against what bitsandbytes really holds, on the CPU
(bitsandbytes' CPU backend; tests/memtrack.py), for a tiny Llama quantised as the worker does it
(launcher/train/quantize.py):

- the quantised weights with their quantisation constants (NF4: packed 4-bit values, 8-bit
  absmax per 64-block, double-quantised fp32 constants; int8: a byte per weight + fp32 row
  scales) against the model's weight bytes;
- the activation peak of a QLoRA (NF4) step against activations + logits. bitsandbytes' 4-bit
  matmul runs the same autograd function on the CPU as on a GPU (dequantise, matmul; the input
  kept on ctx, where saved-tensor hooks cannot see it: live bytes are measured). Its int8 path
  is not measured here: in training on a CPU bitsandbytes swaps LLM.int8()'s matmul for a
  dequantise-and-matmul function of its own (MatMul8bitFp), which GPUs never run;
- 8-bit AdamW's states on a flat fp32 partition (what DeepSpeed hands a client optimizer).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
bnb = pytest.importorskip("bitsandbytes")

from launcher.memory import edges as E  # noqa: E402
from launcher.memory import states as S  # noqa: E402
from launcher.models.hf_config import arch_from_hf_config  # noqa: E402
from launcher.spec import TrainSpec  # noqa: E402
from launcher.train.quantize import quantize_linears, quantized_layers  # noqa: E402
from tests.memtrack import LiveBytes  # noqa: E402
from tests.test_memory_activations import BATCH, CFG, SEQ, analytic_activations  # noqa: E402

TOL = 0.05
ARCH = arch_from_hf_config(CFG, "tiny-test")


def qlora_model(quant: str, ckpt: str):
    import transformers

    cfg = transformers.LlamaConfig(**{k: v for k, v in CFG.items() if k != "model_type"})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.train()
    quantize_linears(model, quant, torch.bfloat16, keep={id(model.get_output_embeddings())})
    if ckpt == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    lora = peft.LoraConfig(r=8, target_modules="all-linear", lora_dropout=0.0)
    model = peft.get_peft_model(model, lora, autocast_adapter_dtype=False)
    spec = TrainSpec(
        method="qlora", quant=quant, micro_batch=BATCH, seq_len=SEQ, attention="sdpa", grad_ckpt=ckpt,
        lora_r=8, lora_targets="all-linear",
    )
    return model, spec


def held_bytes(model) -> int:
    """Every distinct storage of the model's parameters and buffers, plus the quantisation
    constants bitsandbytes keeps beside the weights (a 4-bit weight's quant_state, an int8
    weight's row scales)."""
    storages = {}
    for t in [*model.parameters(), *model.buffers()]:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    for m in model.modules():
        w = getattr(m, "weight", None)
        state = getattr(w, "quant_state", None)
        extra = []
        if state is not None:
            extra = [state.absmax, state.code]
            if state.nested:
                extra += [state.state2.absmax, state.state2.code, state.offset]
        if getattr(w, "SCB", None) is not None:
            extra.append(w.SCB)
        for t in extra:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


@pytest.mark.parametrize("quant", ["nf4", "int8"])
def test_quantised_weights_and_their_constants_are_what_the_model_counts(quant):
    model, spec = qlora_model(quant, "none")
    predicted = S.weight_bytes(spec, S.stage_params(ARCH, spec, ARCH.layers, True, True))
    measured = held_bytes(model)
    # measured -1.5 % (nf4) and -3.6 % (int8: the fp32 row scales, 4 / in_features per weight)
    assert abs(predicted / measured - 1) < TOL, (predicted, measured)
    assert quantized_layers(model) == 7 * CFG["num_hidden_layers"]  # every block linear, not the head


@pytest.mark.parametrize("ckpt", ["none", "full"])
def test_qlora_activation_peak_is_what_the_model_counts(ckpt):
    model, spec = qlora_model("nf4", ckpt)
    ids = torch.randint(0, CFG["vocab_size"], (BATCH, SEQ))
    with LiveBytes() as live:
        model(input_ids=ids, labels=ids).loss.backward()
    predicted = analytic_activations(spec) + E.logits_bytes(ARCH, spec)
    # measured -1.7 % (none) and +2.6 % (full)
    assert abs(predicted / live.peak - 1) < TOL, (predicted, live.peak)


@pytest.mark.parametrize("optimizer", ["adamw-8bit", "paged-adamw-8bit", "paged-adamw"])
def test_bitsandbytes_adamw_states_on_a_flat_partition_are_what_the_model_counts(optimizer):
    """8-bit and paged AdamW (their states on a CPU are ordinary tensors of the same sizes)."""
    from launcher.memory.states import StageParams
    from launcher.spec import TrainSpec
    from launcher.train.optimizers import client_optimizer

    n = 3 * 2**20 + 100  # a DeepSpeed flat partition: one fp32 tensor, not a multiple of a block
    flat = torch.nn.Parameter(torch.randn(n))
    spec = TrainSpec(optimizer=optimizer, zero_stage=1)
    opt = client_optimizer(spec, [flat], 1e-3, 0.0)  # what the worker builds
    flat.grad = torch.randn(n)
    opt.step()
    state = opt.state[flat]
    held = {}
    for k, v in state.items():
        if torch.is_tensor(v) and not k.startswith("qmap"):  # the quantile maps are shared, 2 KiB
            held[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
    assert state["state1"].dtype == (torch.float32 if optimizer == "paged-adamw" else torch.uint8)
    measured = sum(held.values())
    predicted = S.optimizer_bytes(spec, StageParams(0, 0, n, 0, 0))
    assert measured == pytest.approx(predicted, rel=1e-3), (measured, predicted)
