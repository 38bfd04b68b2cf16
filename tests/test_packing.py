"""--packing (launcher/train/packing.py): rows hold every sample once and never overflow; a packed
batch has the loss and gradients of the same samples unpacked, in every family packing accepts and
with both attention kernels that run on a CPU; the families it refuses really do mix samples; the
planner and the CLI keep packing off the pipeline engine."""

from __future__ import annotations

import json
import random

import pytest

from launcher.cli import main
from launcher.models.hf_families import PACKED_FAMILIES, packing_refusal
from launcher.train.data import IGNORE, Batches, tokenize
from launcher.train.packing import pack, packed

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 256}
# the keys each family's tiny config needs beyond SMALL (grouped K/V wherever the family has it)
FAMILY = {
    "llama": {}, "mistral": {}, "qwen2": {}, "qwen3": {"head_dim": 16}, "gemma": {"head_dim": 16},
    "gemma2": {"head_dim": 16}, "mixtral": {"num_local_experts": 2}, "phi": {}, "stablelm": {},
    "gpt_neox": {}, "falcon": {"new_decoder_architecture": True, "num_kv_heads": 2},
    "falcon-multi-query": {"model_type": "falcon", "multi_query": True, "new_decoder_architecture": False},
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256},
}
REFUSED = {"bloom": {"n_layer": 2, "n_head": 4}, "opt": {"ffn_dim": 128, "word_embed_proj_dim": 64}}
LENGTHS = (30, 11, 4, 19, 7)


@pytest.fixture(scope="module")
def tok():
    from launcher.train.tokenizer import byte_tokenizer

    return byte_tokenizer()


def examples(tok, lengths=LENGTHS, seq_len=64):
    rows = [{"text": "".join(chr(97 + (i * 7 + j) % 26) for j in range(n))} for i, n in enumerate(lengths)]
    return tokenize([(f"record {i + 1}", r) for i, r in enumerate(rows)], tok, seq_len, "f")


def test_rows_hold_every_sample_once_and_never_overflow():
    rng = random.Random(0)
    lengths = [rng.randint(1, 512) for _ in range(5000)] + [512, 512, 1]
    rows = pack(lengths, 512)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 512 for row in rows)
    # best fit decreasing: within a row more than the bound of a plain lower bound would allow
    assert len(rows) <= 1.05 * sum(lengths) / 512 + 2
    assert rows == pack(lengths, 512)  # the same on every rank
    assert pack([3, 5, 2], 5) == [[1], [0, 2]]  # 5 alone; 3 then 2 into the room it leaves
    with pytest.raises(ValueError, match="has 6 tokens"):
        pack([6], 5)


def test_a_packed_row_restarts_positions_and_ignores_each_samples_first_label(tok):
    ex = examples(tok)
    out, info = packed(ex, 64)
    lengths = [len(s) for s in ex.input_ids]
    assert info == {"samples": 5, "rows": len(out.input_ids), "fill": round(sum(lengths) / (64 * len(out.input_ids)), 4)}
    inputs, tokens = Batches(out, len(out.input_ids), 1, 1, 0, tok.pad_token_id).get(0, 0, 0)
    assert tokens == sum(lengths)  # real tokens only
    ids, pos, lab = inputs["input_ids"].tolist(), inputs["position_ids"].tolist(), inputs["labels"].tolist()
    found = []
    for b in range(len(ids)):
        starts = [t for t, p in enumerate(pos[b]) if p == 0] + [len(pos[b])]
        for t0, t1 in zip(starts, starts[1:], strict=False):
            assert pos[b][t0:t1] == list(range(t1 - t0))
            assert lab[b][t0] == IGNORE  # nothing before a sample's first token predicts it
            if any(x != IGNORE for x in lab[b][t0:t1]):
                found.append(ids[b][t0:t1])
            else:  # the padding after the row's last sample
                assert set(ids[b][t0:t1]) == {tok.pad_token_id} and t1 == len(pos[b])
    assert sorted(found) == sorted(list(s) for s in ex.input_ids)


def _model(model_type: str, extra: dict, attention: str, vocab: int):
    import torch
    import transformers

    extra = dict(extra)
    cfg = transformers.AutoConfig.for_model(extra.pop("model_type", model_type), **{**SMALL, **extra, "vocab_size": vocab})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attention)
    model.config.use_cache = False
    return model.eval()  # dropout off (gpt2, phi, ... default to some): the same function both ways


