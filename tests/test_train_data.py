"""Training data: every supported format reads, bad files fail in one clear line, batches are
deterministic per (step, micro-batch, rank) and disjoint across data-parallel ranks."""

from __future__ import annotations

import json

import pytest

from launcher.train.data import Batches, DataError, read_records, tokenize

pytest.importorskip("transformers")
ROWS = [{"prompt": f"q{i}", "response": f"a{i}"} for i in range(10)]


@pytest.fixture
def tok():
    from launcher.train.tokenizer import byte_tokenizer

    return byte_tokenizer()


def test_formats(tmp_path):
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS))
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "d.parquet")
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    for name in ("d.jsonl", "d.json", "d.parquet", "saved"):
        assert read_records(str(tmp_path / name)) == ROWS, name
    assert len(read_records(None)) > 100  # the shipped demo set


def test_bad_files(tmp_path, tok):
    with pytest.raises(DataError, match="does not exist"):
        read_records(str(tmp_path / "missing.jsonl"))
    (tmp_path / "broken.jsonl").write_text('{"prompt": "x", ')
    with pytest.raises(DataError, match="cannot read"):
        read_records(str(tmp_path / "broken.jsonl"))
    with pytest.raises(DataError, match="no usable records"):
        tokenize([{"question": "x"}], tok, 64, "f")


def test_prompt_is_masked_and_text_is_not(tok):
    ex = tokenize([{"prompt": "abc", "response": "de"}, {"text": "xyz"}], tok, 64, "f")
    first, second = ex.labels
    assert first[:4] == [-100] * 4  # <s> a b c \n are masked (5 tokens)
    assert sum(x != -100 for x in first) == 3  # d e </s>
    assert sum(x != -100 for x in second) == 4  # x y z </s>


def test_batches_are_deterministic_and_disjoint(tok):
    ex = tokenize(ROWS * 4, tok, 64, "f")
    b = Batches(ex, micro=2, accum=2, dp=2, seed=0, pad_id=tok.pad_token_id)
    again = Batches(ex, micro=2, accum=2, dp=2, seed=0, pad_id=tok.pad_token_id)
    assert (b.get(3, 1, 1)[0]["input_ids"] == again.get(3, 1, 1)[0]["input_ids"]).all()
    seen = [tuple(map(tuple, b.get(0, m, r)[0]["input_ids"].tolist())) for m in range(2) for r in range(2)]
    assert len(set(seen)) == len(seen)


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128},
        {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4},
    ],
    ids=["llama-gqa", "gpt2-absolute-positions"],
)
def test_padded_batches_without_a_mask_train_exactly_like_masked_ones(tok, config, monkeypatch):
    """The worker feeds right-padded rows with no attention mask (see Batches): the loss and every
    gradient equal those of the same rows with a padding mask, and sdpa gets no mask and keeps
    grouped K/V heads unexpanded, as the memory model assumes."""
    import torch
    import transformers

    rows = [{"text": "x" * n} for n in (30, 11, 4)]
    inputs, tokens = Batches(tokenize(rows, tok, 64, "f"), 3, 1, 1, 0, tok.pad_token_id).get(0, 0, 0)
    real = inputs["labels"] != -100
    real[:, 0] = True  # <s>, the one unlabelled token of a text row
    assert set(inputs) == {"input_ids", "labels"} and tokens == int(real.sum()) < real.numel()
    small = {"hidden_size": 64, "num_hidden_layers": 2} if config["model_type"] == "llama" else {}
    cfg = transformers.AutoConfig.for_model(**config, **small, vocab_size=tok.vocab_size)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").train()

    sdpa_calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, *args, **kwargs):
        sdpa_calls.append((attn_mask is not None, q.shape[1] == k.shape[1]))
        return sdpa(q, k, v, attn_mask, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)

    def loss_and_grads(**extra):
        model.zero_grad()
        torch.manual_seed(1)  # gpt2's dropout draws the same masks in both runs
        loss = model(**inputs, **extra).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    masked_loss, masked_grads = loss_and_grads(attention_mask=real.long())
    assert sdpa_calls and all(masked for masked, _ in sdpa_calls)  # a padding mask reaches sdpa
    sdpa_calls.clear()
    loss, grads = loss_and_grads()
    assert torch.equal(loss, masked_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, masked_grads, strict=True))
    assert sdpa_calls and not any(masked for masked, _ in sdpa_calls)
    if "num_key_value_heads" in config:  # K/V keep their 2 heads against 4 query heads
        assert not any(same_heads for _, same_heads in sdpa_calls)
