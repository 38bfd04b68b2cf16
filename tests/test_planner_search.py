"""The search: feasibility, ranking and pruning, on a grid of real catalog models and clusters.

Grid (>= 200 cases of model x GPUs x method x sequence): every plan called feasible is within
the budget, the chosen plan is the best-ranked feasible one, and removing the margin never
makes a feasible case infeasible. The pruning is checked against an exhaustive search.
"""

from __future__ import annotations

import itertools

import pytest

from launcher.hardware import parse_gpus
from launcher.memory.constants import GIB
from launcher.memory.estimate import estimate
from launcher.models.catalog import resolve_model
from launcher.parallel.split import TP_FAMILIES
from launcher.planner import space
from launcher.planner.constants import SPEED_UNCERTAINTY
from launcher.planner.perf import performance
from launcher.planner.plans import Request, moving_parts, ranking_speed
from launcher.planner.search import plan, rank_key
from launcher.spec import TrainSpec

MODELS = ["tiny-llama", "gpt2", "qwen2.5-0.5b", "llama-3.2-1b", "llama-3.1-8b", "mixtral-8x7b"]
MODELS += ["falcon-40b", "llama-2-70b", "bloom-176b"]
CLUSTERS = ["1xA100", "8xA100-40GB", "4xRTX4090", "2x8xH100"]
METHODS = ["full", "lora", "qlora"]
SEQS = [512, 4096]
GRID = list(itertools.product(MODELS, CLUSTERS, METHODS, SEQS))


def test_grid_is_large_enough():
    assert len(GRID) >= 200


@pytest.mark.parametrize(("model", "gpus", "method", "seq"), GRID)
def test_feasible_plans_are_within_budget_and_ranked(model, gpus, method, seq):
    cluster = parse_gpus(gpus)
    request = Request(resolve_model(model), cluster, TrainSpec(method=method, seq_len=seq))
    result = plan(request)
    budget = cluster.gpu_memory_gib * GIB * (1 - request.margin)
    for p in result.ranked:
        assert p.estimate.gpu_total <= budget
        assert p.estimate.host_per_node <= cluster.node.cpu_memory_gib * GIB
        assert p.estimate.nvme_per_node <= cluster.node.nvme_gib * GIB
        assert p.dp * p.spec.tp * p.spec.pp == cluster.world_size
        assert p.global_batch == p.spec.micro_batch * p.dp * p.spec.grad_accum == result.global_batch
    assert list(result.ranked) == sorted(result.ranked, key=rank_key)
    if result.ranked:
        assert result.best is result.ranked[0]
        best = result.best
        assert ranking_speed(best.spec, best.perf) == max(ranking_speed(p.spec, p.perf) for p in result.ranked)
        for p in result.ranked:  # faster plans lost only within the uncertainty of their extra parts
            extra = moving_parts(p.spec) - moving_parts(best.spec)
            assert p.perf.tokens_per_s <= best.perf.tokens_per_s / (1 - SPEED_UNCERTAINTY) ** extra * (1 + 1e-9)
        assert not any(r.family == result.best.family for r in result.rejected)
        # no margin: what fitted still fits (speed: tests/test_planner_properties.py)
        assert plan(request.with_(margin=0.0), mode="first").ranked
    else:
        assert result.rejected, "an empty result must say why"
    assert result.evaluated >= result.candidates - result.pruned


@pytest.mark.parametrize(("model", "gpus", "method", "seq"), GRID[::3])
def test_best_mode_finds_the_same_best_plan(model, gpus, method, seq):
    request = Request(resolve_model(model), parse_gpus(gpus), TrainSpec(method=method, seq_len=seq))
    full, best = plan(request), plan(request, mode="best")
    assert best.candidates == full.candidates
    if full.best is None:
        assert best.best is None
    else:
        assert (best.best.spec, best.best.perf, best.best.estimate) == (
            full.best.spec,
            full.best.perf,
            full.best.estimate,
        )


def _exhaustive(request: Request) -> set[TrainSpec]:
    """Every feasible candidate, estimating all of them (no pruning)."""
    base, _ = space.effective_base(request)
    node = request.cluster.node
    out = set()
    for group in space.groups(request, base):
        for micro, accum, _ in group.batches:
            spec = group.spec.with_(micro_batch=micro, grad_accum=accum)
            est = estimate(request.arch, spec, request.cluster)
            if (
                est.gpu_total <= request.budget
                and est.host_per_node <= node.cpu_memory_gib * GIB
                and est.nvme_per_node <= node.nvme_gib * GIB
            ):
                out.add(spec)
    # a chunked loss whose whole-loss twin fits is not a plan (the twin is the same plan, faster), nor
    # an optimizer step in backward whose after-backward twin fits (the same plan, simpler)
    out = {spec for spec in out if spec.optimizer_step == "after-backward" or spec.with_(optimizer_step="after-backward") not in out}
    return {spec for spec in out if spec.loss == "full" or spec.with_(loss="full") not in out}


