"""Model states against DeepSpeed's own estimators, called from the installed deepspeed.

Where the assumptions coincide (full fine-tuning, bf16 mixed precision, AdamW) the numbers
must agree exactly; where they differ, the difference must be exactly the terms that
launcher/memory/states.py documents (and nothing else).
"""

from __future__ import annotations

import pytest

from launcher.errors import InvalidSpecError
from launcher.hardware import parse_gpus
from launcher.memory import states as S
from launcher.memory.constants import (
    STAGE3_MAX_LIVE_PARAMETERS,
    STAGE3_SUB_GROUP_SIZE,
)
from launcher.models.catalog import resolve_model
from launcher.spec import TrainSpec

ds2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
ds3 = pytest.importorskip("deepspeed.runtime.zero.stage3")

MODELS = ["llama-3.1-8b", "bloom-7b1", "mistral-7b", "qwen2.5-14b", "gpt2"]
GPUS = [1, 4, 8]


def ours(model: str, gpus: int, **spec_kw):
    arch = resolve_model(model)
    spec = TrainSpec(**spec_kw)
    p = S.stage_params(arch, spec, arch.layers, True, True)
    st = S.model_states(spec, p, gpus)
    return arch, spec, p, st


def ds_largest_layer(arch) -> int:
    """DeepSpeed's largest_layer_params: the module with the most direct parameters."""
    biggest_linear = max(lin.fan_in * lin.fan_out + (lin.fan_out if lin.bias else 0) for lin in arch.linears)
    return max(arch.vocab * arch.hidden, biggest_linear)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("gpus", GPUS)
def test_zero2_gpu_states_agree_exactly(model, gpus):
    arch, _, _, st = ours(model, gpus, zero_stage=2)
    _, ds_gpu = ds2.estimate_zero2_model_states_mem_needs(arch.total_params, gpus, 1, cpu_offload=False)
    mine = st.weights + st.grads + st.master + st.optimizer + st.fp32_grads
    assert mine == pytest.approx(ds_gpu, rel=1e-6, abs=64)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("gpus", GPUS)
def test_zero2_offload_gpu_agrees_and_host_differs_by_buffer_factor_only(model, gpus):
    arch, _, _, st = ours(model, gpus, zero_stage=2, offload_optimizer="cpu")
    ds_cpu, ds_gpu = ds2.estimate_zero2_model_states_mem_needs(arch.total_params, gpus, 1, cpu_offload=True)
    assert st.weights + st.grads + st.master + st.optimizer + st.fp32_grads == pytest.approx(ds_gpu, rel=1e-6)
    # DeepSpeed: N x max(4 x GPUs, 16) x 1.5. The 4 x GPUs is fp32 model loading on every rank,
    # the 16 the offloaded fp32 master + Adam states + fp32 gradients; we count the 16 without
    # the blanket 1.5 (loading is a separate host term, in bf16).
    per_node_states = st.host * gpus
    assert per_node_states == pytest.approx(16 * arch.total_params, rel=1e-6)
    assert ds_cpu == pytest.approx(arch.total_params * max(4 * gpus, 16) * 1.5, rel=1e-6)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("gpus", GPUS)
def test_zero3_differs_by_documented_terms(model, gpus):
    arch, spec, p, st = ours(model, gpus, zero_stage=3)
    ll = ds_largest_layer(arch)
    _, ds_gpu, ds_ll = ds3.estimate_zero3_model_states_mem_needs(
        arch.total_params, ll, gpus, 1, cpu_offload=False, cpu_offload_params=False
    )
    h2 = arch.hidden**2
    mine_states = st.weights + st.grads + st.master + st.optimizer + st.fp32_grads
    window, bucket = S.zero_buffers(spec, arch, p)
    # 1) the 16-bit gradient partition DeepSpeed's 18 bytes/param leave out, and the fp32
    #    gradient copy made one optimizer sub-group at a time (capped at sub_group_size)
    uncapped_fp32_grads = 4 * arch.total_params / gpus
    assert st.fp32_grads == min(uncapped_fp32_grads, 4 * STAGE3_SUB_GROUP_SIZE)
    assert mine_states - st.grads - st.fp32_grads + uncapped_fp32_grads == pytest.approx(
        ds_gpu - ds_ll, rel=1e-6
    )
    assert st.grads == pytest.approx(2 * arch.total_params / gpus, rel=1e-6)
    # 2) its 4 x largest layer (16-bit params + grads of one layer) is our window of gathered
    #    parameters: DeepSpeed's prefetch queue runs ahead until stage3_max_live_parameters are
    #    gathered (what the ZeRO-3 trace shows), a module always whole; plus one reduce bucket
    assert ds_ll == pytest.approx(4 * ll, rel=1e-6)
    assert window == 2 * max(p.largest_module, min(STAGE3_MAX_LIVE_PARAMETERS, p.total))
    assert bucket == 2 * h2