def _loss_and_grads(model, inputs):
    model.zero_grad()
    loss = model(**inputs, use_cache=False).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize(
    "family, attention",
    # transformers runs gemma2 with eager attention only (its soft-capped scores)
    [(f, a) for f in sorted(FAMILY) for a in ("sdpa", "eager") if (f, a) != ("gemma2", "sdpa")],
)
def test_a_packed_batch_trains_exactly_like_the_same_samples_unpacked(tok, family, attention):
    import torch

    ex = examples(tok)
    plain, _ = Batches(ex, len(LENGTHS), 1, 1, 0, tok.pad_token_id).get(0, 0, 0)
    rows, _ = packed(ex, 128)
    assert len(rows.input_ids) == 1  # all five samples in one row
    one, tokens = Batches(rows, 1, 1, 1, 0, tok.pad_token_id).get(0, 0, 0)
    assert tokens == sum(len(s) for s in ex.input_ids) and one["input_ids"].shape == (1, tokens)
    model = _model(family, FAMILY[family], attention, tok.vocab_size)
    loss, grads = _loss_and_grads(model, plain)
    packed_loss, packed_grads = _loss_and_grads(model, one)
    assert torch.allclose(packed_loss, loss, rtol=0, atol=2e-6), (float(packed_loss), float(loss))
    assert all(torch.allclose(a, b, rtol=1e-3, atol=1e-6) for a, b in zip(packed_grads, grads, strict=True))


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_the_refused_families_would_mix_the_samples_of_a_row(tok, family):
    import torch

    assert {name.split("-")[0] for name in FAMILY} == PACKED_FAMILIES  # every accepted family is checked
    assert family not in PACKED_FAMILIES and "drop --packing" in packing_refusal(family)
    ex = examples(tok)
    plain, _ = Batches(ex, len(LENGTHS), 1, 1, 0, tok.pad_token_id).get(0, 0, 0)
    one, _ = Batches(packed(ex, 128)[0], 1, 1, 1, 0, tok.pad_token_id).get(0, 0, 0)
    if family == "bloom":  # BLOOM's forward takes no position ids at all
        one.pop("position_ids")
    model = _model(family, REFUSED[family], "eager", tok.vocab_size)
    with torch.no_grad():
        # ten times the tolerance the accepted families meet
        assert abs(float(model(**one).loss) - float(model(**plain).loss)) > 2e-5


def test_packing_refuses_the_pipeline_and_families_without_positions(tmp_path, capsys):
    base = ["plan", "--gpus", "1x4xA100", "--seq-len", "512", "--packing", "--json"]
    assert main([*base, "--model", "tiny-llama", "--pp", "2"]) == 2
    assert "--packing with --pp 2" in capsys.readouterr().err
    assert main([*base, "--model", "tiny-bloom"]) == 2
    assert "bloom models do not take per-sample position ids" in capsys.readouterr().err
    layouts = {}
    for flags in ([], ["--packing"]):
        args = ["plan", "--model", "llama-3.1-70b", "--gpus", "2x8xA100", "--seq-len", "512", "--top", "200", "--json"]
        assert main(args + flags) == 0
        layouts[bool(flags)] = {p["pp"] for p in json.loads(capsys.readouterr().out)["plans"]}
    assert max(layouts[False]) > 1 and layouts[True] == {1}  # the search drops the pipeline layouts only


def test_the_plan_counts_packed_rows_under_sdpa_and_not_under_flash():
    from launcher.hardware import parse_gpus
    from launcher.memory.estimate import estimate
    from launcher.models.catalog import resolve_model
    from launcher.planner.perf import performance
    from launcher.spec import TrainSpec

    arch, cluster = resolve_model("llama-3.2-1b"), parse_gpus("1xA100")
    for attention, packed_costs_more in (("sdpa", True), ("flash", False)):
        spec = TrainSpec(micro_batch=2, seq_len=4096, attention=attention)
        plain, packed_ = estimate(arch, spec, cluster), estimate(arch, spec.with_(packing=True), cluster)
        # the mask's bias per layer (2 x 4096² bf16) and K/V repeated from 8 to 32 heads
        more = 2 * 4096 * 4096 * 2 + 2 * 2 * 4096 * (32 - 8) * 64 * 2
        assert packed_.activations_per_layer - plain.activations_per_layer == (more if packed_costs_more else 0)
        assert (packed_.gpu_total > plain.gpu_total) is packed_costs_more
        fast, slow = (performance(arch, s, cluster, 1).tokens_per_s for s in (spec, spec.with_(packing=True)))
        assert (slow < fast) is packed_costs_more and slow <= fast


def test_packing_raises_the_real_tokens_of_a_step_on_the_demo_set(tok):
    from launcher.rundir import TrainingConfig
    from tests.runs import in_memory_sets

    ex, _ = in_memory_sets(TrainingConfig(), tok, 256)
    rows, info = packed(ex, 256)
    per_step = {}
    for name, data in (("plain", ex), ("packed", rows)):
        batches = Batches(data, 2, 1, 1, 0, tok.pad_token_id)
        per_step[name] = sum(batches.get(step, 0, 0)[1] for step in range(10)) / 10
    # 202 samples of ~46 tokens in 39 rows: about five samples' tokens where one was
    assert info["rows"] == 39 and per_step["packed"] > 4 * per_step["plain"], per_step


def test_the_chunked_loss_of_a_packed_row_is_the_unpacked_loss(tok):
    import torch

    from launcher.train import chunked_loss

    ex = examples(tok)
    plain, _ = Batches(ex, len(LENGTHS), 1, 1, 0, tok.pad_token_id).get(0, 0, 0)
    one, _ = Batches(packed(ex, 128)[0], 1, 1, 1, 0, tok.pad_token_id).get(0, 0, 0)
    model = _model("llama", FAMILY["llama"], "sdpa", tok.vocab_size)
    whole = _loss_and_grads(model, plain)[0]
    chunked_loss.enable(model, chunk_tokens=16)  # several chunks, packed position ids passed through
    assert torch.allclose(_loss_and_grads(model, one)[0], whole, rtol=0, atol=2e-6)
