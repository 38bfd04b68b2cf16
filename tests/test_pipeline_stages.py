"""The pipeline stage adapters compute what the Hugging Face model computes: the stages run one
after another give the model's own loss and gradients, for every family with an adapter, and the
split is the one the memory model counts."""

from __future__ import annotations

import pytest
import torch

from launcher.models.catalog import resolve_model
from launcher.models.catalog_configs import CONFIGS
from launcher.parallel.split import PIPELINE_FAMILIES, balanced_blocks, even_blocks, pipeline_refusal
from launcher.parallel.stages import boundaries, causal_lm_loss, run_layers, stage_layers

_LLAMA = {
    "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "num_hidden_layers": 3, "vocab_size": 300, "tie_word_embeddings": False,
    "num_local_experts": 4, "num_experts_per_tok": 2, "max_window_layers": 1,
}  # fmt: skip
_SMALL = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_hidden_layers": 3,
          "vocab_size": 300}  # fmt: skip
_NO_DROPOUT = {"attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "dropout": 0.0, "hidden_dropout": 0.0,
               "attention_dropout": 0.0}  # fmt: skip
# a catalog model of every family, and the settings that make it tiny
FAMILIES = {
    "llama": ("llama-3.1-8b", _LLAMA), "mistral": ("mistral-7b", _LLAMA), "mixtral": ("mixtral-8x7b", _LLAMA),
    "qwen2": ("qwen2.5-7b", _LLAMA), "qwen3": ("qwen3-8b", _LLAMA),
    "gemma": ("gemma-2b", {**_LLAMA, "num_key_value_heads": 1, "tie_word_embeddings": True}),
    "stablelm": ("stablelm-3b", {**_SMALL, "num_key_value_heads": 4}),
    "phi": ("phi-2", {**_SMALL, "num_key_value_heads": 4}),
    "gpt_neox": ("gpt-neox-20b", _SMALL),
    "falcon": ("falcon-40b", {**_SMALL, "num_kv_heads": 2}),
    "gpt2": ("gpt2", {"n_embd": 64, "n_head": 4, "n_layer": 3, "n_positions": 64, "vocab_size": 300}),
    "bloom": ("bloom-560m", {"hidden_size": 64, "n_head": 4, "n_layer": 3, "vocab_size": 300}),
    "opt": ("opt-1.3b", {**_SMALL, "ffn_dim": 96, "word_embed_proj_dim": 64}),
}  # fmt: skip
# the other shapes a family comes in: tied heads, Falcon-7B's multi-query old architecture,
# OPT-350M's post-norm with input / output projections
VARIANTS = {
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),
    "falcon-7b": ("falcon", {"new_decoder_architecture": False, "multi_query": True}),
    "opt-350m": ("opt", {"do_layer_norm_before": False, "word_embed_proj_dim": 32}),
    "gpt_neox-tied": ("gpt_neox", {"tie_word_embeddings": True}),
}  # fmt: skip


def tiny_config(model_type: str, **over) -> dict:
    """config.json contents of a tiny model of the family (3 blocks, no dropout)."""
    name, shrink = FAMILIES[model_type]
    cfg = {**CONFIGS[name], **shrink, **_NO_DROPOUT, **over}
    return {k: v for k, v in cfg.items() if k not in ("torch_dtype", "dtype")}


def tiny(model_type: str, **over):
    import transformers

    cfg = tiny_config(model_type, **over)
    cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    config._attn_implementation = "eager" if model_type == "bloom" else "sdpa"
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


@pytest.mark.parametrize("variant", sorted(FAMILIES) + sorted(VARIANTS))
def test_stages_in_sequence_give_the_models_loss_and_gradients(variant):
    model_type, over = VARIANTS.get(variant, (variant, {}))
    if model_type in ("mistral", "qwen2"):
        over = {**over, "sliding_window": 4, "use_sliding_window": True}
    model = tiny(model_type, **over)
    assert model.config.tie_word_embeddings == ("tied" in variant or model_type in ("gemma", "gpt2", "bloom", "opt", "falcon"))
    ids, labels = batch()
    want = model(input_ids=ids, labels=labels).loss
    want.backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    got = causal_lm_loss(run_layers(stage_layers(model), ids), labels)
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
        assert parts[0] == 0 and parts[-1] == layers + 4  # embedding (+ Enter) first, (Exit +) head last
        assert [b - a for a, b in zip(parts, parts[1:], strict=False)] == [
            blocks[0] + 2, *blocks[1:-1], blocks[-1] + 2
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


def test_families_without_an_adapter_and_alibi_falcons_are_refused_with_the_reason():
    qwen = resolve_model("qwen-7b")  # remote-code Qwen (v1): transformers has no module tree for it
    assert "no pipeline stage adapter" in pipeline_refusal(qwen.model_type, qwen.name)
    assert "ALiBi" in pipeline_refusal("falcon", "falcon-rw-1b", alibi=True)
    for name in ("llama-3.2-1b", "llama-3.1-70b", "bloom-176b", "gpt2", "falcon-180b", "opt-66b"):
        arch = resolve_model(name)  # tied heads included (llama-3.2-1b, bloom, gpt2, opt)
        assert pipeline_refusal(arch.model_type, arch.name, bool(arch.hf_config.get("alibi"))) is None, name


def test_tensor_parallel_layers_refuse_what_they_cannot_split_with_the_numbers():
    from launcher.parallel.split import TP_FAMILIES, tensor_parallel_refusal, vocab_shards

    assert tensor_parallel_refusal("llama", 32, 8, 128256, 8) is None
    assert tensor_parallel_refusal("llama", 32, 8, 128256, 1) is None
    assert "its 2 KV heads cannot be split evenly over tp 4" in tensor_parallel_refusal("llama", 32, 2, 128256, 4)
    assert "its 50257 vocabulary rows cannot be split evenly over tp 2" in tensor_parallel_refusal("bloom", 16, 16, 50257, 2)
    assert "falcon has no tensor-parallel layers" in tensor_parallel_refusal("falcon", 64, 8, 65024, 2)
    assert set(TP_FAMILIES) <= set(PIPELINE_FAMILIES)
    assert (vocab_shards(4, 12), vocab_shards(4, 1), vocab_shards(1, 4)) == (4, 1, 1)
