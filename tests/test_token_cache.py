"""The token cache (launcher/train/token_cache.py): data tokenised once per run, in the run
directory, by one process; the same examples as tokenising in memory; a new key when any input of
the tokens changes; two real ranks (torch.distributed, gloo) build it once between them."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from launcher.rundir import TrainingConfig
from launcher.train.data import Batches, DataError, iter_records, read_records, split_eval, tokenize
from launcher.train.token_cache import on_ranks, prepare
from launcher.train.tokenizer import byte_tokenizer
from tests.runs import token_builds

ROWS = [{"prompt": f"question {i}?", "response": f"answer {i} " * (i % 5 + 1)} for i in range(40)]


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


def _data(tmp_path: Path, rows=ROWS, name="d.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(ex) -> list[list[int]]:
    return [[int(t) for t in ex.input_ids[i]] for i in range(len(ex.input_ids))], [
        [int(t) for t in ex.labels[i]] for i in range(len(ex.labels))
    ]


def test_built_once_then_read_back_as_the_same_examples(tmp_path, tok):
    data = _data(tmp_path)
    cfg = TrainingConfig(data=str(data))
    run = tmp_path / "run"
    train, held, built = prepare(run, cfg, tok, 48)
    assert built and held is None and len(token_builds(run)) == 1
    want = tokenize(read_records(str(data)), tok, 48, "d")
    assert _rows(train) == (want.input_ids, want.labels)
    again, _, built = prepare(run, cfg, tok, 48)
    assert not built and len(token_builds(run)) == 1 and _rows(again) == _rows(train)
    # batches from the memory-mapped files are the in-memory ones
    a = Batches(again, 3, 2, 2, 5, tok.pad_token_id).get(4, 1, 1)
    b = Batches(want, 3, 2, 2, 5, tok.pad_token_id).get(4, 1, 1)
    assert a[1] == b[1] and all((a[0][k] == b[0][k]).all() for k in ("input_ids", "labels"))


def test_every_input_of_the_tokens_is_in_the_key(tmp_path, tok):
    data = _data(tmp_path)
    run = tmp_path / "run"
    cfg = TrainingConfig(data=str(data))
    prepare(run, cfg, tok, 48)
    prepare(run, cfg, tok, 64)  # another sequence length
    data.write_text(data.read_text().replace("answer 3", "answer 9"))  # the file's bytes
    prepare(run, cfg, tok, 64)
    prepare(run, TrainingConfig(data=str(data), skip_bad_records=True), tok, 64)
    other = byte_tokenizer()
    other.chat_template = "{{ messages }}"  # the tokenizer (here: its chat template)
    prepare(run, cfg, other, 64)
    assert len(token_builds(run)) == 5
    assert len(list((run / "cache").glob("tokens-*"))) == 1  # the stale ones are gone
    assert not list((run / "cache").glob(".*.tmp"))


def test_the_evaluation_split_is_the_in_memory_one(tmp_path, tok):
    data = _data(tmp_path)
    cfg = TrainingConfig(data=str(data), eval_split=0.2, seed=3)
    train, held, _ = prepare(tmp_path / "run", cfg, tok, 48)
    records = read_records(str(data))
    want_train, want_held = split_eval(records, 0.2, 3, "d")
    assert _rows(train) == _rows(tokenize(want_train, tok, 48, "d"))
    assert _rows(held) == _rows(tokenize(want_held, tok, 48, "d"))
    evaluation = _data(tmp_path, ROWS[:7], "e.jsonl")
    _, held, _ = prepare(tmp_path / "run2", TrainingConfig(data=str(data), eval_data=str(evaluation)), tok, 48)
    assert len(held.input_ids) == 7


def test_bad_data_is_refused_and_leaves_no_cache(tmp_path, tok):
    run = tmp_path / "run"
    bad = _data(tmp_path, [{"question": "x"}], "bad.jsonl")
    with pytest.raises(DataError, match="line 1: a record with"):
        prepare(run, TrainingConfig(data=str(bad)), tok, 48)
    with pytest.raises(DataError, match="no usable records"):
        prepare(run, TrainingConfig(data=str(bad), skip_bad_records=True), tok, 48)
    os.mkfifo(tmp_path / "fifo.jsonl")  # hashing it would hang for ever
    with pytest.raises(DataError, match="not a regular file"):
        prepare(run, TrainingConfig(data=str(tmp_path / "fifo.jsonl")), tok, 48)
    assert not list((run / "cache").glob("tokens-*")) and not list((run / "cache").glob(".*"))


def test_jsonl_is_streamed_not_read_whole(tmp_path):
    """The first record comes out before a later line is read: a broken line 3 only fails when reached."""
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]) + "\n{broken\n")
    records = iter_records(str(path))
    assert next(records) == ("line 1", ROWS[0]) and next(records)[0] == "line 2"
    with pytest.raises(DataError, match="line 3"):
        next(records)


def _rank(rank: int, port: int, run: str, data: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    train, _, built = on_ranks(Path(run), TrainingConfig(data=data), byte_tokenizer(), 48, local_rank=rank)
    Path(out, f"rank-{rank}.json").write_text(json.dumps({"built": built, "rows": _rows(train)}))
    dist.destroy_process_group()


def test_two_ranks_build_it_once_and_read_the_same_tokens(tmp_path):
    import torch.multiprocessing as mp

    data = _data(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, str(tmp_path / "run"), str(data), str(tmp_path)), nprocs=2)
    got = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [g["built"] for g in got] == [True, False]
    assert got[0]["rows"] == got[1]["rows"] and len(token_builds(tmp_path / "run")) == 1
