"""The performance model: each term against its formula, and the directions that must hold."""

from __future__ import annotations

import pytest

from launcher.hardware import parse_gpus
from launcher.models.catalog import resolve_model
from launcher.planner import constants as C
from launcher.planner.perf import (
    TERMS,
    cpu_adam_rate,
    dp_bandwidth,
    elementwise_bytes,
    gemm_shape,
    matmul_efficiency,
    peak_flops,
    performance,
)
from launcher.spec import TrainSpec

LLAMA = resolve_model("llama-3.1-8b")
A100x8 = parse_gpus("8xA100")


def perf(spec: TrainSpec, cluster=A100x8, arch=LLAMA):
    dp = cluster.world_size // (spec.tp * spec.pp)
    return performance(arch, spec, cluster, dp)


def test_breakdown_sums_to_step_time_and_gives_tokens_per_s():
    spec = TrainSpec(zero_stage=3, micro_batch=2, grad_accum=4, grad_ckpt="full", offload_optimizer="cpu")
    p = perf(spec)
    assert set(p.breakdown) == set(TERMS)
    assert sum(p.breakdown.values()) == pytest.approx(p.step_time_s)
    assert p.tokens_per_s == pytest.approx(2 * 2048 * 8 * 4 / p.step_time_s)
    assert 0 < p.mfu < C.MATMUL_EFFICIENCY


def test_full_fine_tuning_compute_is_six_n_per_token():
    spec = TrainSpec(grad_accum=4)
    p = perf(spec)
    tokens_per_gpu = 2048 * 4
    six_n = 6 * LLAMA.active_params_per_token * tokens_per_gpu / (312e12 * C.MATMUL_EFFICIENCY)
    # 6N less the embedding lookup (no matmul), plus causal attention: within 10 %
    assert p.breakdown["compute"] == pytest.approx(six_n, rel=0.10)


def test_lora_skips_weight_gradients_and_recompute_adds_a_forward():
    full = perf(TrainSpec(grad_accum=4)).breakdown
    lora = perf(TrainSpec(method="lora", grad_accum=4)).breakdown
    assert lora["compute"] == pytest.approx(full["compute"] * 2 / 3, rel=0.05)
    ckpt_full = perf(TrainSpec(grad_accum=4, grad_ckpt="full")).breakdown
    ckpt_sel = perf(TrainSpec(grad_accum=4, grad_ckpt="selective")).breakdown
    assert full["recompute"] == 0
    assert ckpt_full["recompute"] == pytest.approx(full["compute"] / 3, rel=0.10)
    assert 0 < ckpt_sel["recompute"] < ckpt_full["recompute"]


def test_qlora_pays_dequantisation_lora_does_not():
    assert perf(TrainSpec(method="qlora", grad_accum=4)).breakdown["dequant"] > 0
    assert perf(TrainSpec(method="lora", grad_accum=4)).breakdown["dequant"] == 0


def test_fp32_runs_at_the_non_tensor_core_rate():
    bf16 = perf(TrainSpec(grad_accum=4)).breakdown["compute"]
    fp32 = perf(TrainSpec(grad_accum=4, precision="fp32")).breakdown["compute"]
    assert fp32 / bf16 == pytest.approx(312 / 19.5)
    gpu = parse_gpus("1xA100", gpu_memory_gib=40).gpu
    assert peak_flops(gpu, "fp32") == 19.5e12  # the table is keyed by name, not by memory


def test_tensor_parallel_all_reduces_only_when_tp_is_above_one():
    assert perf(TrainSpec(grad_accum=4)).breakdown["tp_comm"] == 0
    tp2 = perf(TrainSpec(grad_accum=4, tp=2)).breakdown
    tokens, hidden = 2048, LLAMA.hidden
    per_mb = LLAMA.layers * 4 * 2 * (1 / 2) * tokens * hidden * 2 / 300e9
    # AutoTP's column-parallel LM head: its logits all-gathered, its input's gradient all-reduced
    per_mb += (1 / 2) * tokens * (LLAMA.vocab + 2 * hidden) * 2 / 300e9
    assert tp2["tp_comm"] == pytest.approx(4 * per_mb)


