"""Advice when nothing fits, hardware selection, and the technique-by-technique ablation.

Every suggestion is applied the way a user would (its flags on the same command line) and
must then plan; "smallest" and "longest" claims are checked one step beyond.
"""

from __future__ import annotations

import json

import pytest

from launcher.cli import main
from launcher.hardware import parse_gpus
from launcher.memory.constants import GIB
from launcher.memory.edges import logits_bytes
from launcher.models.catalog import resolve_model
from launcher.planner import advise
from launcher.planner.ablate import STEPS, ablate
from launcher.planner.plans import Request
from launcher.planner.search import plan
from launcher.planner.select import select
from launcher.spec import TrainSpec


def plan_json(argv, capsys):
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def apply(argv: list[str], flags: dict[str, str]) -> list[str]:
    """argv with each flag set to the suggested value (replaced, or added)."""
    out = list(argv)
    for flag, value in flags.items():
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--model", "bloom-176b", "--gpus", "1xA100"],
        ["plan", "--model", "llama-2-70b", "--gpus", "1xA100"],
        ["plan", "--model", "llama-3.1-8b", "--gpus", "1xRTX4090", "--method", "lora", "--seq-len", "65536"],
        ["plan", "--model", "llama-3.1-70b", "--gpus", "2xL40S", "--cpu-memory", "128", "--nvme", "100"],
    ],
)
def test_every_suggestion_fits_when_applied(argv, capsys):
    code, data = plan_json(argv, capsys)
    capsys.readouterr()
    assert code == 2 and not data["fits"] and data["suggestions"]
    for s in data["suggestions"]:
        code, again = plan_json(apply(argv, s["flags"]), capsys)
        assert code == 0 and again["fits"], s["text"]
        assert again["plans"][0]["perf"]["tokens_per_s"] == pytest.approx(s["plan"]["perf"]["tokens_per_s"])


def test_bloom_full_on_one_gpu_gets_gpus_methods_and_host_ram():
    request = Request(resolve_model("bloom-176b"), parse_gpus("1xA100"))
    result = plan(request)
    kinds = {s.kind for s in advise.suggestions(result)}
    assert {"gpus", "method", "cpu_memory"} <= kinds
    grown = advise.more_gpus(request)
    assert grown.plan.cluster.world_size == 4
    # the smallest on the ladder: 2 GPUs do not fit
    assert not plan(request.with_(cluster=parse_gpus("2xA100")), mode="first").ranked


def test_host_ram_suggestion_is_the_least_that_fits():
    request = Request(resolve_model("bloom-176b"), parse_gpus("1xA100"))
    [host] = [s for s in advise.suggestions(plan(request)) if s.kind == "cpu_memory"]
    need = int(dict(host.flags)["--cpu-memory"])
    assert host.plan.estimate.host_per_node <= need * GIB
    less = parse_gpus("1xA100", cpu_memory_gib=need - 1)
    assert not plan(request.with_(cluster=less)).ranked


def test_sequence_suggestion_is_the_longest_that_fits():
    base = TrainSpec(method="lora", seq_len=65536)
    request = Request(resolve_model("llama-3.1-8b"), parse_gpus("1xRTX4090"), base)
    seq = advise.shorter_sequence(request)
    length = int(dict(seq.flags)["--seq-len"])
    assert length % advise.SEQ_STEP == 0 and length < 65536
    longer = request.with_(base=base.with_(seq_len=length + advise.SEQ_STEP))
    assert not plan(longer).ranked


def test_scale_out_is_the_smallest_cluster_without_offload():
    request = Request(resolve_model("llama-2-70b"), parse_gpus("8xA100-40GB"))
    best = plan(request).best
    assert best.spec.offload_optimizer != "none" or best.spec.offload_params != "none"
    out = advise.scale_out(request)
    assert out.plan.spec.offload_optimizer == out.plan.spec.offload_params == "none"
    nodes = out.plan.cluster.nodes
    assert nodes >= 2
    fewer = parse_gpus(f"{nodes - 1}x8xA100-40GB")
    pinned = request.with_(cluster=fewer, pins=(("offload_optimizer", "none"), ("offload_params", "none")))
    assert not plan(pinned).ranked


