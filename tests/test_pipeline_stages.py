"""The pipeline stage adapters compute what the Hugging Face model computes: the stages run one
after another give the model's own loss and gradients, for every family with an adapter, and the
split is the one the memory model counts."""

from __future__ import annotations

import pytest
import torch

from launcher.models.catalog import resolve_model
from launcher.models.catalog_configs import CONFIGS
from launcher.parallel.split import PIPELINE_FAMILIES, balanced_blocks, even_blocks, pipeline_refusal
from launcher.parallel.stages import boundaries, causal_lm_loss, stage_layers

SHRINK = {
    "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "num_hidden_layers": 3, "vocab_size": 300, "tie_word_embeddings": False,
    "num_local_experts": 4, "num_experts_per_tok": 2, "max_window_layers": 1,
}  # fmt: skip

FAMILIES = {"llama": "llama-3.1-8b", "mistral": "mistral-7b", "mixtral": "mixtral-8x7b",
            "qwen2": "qwen2.5-7b", "qwen3": "qwen3-8b"}  # fmt: skip


def tiny(model_type: str, **over):
    import transformers

    cfg = {**CONFIGS[FAMILIES[model_type]], **SHRINK, **over}
    cfg.pop("model_type")
    cfg = {k: v for k, v in cfg.items() if k not in ("torch_dtype", "dtype")}
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 300, (2, 12), generator=g)
    labels = ids.clone()
    labels[1, 9:] = -100  # a right-padded row
    return ids, labels


def test_every_family_with_an_adapter_is_tested():
    assert set(FAMILIES) == set(PIPELINE_FAMILIES)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_stages_in_sequence_give_the_models_loss_and_gradients(model_type):
    over = {"sliding_window": 4, "use_sliding_window": True} if model_type in ("mistral", "qwen2") else {}
    model = tiny(model_type, **over)
    ids, labels = batch()
    want = model(input_ids=ids, labels=labels).loss
    want.backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    x = ids
    for layer in stage_layers(model):
        x = layer(x)
    got = causal_lm_loss(x, labels)
    got.backward()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want_grads[n], rtol=1e-5, atol=1e-7, msg=n)


def test_the_balanced_split_gives_every_block_and_evens_the_peaks():
    # peaks: stage 0 carries 3 blocks' worth extra (embeddings + micro-batches in flight), the
    # last 2 (LM head + logits): they get fewer blocks, the middle ones more
    def peak(s, n, pp):
        return n + (3 if s == 0 else 0) + (2 if s == pp - 1 else 0)

    for layers, pp in [(2, 2), (32, 4), (80, 3), (70, 12), (30, 4), (80, 8)]:
        blocks = balanced_blocks(layers, pp, lambda s, n, pp=pp: peak(s, n, pp), head_blocks=0.0)
        assert sum(blocks) == layers and len(blocks) == pp and min(blocks) >= 1
        even = even_blocks(layers, pp)
        assert sorted(even) == sorted(blocks) or max(blocks) <= max(even)  # never slower
        peaks = [peak(s, n, pp) for s, n in enumerate(blocks)]
        assert max(peaks) <= max(peak(s, n, pp) for s, n in enumerate(even))
        parts = boundaries(blocks)
        assert parts[0] == 0 and parts[-1] == layers + 2  # embedding first, head last
        assert [b - a for a, b in zip(parts, parts[1:], strict=False)] == [
            blocks[0] + 1, *blocks[1:-1], blocks[-1] + 1
        ]
    # no room without slowing down: 80 / 8 leaves every stage at 10 blocks
    assert balanced_blocks(80, 8, lambda s, n: peak(s, n, 8), head_blocks=0.0) == [10] * 8
    # an LM head worth 2.5 blocks of compute: the others may take up to 12 (10 + 2.5 is the pace),
    # and the first and last stages, heavier in memory, hand blocks to the middle
    assert balanced_blocks(80, 8, lambda s, n: peak(s, n, 8), head_blocks=2.5) == [8, 11, 11, 11, 11, 10, 10, 8]


def test_the_plans_stage_table_is_the_workers_split_placed_pipe_major_with_the_estimates_peak():
    from launcher.hardware import parse_gpus
    from launcher.memory.estimate import estimate, pipeline_stages, stage_split
    from launcher.spec import TrainSpec

    arch, cluster = resolve_model("llama-3.1-70b"), parse_gpus("4x8xA100-80GB")
    for pp, accum in [(4, 16), (8, 2), (16, 32)]:
        spec = TrainSpec(pp=pp, zero_stage=1, micro_batch=1, grad_accum=accum)
        stages = pipeline_stages(arch, spec, cluster)
        dp = cluster.world_size // pp
        assert [s["blocks"][1] - s["blocks"][0] + 1 for s in stages] == stage_split(arch, spec, cluster, dp)
        assert stages[0]["blocks"][0] == 0 and stages[-1]["blocks"][1] == arch.layers - 1
        assert all(a["blocks"][1] + 1 == b["blocks"][0] for a, b in zip(stages, stages[1:], strict=False))
        assert [s["ranks"] for s in stages] == [[i * dp, i * dp + dp - 1] for i in range(pp)]
        assert all(s["nodes"] == sorted({r // 8 for r in range(s["ranks"][0], s["ranks"][1] + 1)}) for s in stages)
        assert [s["micro_batches_in_flight"] for s in stages] == [min(pp - i, accum) for i in range(pp)]
        assert [s["embeddings"] for s in stages] == [True] + [False] * (pp - 1)
        assert [s["lm_head"] for s in stages] == [False] * (pp - 1) + [True]
        # the plan's per-GPU figure is its worst stage
        peak = estimate(arch, spec, cluster).gpu_total / 2**30
        assert max(s["gpu_total_gib"] for s in stages) == pytest.approx(peak, abs=1e-3)
    assert pipeline_stages(arch, TrainSpec(zero_stage=1), cluster) == []


def test_families_without_an_adapter_and_tied_heads_are_refused_with_the_reason():
    bloom = resolve_model("tiny-bloom")
    assert "no pipeline stage adapter" in pipeline_refusal(bloom.model_type, bloom.tied_embeddings, bloom.name)
    small = resolve_model("llama-3.2-1b")
    assert "ties its LM head" in pipeline_refusal(small.model_type, small.tied_embeddings, small.name)
    big = resolve_model("llama-3.1-70b")
    assert pipeline_refusal(big.model_type, big.tied_embeddings, big.name) is None
