"""ZeRO++ hierarchical partitioning (--hpz): ZeRO-3 keeps a second copy of the 16-bit weights
sharded over a node's GPUs, so the backward gathers inside the node. Counted by the memory model,
the speed model and the search; refused where it cannot run. DeepSpeed's own engine runs it in
tests/test_zero_memory.py (its memory) and tests/test_train_e2e.py (its loss curve)."""

from __future__ import annotations

import pytest

from launcher.cli import main
from launcher.hardware import parse_gpus
from launcher.memory import states as S
from launcher.memory.estimate import estimate
from launcher.models.catalog import resolve_model
from launcher.planner import constants as C
from launcher.planner.perf import dp_bandwidth, performance
from launcher.planner.plans import Request, moving_parts, sharding_label
from launcher.planner.search import plan
from launcher.spec import TrainSpec

LLAMA70 = resolve_model("llama-3.1-70b")
FOUR_NODES = parse_gpus("4x8xA100-80GB")
ZERO3 = TrainSpec(zero_stage=3, micro_batch=2, grad_ckpt="full")


def test_the_secondary_shard_is_a_nodes_share_of_the_16_bit_weights_from_backward_to_step():
    """Made as the backward releases each module, dropped after the step: counted where the
    gradients set the peak (a short micro-batch), not at the start of the backward."""
    p = S.stage_params(LLAMA70, ZERO3, LLAMA70.layers, True, True)
    extra = S.weight_bytes(ZERO3, p) / 8
    assert S.model_states(ZERO3.with_(hpz=8), p, 32).secondary == pytest.approx(extra)
    assert S.model_states(ZERO3, p, 32).secondary == 0
    short = ZERO3.with_(micro_batch=1, seq_len=128, grad_ckpt="full")
    plain, hpz = estimate(LLAMA70, short, FOUR_NODES), estimate(LLAMA70, short.with_(hpz=8), FOUR_NODES)
    assert hpz.peak_phase in ("backward end", "optimizer step", "first block backward"), hpz.peak_phase
    assert hpz.components["weights"] - plain.components["weights"] == pytest.approx(extra)
    assert hpz.host_per_node == plain.host_per_node
    long = ZERO3.with_(micro_batch=8, seq_len=4096, grad_ckpt="none")
    a, b = estimate(LLAMA70, long, FOUR_NODES), estimate(LLAMA70, long.with_(hpz=8), FOUR_NODES)
    assert a.peak_phase == b.peak_phase == "backward start" and a.gpu_total == b.gpu_total


def test_the_backward_gathers_over_the_node_link():
    """Forward gather and gradient reduce-scatter still cross the nodes; the backward gather runs
    over NVLink among the 8 ranks of a node, with 7 ring hops instead of 31."""
    slow = parse_gpus("4x8xA100-80GB", inter_node_bandwidth_gbs=3)
    plain = performance(LLAMA70, ZERO3, slow, 32).breakdown["zero_comm"]
    hpz = performance(LLAMA70, ZERO3.with_(hpz=8), slow, 32).breakdown["zero_comm"]
    p = S.stage_params(LLAMA70, ZERO3, LLAMA70.layers, True, True)
    weights = S.weight_bytes(ZERO3, p)
    network, nvlink = dp_bandwidth(slow, 1, 32), slow.gpu.intra_node_bandwidth_gbs * 1e9
    saved = 31 / 32 * weights / network - 7 / 8 * weights / nvlink
    saved += LLAMA70.layers * len(LLAMA70.linears) * (31 - 7) * C.COLLECTIVE_HOP_LATENCY_S
    # OVERLAP hides a fixed share of the smaller transfer: with the communication longer than the
    # compute window either way, the saving shows in full
    assert plain - hpz == pytest.approx(saved, rel=1e-6)


def test_searched_across_nodes_only_and_counted_as_a_moving_part():
    assert moving_parts(ZERO3.with_(hpz=8)) == moving_parts(ZERO3) + 1
    assert sharding_label(ZERO3.with_(hpz=8)) == "ZeRO-3 + hpZ 8"
    pins = (("zero_stage", 3),)
    one_node = plan(Request(LLAMA70, parse_gpus("8xA100-80GB"), TrainSpec(), pins))
    assert all(p.spec.hpz == 1 for p in one_node.ranked)
    slow = parse_gpus("4x8xA100-80GB", inter_node_bandwidth_gbs=3)
    result = plan(Request(LLAMA70, slow, TrainSpec(), pins))
    assert {p.spec.hpz for p in result.ranked} == {1, 8}
    assert all(p.spec.offload_params == "none" for p in result.ranked if p.spec.hpz > 1)
    # over a 3 GB/s network hpZ halves the weight traffic that crosses it: faster by more than the
    # error band, so it wins
    best = result.best
    assert best.spec.hpz == 8
    twin = [p for p in result.ranked if p.spec == best.spec.with_(hpz=1)]
    assert twin and best.perf.tokens_per_s > twin[0].perf.tokens_per_s / (1 - C.SPEED_UNCERTAINTY)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--hpz", "8", "--zero-stage", "2"], "needs --zero-stage 3"),
        (["--hpz", "8", "--offload-params", "cpu"], "needs --zero-stage 3 with the parameters on the GPU"),
        (["--hpz", "16"], "stay inside a node of 8 GPUs"),
        (["--hpz", "3"], "stay inside a node of 8 GPUs"),
    ],
)
def test_bad_hpz_is_one_line_and_exit_2(argv, words, capsys):
    code = main(["plan", "--model", "llama-3.1-70b", "--gpus", "4x8xA100-80GB", *argv])
    err = capsys.readouterr().err
    assert code == 2 and words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_estimate_takes_hpz_and_checks_it_against_the_gpu_count(capsys):
    base = ["estimate", "--model", "llama-3.1-70b", "--gpus", "2x8xA100-80GB", "--zero-stage", "3"]
    assert main([*base, "--hpz", "8", "--json"]) == 0
    capsys.readouterr()
    assert main([*base, "--hpz", "3"]) == 2
    assert "--hpz 3 does not divide the 16 GPUs" in capsys.readouterr().err
