"""Training data: every supported format reads, bad files fail in one clear line, batches are
deterministic per (step, micro-batch, rank) and disjoint across data-parallel ranks."""

from __future__ import annotations

import json

import pytest

from launcher.train.data import Batches, DataError, read_records, tokenize

pytest.importorskip("transformers")
ROWS = [{"prompt": f"q{i}", "response": f"a{i}"} for i in range(10)]


def recs(rows):
    """Records as read_records returns them: (where, record)."""
    return [(f"record {i + 1}", r) for i, r in enumerate(rows)]


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
        assert [r for _, r in read_records(str(tmp_path / name))] == ROWS, name
    assert len(read_records(None)) > 100  # the shipped demo set


def test_bad_files(tmp_path, tok):
    with pytest.raises(DataError, match="does not exist"):
        read_records(str(tmp_path / "missing.jsonl"))
    (tmp_path / "broken.jsonl").write_text('{"prompt": "x", ')
    with pytest.raises(DataError, match="cannot read"):
        read_records(str(tmp_path / "broken.jsonl"))
    with pytest.raises(DataError, match="no usable records"):
        tokenize(recs([{"question": "x"}]), tok, 64, "f", skip_bad=True)


def test_no_record_is_dropped_silently(tmp_path, tok):
    """A record in no known format is an error naming its line; --skip-bad-records skips and counts."""
    lines = [json.dumps(r) for r in ROWS[:3]] + ["", json.dumps({"chat": []}), json.dumps(ROWS[3])]
    (tmp_path / "mixed.jsonl").write_text("\n".join(lines))
    records = read_records(str(tmp_path / "mixed.jsonl"))
    with pytest.raises(DataError, match=r"mixed.jsonl line 5: a record with \[.chat.\]"):
        tokenize(records, tok, 64, "mixed.jsonl")
    ex = tokenize(records, tok, 64, "mixed.jsonl", skip_bad=True)
    assert (len(ex.input_ids), ex.skipped, ex.no_target) == (4, 1, 0)
    assert "4 record(s) used, 1 skipped" in ex.report("mixed.jsonl")
    # a response that starts beyond --seq-len has nothing to learn from: counted, not hidden
    ex = tokenize(recs([{"prompt": "p" * 100, "response": "r"}, ROWS[0]]), tok, 64, "f")
    assert (len(ex.input_ids), ex.no_target) == (1, 1)


@pytest.mark.parametrize(
    "content,needle",
    [
        ("5", "holds a JSON int"),
        ("null", "holds a JSON NoneType"),
        ('{"data": 3}', "holds a JSON int"),
        ("[" * 100000, "cannot read"),
    ],
)
def test_json_files_that_hold_no_records(tmp_path, content, needle):
    (tmp_path / "d.json").write_text(content)
    with pytest.raises(DataError, match=needle):
        read_records(str(tmp_path / "d.json"))


def test_bom_utf16_fifo_and_huge_records(tmp_path):
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + json.dumps(ROWS[0]).encode())
    assert [r for _, r in read_records(str(tmp_path / "bom.jsonl"))] == [ROWS[0]]
    (tmp_path / "u16.jsonl").write_bytes(json.dumps(ROWS[0]).encode("utf-16"))
    with pytest.raises(DataError, match="not UTF-8"):
        read_records(str(tmp_path / "u16.jsonl"))
    import os

    os.mkfifo(tmp_path / "fifo.jsonl")  # reading it would hang for ever
    with pytest.raises(DataError, match="not a regular file"):
        read_records(str(tmp_path / "fifo.jsonl"))
    (tmp_path / "big.jsonl").write_text(json.dumps({"text": "x" * (17 * 2**20)}))
    with pytest.raises(DataError, match="line 1: a record over 16 MiB"):
        read_records(str(tmp_path / "big.jsonl"))


def test_a_long_record_costs_no_more_than_its_sequence(tok):
    """Text past what --seq-len tokens can hold is never tokenised (a 10 MB record once cost 2 GB)."""
    calls = []

    def counting(text, **kw):
        calls.append(len(text))
        return tok(text, **kw)

    counting.eos_token_id, counting.bos_token_id = tok.eos_token_id, tok.bos_token_id
    ex = tokenize(recs([{"text": "y" * 10_000_000}]), counting, 64, "f")
    assert len(ex.input_ids[0]) == 64 and max(calls) <= 64 * 64


def test_prompt_is_masked_and_text_is_not(tok):
    ex = tokenize(recs([{"prompt": "abc", "response": "de"}, {"text": "xyz"}]), tok, 64, "f")
    first, second = ex.labels
    assert first[:4] == [-100] * 4  # <s> a b c \n are masked (5 tokens)
    assert sum(x != -100 for x in first) == 3  # d e </s>
    assert sum(x != -100 for x in second) == 4  # x y z </s>


def test_batches_are_deterministic_and_disjoint(tok):
    ex = tokenize(recs(ROWS * 4), tok, 64, "f")
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
    inputs, tokens = Batches(tokenize(recs(rows), tok, 64, "f"), 3, 1, 1, 0, tok.pad_token_id).get(0, 0, 0)
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


def test_the_eval_split_is_seeded_and_disjoint_and_eval_batches_cover_it_once(tok):
    from launcher.train.data import IGNORE, eval_batches, split_eval

    records = recs([{"prompt": f"q{i}", "response": f"answer {i}"} for i in range(23)])
    train, held = split_eval(records, 0.2, 3, "f")
    assert (len(train), len(held)) == (18, 5)
    assert split_eval(records, 0.2, 3, "f") == (train, held)  # every rank, every start
    assert split_eval(records, 0.2, 4, "f")[1] != held  # another seed, another split
    assert sorted(w for w, _ in train + held) == sorted(w for w, _ in records)
    with pytest.raises(DataError, match="leaves none to train or none to evaluate"):
        split_eval(records[:1], 0.5, 0, "f")
    ex = tokenize(held, tok, 64, "f")
    # 5 records, micro-batch 2, 2 data-parallel ranks: 2 micro-batches each, the last with fillers
    per_rank = [eval_batches(ex, 2, 2, r, tok.pad_token_id) for r in (0, 1)]
    assert [len(b) for b in per_rank] == [2, 2]
    seen = [
        tuple(row[row != IGNORE].tolist())
        for batches in per_rank
        for batch in batches
        for row in batch["labels"]
        if (row != IGNORE).any()
    ]
    assert sorted(seen) == sorted(tuple(x for x in lab if x != IGNORE) for lab in ex.labels)


def test_evaluation_options_are_checked_before_anything_runs(tmp_path, capsys):
    from launcher.cli import main

    tiny = ["--model", "tiny-llama", "--gpus", "1x2xA100", "--cpu", "--init", "random", "--detach"]
    for n, (extra, needle) in enumerate([
        (["--eval-every", "5"], "--eval-every needs an evaluation set"),
        (["--eval-split", "1.5"], "a fraction between 0 and 1"),
        (["--eval-split", "0.1", "--eval-data", "x.jsonl"], "not allowed with argument"),
        (["--eval-data", str(tmp_path / "missing.jsonl")], "missing.jsonl' does not exist"),
    ]):
        code = main([*tiny, "--runs-dir", str(tmp_path), "--name", f"e{n}", *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and needle in err[-1], (extra, err)
        assert not (tmp_path / f"e{n}" / "job.json").exists()  # nothing started