def test_a_chunked_loss_is_slower_than_its_whole_twin():
    """Why the search drops a chunked candidate whose whole-loss twin fits: the same step with one
    more head forward, and never less memory in the other terms."""
    request = Request(resolve_model("llama-3.1-8b"), parse_gpus("8xA100"), TrainSpec(method="lora"))
    for micro in (1, 2, 4):
        spec = TrainSpec(method="lora", micro_batch=micro, grad_ckpt="full", zero_stage=2, loss="chunked")
        whole = spec.with_(loss="full")
        chunked_perf, whole_perf = (performance(request.arch, s, request.cluster, 8) for s in (spec, whole))
        assert chunked_perf.tokens_per_s < whole_perf.tokens_per_s
        assert chunked_perf.breakdown["recompute"] > whole_perf.breakdown["recompute"]
        chunked_est, whole_est = (estimate(request.arch, s, request.cluster) for s in (spec, whole))
        assert chunked_est.components["logits_loss"] < whole_est.components["logits_loss"] / 1.5


@pytest.mark.parametrize(
    ("model", "gpus", "method", "seq", "global_batch", "extra"),
    [
        ("bloom-176b", "8xA100", "full", 2048, None, {}),
        ("bloom-176b", "8xA100", "lora", 2048, 1024, {}),
        ("llama-2-70b", "2x8xA100-40GB", "full", 4096, 512, {}),
        ("llama-3.1-8b", "1xRTX4090", "qlora", 8192, 64, {}),
        ("mixtral-8x7b", "4xL40S", "lora", 2048, 256, {}),
        ("llama-3.1-8b", "8xA100-40GB", "full", 16384, 256, {}),
        # the optimizer step in backward searched (no accumulation) and found
        ("llama-3.1-8b", "2xRTX4090", "full", 2048, 2, dict(precision="bf16-pure", optimizer="paged-adamw-8bit")),
        ("llama-3.2-3b", "1xA100-40GB", "full", 2048, 2, dict(precision="bf16-pure")),
    ],
)
def test_pruning_loses_no_feasible_plan(model, gpus, method, seq, global_batch, extra):
    request = Request(
        resolve_model(model),
        parse_gpus(gpus),
        TrainSpec(method=method, seq_len=seq, **extra),
        global_batch=global_batch,
    )
    result = plan(request)
    assert {p.spec for p in result.ranked} == _exhaustive(request)
    assert result.pruned > 0
    if extra:
        assert any(p.spec.optimizer_step == "in-backward" for p in result.ranked)


def test_lower_bound_behind_the_pruning():
    """GPU total at accumulation 1 <= at any accumulation, and grows with the micro-batch; host
    RAM and NVMe do not depend on either (what search.py's pruning relies on)."""
    cluster = parse_gpus("2x8xA100")
    for model in ("llama-3.1-8b", "bloom-7b1", "mixtral-8x7b"):
        arch = resolve_model(model)
        for stage, opt, params in space.SHARDINGS:
            for pp, ckpt, method in itertools.product((1, 2, 4), ("none", "selective", "full"), METHODS):
                if pp > 1 and stage >= 2:
                    continue
                base = TrainSpec(
                    method=method,
                    zero_stage=stage,
                    offload_optimizer=opt,
                    offload_params=params,
                    pp=pp,
                    grad_ckpt=ckpt,
                )
                prev = None
                for micro in (1, 2, 4, 8):
                    low = estimate(arch, base.with_(micro_batch=micro), cluster)
                    for accum in (2, 3, 8):
                        est = estimate(arch, base.with_(micro_batch=micro, grad_accum=accum), cluster)
                        assert low.gpu_total <= est.gpu_total
                        assert (est.host_per_node, est.nvme_per_node) == (
                            low.host_per_node,
                            low.nvme_per_node,
                        )
                    if prev is not None:
                        assert prev.gpu_total <= low.gpu_total
                        assert (prev.host_per_node, prev.nvme_per_node) == (
                            low.host_per_node,
                            low.nvme_per_node,
                        )
                    prev = low


def test_pins_restrict_the_search():
    request = Request(
        resolve_model("llama-3.1-8b"),
        parse_gpus("8xA100"),
        TrainSpec(),
        pins=(("zero_stage", 2), ("grad_ckpt", "full"), ("micro_batch", 2)),
    )
    result = plan(request)
    assert result.ranked
    assert {(p.spec.zero_stage, p.spec.grad_ckpt, p.spec.micro_batch) for p in result.ranked} == {
        (2, "full", 2)
    }


def test_pinned_accumulation_without_global_batch():
    request = Request(resolve_model("llama-3.2-1b"), parse_gpus("4xA100"), pins=(("grad_accum", 3),))
    result = plan(request)
    assert result.global_batch is None and result.ranked
    for p in result.ranked:
        assert p.spec.grad_accum == 3 and p.global_batch == p.spec.micro_batch * p.dp * 3