def test_the_lm_head_is_split_over_the_tensor_parallel_group():
    """DeepSpeed's AutoTP training splits the LM head's rows over the TP ranks (measured: tiny-llama's
    512 x 64 head is 256 x 64 on each of 2 ranks), so its FLOPs and its weights are split too."""
    from launcher.memory.states import stage_params

    tp1, tp2 = TrainSpec(grad_accum=4), TrainSpec(grad_accum=4, tp=2)
    # half the work, a little slower per FLOP on the narrower GEMMs; an unsplit head (~13 % of an
    # 8B Llama's FLOPs with its 128k vocabulary) would leave the ratio near 0.57
    ratio = perf(tp2).breakdown["compute"] / perf(tp1).breakdown["compute"]
    assert 0.5 < ratio < 0.52
    # the TP rank no longer holds half of every block linear and half of the head (Llama: no biases)
    one, two = (stage_params(LLAMA, s, LLAMA.layers, True, True).total for s in (tp1, tp2))
    assert one - two == (LLAMA.layers * LLAMA.linear_params_per_layer + LLAMA.lm_head_params) / 2


def test_pipeline_bubble_is_pp_minus_one_slots():
    spec = TrainSpec(pp=4, grad_accum=8, zero_stage=1)
    p = perf(spec)
    per_step = sum(p.breakdown[k] for k in ("zero_comm", "optimizer", "offload", "overhead"))
    slots = p.step_time_s - per_step
    assert p.breakdown["pp_bubble"] == pytest.approx(slots * 3 / (8 + 3))


def test_zero3_moves_more_than_zero2_and_offload_to_nvme_is_slowest():
    z2 = perf(TrainSpec(zero_stage=2, grad_accum=4)).breakdown["zero_comm"]
    z3 = perf(TrainSpec(zero_stage=3, grad_accum=4)).breakdown["zero_comm"]
    assert z3 > z2 > 0
    cpu = perf(TrainSpec(zero_stage=3, offload_optimizer="cpu", grad_accum=4))
    nvme = perf(TrainSpec(zero_stage=3, offload_optimizer="nvme", offload_params="nvme", grad_accum=4))
    assert nvme.breakdown["offload"] > cpu.breakdown["offload"] > 0
    assert nvme.tokens_per_s < cpu.tokens_per_s


def test_data_parallel_bandwidth_inside_and_across_nodes():
    one = parse_gpus("8xA100")
    two = parse_gpus("2x8xA100")
    assert dp_bandwidth(one, 1, 8) == 300e9  # NVLink
    assert dp_bandwidth(two, 1, 16) == 200e9  # the node's 8 NICs
    assert dp_bandwidth(two, 8, 2) == 25e9  # one rank per node: one NIC's share
    assert dp_bandwidth(two, 2, 8) == 100e9


def test_more_gpus_in_data_parallel_means_less_time_per_step():
    small = perf(TrainSpec(zero_stage=2, grad_accum=8), parse_gpus("4xA100"))
    large = perf(TrainSpec(zero_stage=2, grad_accum=4), A100x8)
    assert large.step_time_s < small.step_time_s


def test_fast_gpus_reach_a_smaller_fraction_of_their_peak_in_16_bit_only():
    """H100-class matmuls run at FAST_GPU_EFFICIENCY_RATIO of the A100-class efficiency (MosaicML's
    same-code A100/H100 pairs); fp32 (no tensor cores) keeps the plain efficiency."""
    a100, h100 = parse_gpus("A100").gpu, parse_gpus("H100").gpu
    assert matmul_efficiency(a100, "bf16") == C.MATMUL_EFFICIENCY
    assert matmul_efficiency(h100, "bf16") == pytest.approx(C.MATMUL_EFFICIENCY * C.FAST_GPU_EFFICIENCY_RATIO)
    assert matmul_efficiency(h100, "fp32") == C.MATMUL_EFFICIENCY
    spec = TrainSpec(grad_accum=4)
    on_a100 = perf(spec).breakdown["compute"]
    on_h100 = perf(spec, parse_gpus("8xH100")).breakdown["compute"]
    expected = (989 / 312) * C.FAST_GPU_EFFICIENCY_RATIO
    assert on_a100 / on_h100 == pytest.approx(expected)


def test_gemm_shape_factor_falls_with_small_matrices_and_tp_splits():
    """Each GEMM dimension d reaches d / (d + GEMM_HALF_DIM) of the large-matrix rate: a TP split
    narrows the matrices, a short micro-batch narrows the token dimension."""
    whole = gemm_shape(LLAMA, 1, 4096)
    assert gemm_shape(LLAMA, 8, 4096) < whole < 1
    assert gemm_shape(LLAMA, 1, 64) < whole
    half = C.GEMM_HALF_DIM
    assert gemm_shape(LLAMA, 1, 10**12) == pytest.approx(
        sum(lin.weight_params for lin in LLAMA.linears)
        / sum(lin.weight_params / (lin.fan_in / (lin.fan_in + half) * lin.fan_out / (lin.fan_out + half)) for lin in LLAMA.linears),
        rel=1e-6,
    )