@pytest.mark.parametrize("model", MODELS)
def test_zero3_full_offload_moves_all_states_off_the_gpu(model):
    gpus = 8
    arch, spec, p, st = ours(model, gpus, zero_stage=3, offload_optimizer="cpu", offload_params="cpu")
    ds_cpu, ds_gpu, ds_ll = ds3.estimate_zero3_model_states_mem_needs(
        arch.total_params, ds_largest_layer(arch), gpus, 1, cpu_offload=True, cpu_offload_params=True
    )
    assert st.weights + st.grads + st.master + st.optimizer + st.fp32_grads == 0
    assert ds_gpu == ds_ll  # DeepSpeed: only the gathered largest layer stays on the GPU
    # host: DeepSpeed 18 bytes/param x 1.5; ours 2 (params) + 2 (16-bit grad partition)
    # + 12 (master, Adam) + the fp32 gradient copy of one optimizer sub-group at a time
    fp32_grads = min(4 * arch.total_params / gpus, 4 * STAGE3_SUB_GROUP_SIZE) * gpus
    assert st.host * gpus == pytest.approx(16 * arch.total_params + fp32_grads, rel=1e-6)
    assert ds_cpu == pytest.approx(18 * arch.total_params * 1.5, rel=1e-6)


def test_lora_counts_only_adapters_as_trainable():
    arch, spec, p, st = ours("llama-3.1-8b", 1, method="lora", lora_r=16, lora_targets="q_proj,v_proj")
    # q_proj 4096->4096, v_proj 4096->1024: r x (in + out) each, 32 layers
    assert p.trainable == 32 * 16 * ((4096 + 4096) + (4096 + 1024))
    assert st.master == p.trainable * 4
    assert st.optimizer == p.trainable * 8
    assert st.weights == pytest.approx((arch.total_params + p.trainable) * 2)


def test_qlora_weights_are_about_a_quarter():
    arch, spec, p, st = ours("llama-3.1-8b", 1, method="qlora")
    full16 = arch.total_params * 2
    assert 0.25 < st.weights / full16 < 0.40  # embeddings and LM head stay 16-bit


@pytest.mark.parametrize("optimizer,per_param", [("adamw", 8), ("adamw-8bit", 2 + 8 / 256), ("sgd", 4)])
def test_optimizer_bytes(optimizer, per_param):
    _, _, p, st = ours("llama-3.2-1b", 1, optimizer=optimizer)
    assert st.optimizer == pytest.approx(p.trainable * per_param, rel=1e-6)


def test_adafactor_is_factored_only_where_deepspeed_leaves_the_matrices_whole():
    _, _, p, st = ours("llama-3.2-1b", 1, optimizer="adafactor", precision="fp32")
    assert st.optimizer < 0.2 * p.trainable * 4
    # mixed precision and ZeRO hand the optimizer flat 1-D partitions (the trace shows it)
    _, _, p, st = ours("llama-3.2-1b", 1, optimizer="adafactor")
    assert st.optimizer == p.trainable * 4
    _, _, p, st = ours("llama-3.2-1b", 4, optimizer="adafactor", precision="fp32", zero_stage=2)
    assert st.optimizer == pytest.approx(p.trainable * 4 / 4)


def test_bf16_pure_has_no_master_weights():
    _, _, p, st = ours("llama-3.2-1b", 1, precision="bf16-pure")
    assert st.master == 0 and st.optimizer == p.trainable * 4


def test_cluster_sizes_scale_states():
    arch = resolve_model("llama-3.1-70b")
    spec = TrainSpec(zero_stage=3)
    small = S.model_states(spec, S.stage_params(arch, spec, arch.layers, True, True), 8)
    big = S.model_states(spec, S.stage_params(arch, spec, arch.layers, True, True), 64)
    assert big.optimizer == pytest.approx(small.optimizer / 8)
    assert parse_gpus("8x8xH100").world_size == 64


_TINY_LLAMA = dict(
    model_type="llama",
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=300,
)
_TINY_MIXTRAL = {
    **_TINY_LLAMA,
    "model_type": "mixtral",
    "intermediate_size": 96,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}


@pytest.mark.parametrize("hf", [_TINY_LLAMA, _TINY_MIXTRAL], ids=["llama", "mixtral-fused-experts"])
@pytest.mark.parametrize("targets", ["all-linear", "all-linear,embed_tokens,lm_head", "q_proj,lm_head", "embed_tokens"])
def test_lora_trainable_count_is_what_peft_builds(hf, targets):
    """all-linear on transformers >= 5: PEFT wraps fused expert weights and the router by their
    parameter (ParamWrapper, rank 2r for the fused gate+up); the embedding and the head take PEFT's
    Embedding and Linear adapters; the count must be PEFT's own."""
    pytest.importorskip("peft")
    from launcher.models.hf_config import arch_from_hf_config
    from launcher.train.model import build_model

    spec = TrainSpec(method="lora", precision="fp32", lora_r=8, lora_targets=targets)
    if hf is _TINY_MIXTRAL and targets.startswith("all-linear,"):
        with pytest.raises(InvalidSpecError, match="name the block linears instead"):
            S.trainable_params(arch_from_hf_config(hf, "tiny"), spec)
        return
    model = build_model(hf, "", spec, init="random", seed=0, lora_dropout=0.0)
    built = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert S.trainable_params(arch_from_hf_config(hf, "tiny"), spec) == built