def test_selection_gives_the_smallest_count_sorted_by_cost():
    arch = resolve_model("llama-3.1-8b")
    sel = select(arch, TrainSpec(method="lora"), prices={"H100-80GB": 0.5}, run_tokens=1e9)
    costs = [c.cost_per_million_tokens for c in sel.choices]
    assert costs == sorted(costs)
    by_gpu = {}
    for c in sel.choices:
        by_gpu.setdefault(c.plan.cluster.gpu.name, []).append(c)
        assert c.run_cost == pytest.approx(
            1e9 / c.plan.perf.tokens_per_s / 3600 * c.gpus * c.price_per_gpu_hour
        )
    assert by_gpu["H100-80GB"][0].price_per_gpu_hour == 0.5
    for name, choices in by_gpu.items():
        smallest = [c for c in choices if c.smallest]
        assert len(smallest) == 1
        count = smallest[0].gpus
        if count > 1:  # one rung down does not fit
            cluster = parse_gpus(f"{count // 2}x{name}")
            assert not plan(Request(arch, cluster, TrainSpec(method="lora")), mode="first").ranked
        for c in choices:
            if not c.smallest:
                assert c.gpus > count and c.cost_per_million_tokens < smallest[0].cost_per_million_tokens


def test_selection_cli(capsys):
    argv = ["plan", "--model", "qwen2.5-7b", "--method", "qlora", "--tokens", "500M", "--price", "A100=1"]
    code, data = plan_json(argv, capsys)
    assert code == 0 and data["choices"]
    a100 = [c for c in data["choices"] if c["gpu"] == "A100-80GB"]
    assert a100 and a100[0]["price_per_gpu_hour_usd"] == 1 and a100[0]["run_tokens"] == 5e8
    assert main(argv) == 0
    assert "what to rent" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("model", "gpus"), [("llama-3.1-8b", "8xA100"), ("llama-2-70b", "8xA100"), ("mistral-7b", "4xL40S")]
)
def test_ablation_memory_falls_where_it_must(model, gpus):
    rows = ablate(Request(resolve_model(model), parse_gpus(gpus)))
    assert [r.label.split(" (")[0] for r in rows][0].startswith("baseline") and len(rows) == len(STEPS)
    gpu = [r.estimate.gpu_total for r in rows]
    # checkpointing, each ZeRO stage (dp > 1), offload, LoRA and QLoRA never add GPU memory
    for i in (1, 4, 5, 6, 7, 8, 9):
        assert gpu[i] <= gpu[i - 1], rows[i].label
    assert gpu[9] < 0.5 * gpu[0]
    # the chunked loss (2 chunks, the head frozen) shrinks the loss's working set; where that is not
    # the peak it adds only the head input it keeps for its recompute (one hidden state)
    arch, qlora = resolve_model(model), TrainSpec(method="qlora")
    assert logits_bytes(arch, qlora.with_(loss="chunked")) < 0.6 * logits_bytes(arch, qlora)
    assert gpu[10] <= gpu[9] + 1.1 * (2048 * arch.hidden * 2 + 8 * 2048)  # (and its allocator margin)
    speed = [r.perf.tokens_per_s for r in rows]
    assert speed[1] < speed[0]  # recompute costs time
    assert speed[2] > speed[1]  # bf16 tensor cores
    assert speed[7] < speed[6]  # offload costs time
    assert speed[10] < speed[9]  # so does the chunked loss's second head forward
    assert speed[11] > speed[10] and gpu[11] == gpu[10]  # compiled blocks: faster, the same memory plan
    assert any(r.fits for r in rows)