def test_elementwise_work_weighs_more_on_small_models_and_fast_gpus():
    """The memory-bound work between matmuls scales with the width, the matmuls with its square:
    a small model spends a larger share of its step there, and so does a GPU whose FLOPs grew
    faster than its memory bandwidth."""
    small = resolve_model("llama-3.2-1b")

    def share(arch, cluster=A100x8):
        b = perf(TrainSpec(grad_accum=4), cluster, arch).breakdown
        return b["elementwise"] / (b["compute"] + b["elementwise"])

    assert share(small) > share(LLAMA) > 0
    assert share(LLAMA, parse_gpus("8xH100")) > share(LLAMA)
    b = perf(TrainSpec(grad_accum=4)).breakdown
    per_token = elementwise_bytes(LLAMA, TrainSpec()) * LLAMA.layers / (A100x8.gpu.hbm_bandwidth_gbs * 1e9)
    assert b["elementwise"] == pytest.approx(4 * 2048 * per_token)


def test_zero3_communication_has_a_floor_at_small_micro_batches():
    """175B under ZeRO-3 on 512 GPUs: the per-layer gathers move the same bytes (and pay the same
    ring latency) whatever the micro-batch, so halving the micro-batch does not nearly halve a
    micro-batch's time, and at a fixed global batch the step gets slower."""
    gpt3 = resolve_model("bloom-176b")
    cluster = parse_gpus("64x8xA100")
    base = dict(zero_stage=3, seq_len=2048, grad_ckpt="full")
    two = perf(TrainSpec(micro_batch=2, grad_accum=1, **base), cluster, gpt3)
    one = perf(TrainSpec(micro_batch=1, grad_accum=2, **base), cluster, gpt3)
    # compute halves with the micro-batch, the gathers do not: a micro-batch of 1 takes well over
    # half the time of a micro-batch of 2, and the step (two of them) is slower by their bytes
    per_mb = one.step_time_s / 2
    assert per_mb > 0.55 * two.step_time_s
    # (and a little more: the shorter token dimension fills the GEMM tiles less)
    assert one.step_time_s - two.step_time_s >= one.breakdown["zero_comm"] / 2 > 0
    # the ring latency: (dp - 1) hops per collective, three collectives per linear module of each
    # layer and micro-batch
    no_latency = C.COLLECTIVE_HOP_LATENCY_S
    try:
        C.COLLECTIVE_HOP_LATENCY_S = 0.0
        without = perf(TrainSpec(micro_batch=1, grad_accum=2, **base), cluster, gpt3).breakdown["zero_comm"]
    finally:
        C.COLLECTIVE_HOP_LATENCY_S = no_latency
    latency = 3 * gpt3.layers * len(gpt3.linears) * (512 - 1) * no_latency
    # (compute outlasts the gathers here, so OVERLAP hides its share of the latency too)
    assert one.breakdown["zero_comm"] - without == pytest.approx(2 * latency * (1 - C.OVERLAP), rel=1e-6)


def test_cpu_cores_set_the_cpu_adam_term_as_its_formula_says():
    """CPU Adam runs at min(cores x CPU_ADAM_PARAMS_PER_CORE, host bandwidth x HOST_STREAM_FRACTION /
    CPU_ADAM_BYTES_PER_PARAM) parameters/s per node; --cpu-cores scales the node's cores and, with
    them, its memory channels."""
    spec = TrainSpec(zero_stage=2, offload_optimizer="cpu", grad_accum=4)
    default = parse_gpus("1xA100")
    few = parse_gpus("1xA100", cpu_cores=2)
    many = parse_gpus("1xA100", cpu_cores=64)
    assert few.node.cpu_cores == 2 and many.node.cpu_cores == 64
    per_core_bw = default.node.host_memory_bandwidth_gbs / default.node.cpu_cores
    assert many.node.host_memory_bandwidth_gbs == pytest.approx(64 * per_core_bw)
    for cluster in (few, default, many):
        node = cluster.node
        rate = min(
            node.cpu_cores * C.CPU_ADAM_PARAMS_PER_CORE,
            node.host_memory_bandwidth_gbs * 1e9 * C.HOST_STREAM_FRACTION / C.CPU_ADAM_BYTES_PER_PARAM,
        )
        assert cpu_adam_rate(node) == pytest.approx(rate)
        assert perf(spec, cluster).breakdown["optimizer"] == pytest.approx(LLAMA.total_params / rate, rel=1e-3)
    assert perf(spec, few).breakdown["optimizer"] > perf(spec, default).breakdown["optimizer"]


def test_a_fixed_cost_per_step():
    assert perf(TrainSpec(grad_accum=4)).breakdown["overhead"] == C.STEP_OVERHEAD_S