def test_qlora_leaves_fused_experts_in_the_compute_dtype():
    """bitsandbytes replaces nn.Linear only; transformers >= 5 keeps MoE experts as bare 3-D
    parameters, so under QLoRA they stay bf16 (most of Mixtral's weight)."""
    arch = resolve_model("mixtral-8x7b")
    q = S.stage_params(arch, TrainSpec(method="qlora"), arch.layers, True, True)
    experts = sum(lin.count * lin.fan_in * lin.fan_out for lin in arch.linears if lin.count == arch.experts)
    assert q.other >= arch.layers * experts
    dense = resolve_model("llama-3.1-8b")
    assert (
        S.stage_params(dense, TrainSpec(method="qlora"), dense.layers, True, True).other
        < 0.2 * dense.total_params
    )


def test_bf16_autocast_states_are_a_bf16_base_and_fp32_adapters():
    """The worker's model under --precision bf16-autocast: frozen weights in bf16, adapters, their
    gradients and AdamW's states in fp32, and no master copy; the model's bytes are the built ones."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from launcher.models.hf_config import arch_from_hf_config
    from launcher.train.model import build_model

    spec = TrainSpec(method="lora", precision="bf16-autocast", lora_r=8)
    model = build_model(_TINY_LLAMA, "", spec, init="random", seed=0, lora_dropout=0.0)
    arch = arch_from_hf_config(_TINY_LLAMA, "tiny")
    p = S.stage_params(arch, spec, arch.layers, True, True)
    built = sum(t.numel() * t.element_size() for t in model.parameters())
    assert S.weight_bytes(spec, p) == built
    trained = [t for t in model.parameters() if t.requires_grad]
    assert {t.dtype for t in trained} == {torch.float32}
    states = S.model_states(spec, p, 1)
    assert states.master == 0 and states.fp32_grads == 0
    assert states.grads == sum(t.numel() * 4 for t in trained)
    assert states.optimizer == 8 * p.trainable
    bf16 = S.model_states(spec.with_(precision="bf16"), p, 1)
    assert states.weights + states.grads + states.master + states.optimizer + states.fp32_grads < (
        bf16.weights + bf16.grads + bf16.master + bf16.optimizer + bf16.fp32_grads
    )


def test_paged_optimizer_states_page_to_host_ram_instead_of_running_out():
    """--optimizer paged-adamw(-8bit): the states are no part of the peak that must fit (unified
    memory: on the GPU where there is room, paged out by the driver where not); what cannot fit
    beside the peak is paged over PCIe every step and needs host RAM."""
    from launcher.memory.estimate import estimate
    from launcher.planner.perf import performance

    arch, cluster = resolve_model("llama-3.1-8b"), parse_gpus("1xA100-80GB")
    spec = TrainSpec(micro_batch=1, seq_len=1024, grad_ckpt="full", precision="bf16-pure", zero_stage=1)
    plain, paged = (estimate(arch, spec.with_(optimizer=o), cluster) for o in ("adamw", "paged-adamw"))
    p = S.stage_params(arch, spec, arch.layers, True, True)
    plain_states = S.optimizer_bytes(spec, p)  # bf16-pure AdamW: 4 B/param
    states = S.optimizer_bytes(spec.with_(optimizer="paged-adamw"), p)  # bitsandbytes' fp32 states: 8
    assert states == 2 * plain_states
    assert plain.components["optimizer_states"] == plain_states
    assert paged.components["optimizer_states"] == 0.0
    assert paged.peak_allocated == pytest.approx(plain.peak_allocated - plain_states)
    # 8B in bf16-pure on 80 GB: 16 GB weights + 16 GB gradients + 32 GB states + activations: the
    # states do not all fit beside the backward, the rest pages over PCIe every step
    assert 0 < paged.paged_overflow <= states
    assert paged.host_components["paged_states"] == paged.paged_overflow
    fast, slow = (performance(arch, spec.with_(optimizer=o), cluster, 1) for o in ("adamw", "paged-adamw"))
    assert slow.breakdown["offload"] == pytest.approx(2 * paged.paged_overflow / (cluster.gpu.pcie_bandwidth_gbs * 1e9))
    assert slow.tokens_per_s < fast.tokens_per_s
    # with room to spare nothing pages
    small = TrainSpec(method="lora", optimizer="paged-adamw-8bit", seq_len=512)
    assert estimate(arch, small, cluster).paged_overflow == 0