def test_tensor_parallel_divides_heads_stays_in_node_and_avoids_autotp_gaps():
    # AutoTP at pp 1 (ZeRO 0-2); the worker's own TP layers inside pipeline stages (ZeRO-1, the
    # families it splits: Falcon has none, so its TP plans stay at pp 1)
    seen_tp = set()
    for model, gpus in (("bloom-176b", "2x8xA100"), ("llama-3.1-8b", "8xA100"), ("falcon-40b", "8xA100")):
        arch = resolve_model(model)
        request = Request(arch, parse_gpus(gpus), TrainSpec(), margin=0.0)
        for p in plan(request).ranked:
            s = p.spec
            seen_tp.add(s.tp)
            assert arch.heads % s.tp == 0 and arch.kv_heads % s.tp == 0 and s.tp <= 8
            assert s.tp == 1 or (s.zero_stage <= 2 and s.pp == 1) or arch.model_type in TP_FAMILIES
            assert s.pp == 1 or s.zero_stage <= 1
            assert s.pp <= arch.layers
    assert seen_tp - {1}, "no TP plan was ranked: the checks above saw none"


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_adapters_are_never_planned_with_autotp(method):
    """AutoTP would split LoRA's own adapter layers (DeepSpeed then fails to build its optimizer,
    seen with the worker) and cannot split 4-bit weights: at pp 1 adapters train with ZeRO, tp 1.
    Inside pipeline stages the worker's own TP layers split LoRA's adapters with their base
    linears; 4-bit weights cannot be cut there either."""
    request = Request(resolve_model("llama-3.1-70b"), parse_gpus("8xA100"), TrainSpec(method=method))
    ranked = plan(request).ranked
    assert ranked and all(p.spec.tp == 1 or p.spec.pp > 1 for p in ranked)
    if method == "qlora":
        assert {p.spec.tp for p in ranked} == {1}


def test_default_global_batch_is_the_same_for_every_plan():
    request = Request(resolve_model("llama-3.1-8b"), parse_gpus("6xA100"))
    result = plan(request)
    assert result.global_batch == 66  # 64 sequences (full fine-tuning), rounded up to a multiple of 6
    assert {p.global_batch for p in result.ranked} == {66}


@pytest.mark.parametrize(
    ("method", "gpus", "seq", "want"),
    [
        ("lora", "1xRTX4090", 512, 16),  # a fine-tuning recipe's batch, whatever the sequence length
        ("qlora", "1xA100", 8192, 16),
        ("full", "8xA100", 256, 64),
        ("lora", "2x8xH100", 2048, 16),
        ("full", "8x8xA100", 2048, 64),
        ("lora", "8x8xA100", 2048, 64),  # one sequence per GPU where the cluster is larger
    ],
)
def test_the_default_global_batch_is_a_fine_tuning_recipes(method, gpus, seq, want):
    """Not 2^18 tokens (a pre-training figure): with --seq-len 256 that asked 1024 sequences."""
    request = Request(resolve_model("llama-3.1-8b"), parse_gpus(gpus), TrainSpec(method=method, seq_len=seq))
    assert request.resolved_global_batch() == want


def test_no_gpu_with_bf16_plans_fp16():
    result = plan(Request(resolve_model("llama-3.2-1b"), parse_gpus("4xV100")))
    assert result.ranked and all(p.spec.precision == "fp16" for p in result.ranked)
    assert any("fp16" in n for n in result.notes)


def test_selective_recompute_is_not_offered_where_it_is_full_recompute_under_another_name():
    """BLOOM's linears all carry a bias (addmm, which the policy never keeps) and its attention is
    eager: selective would keep exactly what full keeps, so only full is searched, unless pinned."""
    bloom, llama = resolve_model("bloom-560m"), resolve_model("llama-3.2-1b")
    cluster = parse_gpus("1xA100")
    ckpts = {g.spec.grad_ckpt for g in space.groups(Request(bloom, cluster, TrainSpec()), TrainSpec())}
    assert ckpts == {"none", "full"}
    lora = TrainSpec(method="lora")  # LoRA's own matmuls give selective something to keep
    assert "selective" in {g.spec.grad_ckpt for g in space.groups(Request(bloom, cluster, lora), lora)}
    assert "selective" in {
        g.spec.grad_ckpt for g in space.groups(Request(llama, cluster, TrainSpec()), TrainSpec())
    }
    pinned = Request(bloom, cluster, TrainSpec(grad_ckpt="selective"), pins=(("grad_ckpt", "selective"),))
    assert {g.spec.grad_ckpt for g in space.groups(pinned, TrainSpec(grad_ckpt="selective"))} == {"selective"}


def test_fused_experts_are_never_planned_or_estimated_with_autotp():
    """AutoTP replaces nn.Linear only; transformers >= 5 keeps MoE experts as fused parameters,
    which TP would leave whole on every rank."""
    from launcher.errors import InvalidSpecError

    mixtral, cluster = resolve_model("mixtral-8x7b"), parse_gpus("8xH100")
    assert space.tp_degrees(Request(mixtral, cluster, TrainSpec())) == [1]
    with pytest.raises(InvalidSpecError, match="AutoTP splits only nn.Linear"):
        estimate(mixtral, TrainSpec(tp=2), cluster)
