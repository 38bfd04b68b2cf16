"""Training data: records from JSONL / JSON / parquet / a saved `datasets` dir, tokenised once,
batched deterministically so that step N always sees the same samples (exact resume).

Records with `prompt` and `response` (or instruction/input/output) train on the response only
(prompt tokens masked with -100); records with `text` train on all of it; conversations (`messages`
or ShareGPT `conversations`) are rendered with the tokenizer's chat template and train on the
assistant turns only (launcher/train/chat.py).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from launcher.errors import FtlaunchError
from launcher.train import chat

IGNORE = -100
DEMO = "demo_instruct.jsonl"
# --data NAME: the shipped demo sets (an existing file of that name is taken instead)
DEMOS = {"demo": DEMO, "demo-chat": "demo_chat.jsonl"}


class DataError(FtlaunchError):
    pass


def data_argument(value: str | None) -> str | None:
    """What plan.json records for --data: an existing file's absolute path, a shipped demo set's name."""
    if value is None or (value in DEMOS and not Path(value).exists()):
        return value
    return str(Path(value).resolve())


def demo_path(name: str = "demo") -> Path:
    return Path(str(resources.files("launcher.data").joinpath(DEMOS[name])))


MAX_TEXT_FILE = 2 * 2**30  # a JSON list is read whole; larger sets: JSONL, parquet or a saved datasets dir
MAX_RECORD = 16 * 2**20  # one JSONL line
FORMATS = f"prompt+response, instruction(+input)+output, text, {chat.FORMATS}"


def data_path(path: str | None) -> Path:
    return demo_path(path or "demo") if path is None or (path in DEMOS and not Path(path).exists()) else Path(path)


def iter_records(path: str | None) -> Iterator[tuple[str, object]]:
    """The records of a data file, each with where it is ("line 7", "row 3") for errors. JSONL and
    parquet are streamed (a file larger than memory never is in it whole); a JSON list is read whole."""
    p = data_path(path)
    shown = repr(str(p))
    try:
        if not p.exists():
            raise DataError(f"data file {shown} does not exist; pass an existing JSONL / JSON / parquet file")
        if p.is_dir():
            from datasets import load_from_disk

            ds = load_from_disk(str(p))
            ds = ds["train"] if hasattr(ds, "keys") and "train" in ds else ds
            for i, r in enumerate(ds):
                yield f"row {i + 1}", dict(r)
            return
        if not p.is_file():
            raise DataError(f"data file {shown} is not a regular file (a FIFO or device?); pass a file")
        if p.suffix == ".parquet":
            import pyarrow.parquet as pq

            n = 0
            for batch in pq.ParquetFile(p).iter_batches(batch_size=1024):
                for r in batch.to_pylist():
                    n += 1
                    yield f"row {n}", r
            return
        if p.suffix == ".json":
            yield from _json_records(p, shown)
            return
        with p.open("rb") as f:
            for n, raw in enumerate(iter(lambda: f.readline(MAX_RECORD + 2), b""), 1):
                if len(raw) > MAX_RECORD:
                    raise DataError(f"{shown} line {n}: a record over {MAX_RECORD >> 20} MiB; split or shorten it")
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")  # a byte-order mark is allowed
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError) as exc:
                    raise DataError(f"cannot read data file {shown}: line {n}: {str(exc)[:120]}") from None
                yield f"line {n}", record
    except DataError:
        raise
    except UnicodeDecodeError:
        raise DataError(f"cannot read data file {shown}: not UTF-8 text; save it as UTF-8") from None
    except (OSError, ValueError, ImportError, RecursionError) as exc:
        raise DataError(f"cannot read data file {shown}: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}") from None


def _json_records(p: Path, shown: str) -> list[tuple[str, object]]:
    if p.stat().st_size > MAX_TEXT_FILE:
        raise DataError(
            f"data file {shown} is over {MAX_TEXT_FILE >> 30} GiB, the limit for a JSON list (read whole); "
            "convert it to JSONL, parquet or a saved datasets directory"
        )
    rows = json.loads(p.read_bytes().decode("utf-8-sig"))
    rows = rows["data"] if isinstance(rows, dict) and "data" in rows else rows
    if not isinstance(rows, list):
        raise DataError(
            f"data file {shown} holds a JSON {type(rows).__name__}, not a list of records "
            '(or {"data": [...]})'
        )
    return [(f"record {i + 1}", r) for i, r in enumerate(rows)]


def read_records(path: str | None) -> list[tuple[str, object]]:
    return list(iter_records(path))


def _fields(row) -> tuple[str, str] | None:
    """(prompt, response); prompt '' for plain text records."""
    if not isinstance(row, dict):
        return None
    if isinstance(row.get("prompt"), str) and isinstance(row.get("response"), str):
        return row["prompt"], row["response"]
    if isinstance(row.get("instruction"), str) and isinstance(row.get("output"), str):
        extra = row.get("input") or ""
        if not isinstance(extra, str):
            return None
        return row["instruction"] + ("\n" + extra if extra else ""), row["output"]
    if isinstance(row.get("text"), str):
        return "", row["text"]
    return None


@dataclass
class Examples:
    input_ids: Sequence  # of token-id rows: lists, or views of the token cache's files
    labels: Sequence
    skipped: int = 0  # records that cannot be trained on (with skip_bad_records)
    no_target: int = 0  # records whose response starts beyond seq_len (nothing to learn from)
    # packed rows (launcher/train/packing.py): each row's position ids, restarting at every sample
    position_ids: Sequence | None = None

    def report(self, source: str) -> str:
        return (
            f"{source}: {len(self.input_ids)} record(s) used, {self.skipped} skipped (no known format, or a "
            "conversation that cannot be trained on), "
            f"{self.no_target} with no response token within the sequence length"
        )


def _example(row, tokenizer, chars: int, source: str) -> tuple[list[int], list[int]]:
    """(token ids, labels) of one record; ConversationError when it cannot be trained on."""
    turns = chat.conversation(row)
    if turns is not None:
        why = chat.template_problem(tokenizer)
        if why:  # the whole file's problem, never skipped
            raise DataError(f"{source} holds conversations, and {why}")
        seq, trained = chat.encode(tokenizer, turns, chars)
        return seq, [t if keep else IGNORE for t, keep in zip(seq, trained, strict=True)]
    pair = _fields(row)
    if pair is None:
        keys = sorted(row)[:6] if isinstance(row, dict) else type(row).__name__
        raise chat.ConversationError(f"a record with {keys}, which fits no format ({FORMATS})")
    prompt, response = pair[0][:chars], pair[1][:chars]
    p = tokenizer(prompt + ("\n" if prompt else ""), add_special_tokens=False)["input_ids"]
    r = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    seq = ([tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []) + p + r
    return seq, [IGNORE] * (len(seq) - len(r)) + r


def encoder(tokenizer, seq_len: int, source: str, skip_bad: bool, tally: Examples):
    """A function from (where, record) to (token ids, labels), or None for a record that is counted in
    tally instead (skipped, or with no response token within seq_len). A record that cannot be trained
    on (no known format, a conversation without an assistant turn or with an unknown role) is an error
    naming where it is, unless skip_bad. Text beyond what seq_len tokens can hold is not tokenised."""
    chars = seq_len * 64  # no vocabulary has tokens this long on average: the cut never changes a result

    def encode(where: str, row) -> tuple[list[int], list[int]] | None:
        try:
            seq, lab = _example(row, tokenizer, chars, source)
        except chat.ConversationError as exc:
            if not skip_bad:
                raise DataError(f"{source} {where}: {exc}; fix it, or pass --skip-bad-records to skip such records") from None
            tally.skipped += 1
            return None
        seq, lab = seq[:seq_len], lab[:seq_len]
        if all(x == IGNORE for x in lab):
            tally.no_target += 1
            return None
        return seq, lab

    return encode


def none_usable(source: str, seq_len: int, tally: Examples) -> DataError:
    return DataError(
        f"no usable records in {source}: each needs {FORMATS} fields, with a response that starts within "
        f"--seq-len {seq_len} tokens ({tally.skipped} skipped, {tally.no_target} with no response token in reach)"
    )


def tokenize(records, tokenizer, seq_len: int, source: str, skip_bad: bool = False) -> Examples:
    """Token ids and labels of records, in memory (launcher/train/token_cache.py writes them to disk)."""
    ex = Examples([], [])
    encode = encoder(tokenizer, seq_len, source, skip_bad, ex)
    for where, row in records:
        pair = encode(where, row)
        if pair is not None:
            ex.input_ids.append(pair[0])
            ex.labels.append(pair[1])
    if not ex.input_ids:
        raise none_usable(source, seq_len, ex)
    return ex


class Batches:
    """Deterministic order: epoch e is a seeded permutation; optimizer step s, micro-batch m
    and data-parallel rank r always map to the same samples.

    Rows are right-padded to the longest one and carry no attention mask: under causal attention
    no real token ever attends to a later position, so none sees a pad, and pads' labels are
    ignored, so loss and gradients are exactly those of a masked batch (tests/test_train_data.py).
    Without a mask transformers lets sdpa apply causality itself: the flash / memory-efficient
    kernel runs and grouped K/V heads are never expanded to all query heads, which is the layout
    the memory model counts. A padding mask would materialise a (B, 1, S, S) mask and a K/V copy
    per layer (1.75 GiB more for Llama-3.2-3B at 2x4096)."""

    def __init__(self, ex: Examples, micro: int, accum: int, dp: int, seed: int, pad_id: int) -> None:
        self.ex, self.micro, self.accum, self.dp, self.seed, self.pad = ex, micro, accum, dp, seed, pad_id
        self.n = len(ex.input_ids)

    def _index(self, k: int) -> int:
        epoch, i = divmod(k, self.n)
        return epoch_order(self.n, self.seed, epoch)[i]

    def get(self, step: int, micro_step: int, dp_rank: int) -> tuple[dict, int]:
        """The model's inputs for one micro-batch, and how many real (unpadded) tokens it holds."""
        per_step = self.micro * self.accum * self.dp
        start = step * per_step + (micro_step * self.dp + dp_rank) * self.micro
        rows = [self._index(start + j) for j in range(self.micro)]
        return collate(self.ex, rows, self.pad), sum(len(self.ex.input_ids[i]) for i in rows)


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The order in which an epoch visits the n rows (seeded: every rank and start agrees)."""
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def collate(ex: Examples, rows: list[int], pad_id: int) -> dict:
    """Rows right-padded to the longest; a row index past the set's end is a filler row (the first
    sample with no label: it keeps every rank's batches the same size and counts for nothing)."""
    import numpy as np
    import torch

    def row(seqs, i):  # a list, or a view of the token cache's file
        return torch.from_numpy(np.array(seqs[i], dtype=np.int64))

    n = len(ex.input_ids)
    seqs = [row(ex.input_ids, i if i < n else 0) for i in rows]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    lab = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for b, (i, seq) in enumerate(zip(rows, seqs, strict=True)):
        ids[b, : len(seq)] = seq
        if i < n:
            lab[b, : len(seq)] = row(ex.labels, i)
    out = {"input_ids": ids, "labels": lab}
    if ex.position_ids is not None:
        # the padding after a packed row's samples is one more sample of its own (positions from 0)
        pos = torch.arange(width, dtype=torch.long).repeat(len(rows), 1)
        for b, (i, seq) in enumerate(zip(rows, seqs, strict=True)):
            pos[b, : len(seq)] = row(ex.position_ids, i if i < n else 0)
            pos[b, len(seq):] -= len(seq)
        out["position_ids"] = pos
    return out


def eval_batches(ex: Examples, micro: int, dp: int, dp_rank: int, pad_id: int) -> list[dict]:
    """This data-parallel rank's share of the evaluation set, in order, as micro-batches; every rank
    gets as many (ZeRO-3's gathers and the pipeline's sends stay in step), the last ones filled up
    with filler rows."""
    per = micro * dp
    count = -(-len(ex.input_ids) // per)
    return [collate(ex, [b * per + dp_rank * micro + j for j in range(micro)], pad_id) for b in range(count)]


def held_indices(count: int, fraction: float, seed: int, source: str) -> set[int]:
    """Which of count records --eval-split holds out: a seeded `fraction` of them (the same on every
    rank and every start, so a resumed run never trains on its evaluation records)."""
    k = math.ceil(count * fraction)
    if not 0 < k < count:
        raise DataError(
            f"--eval-split {fraction} of the {count} record(s) in {source} leaves none to train or none to "
            "evaluate on; pick another fraction, or pass --eval-data FILE"
        )
    order = list(range(count))
    random.Random(seed * 1_000_003 + 7).shuffle(order)
    return set(order[:k])


def split_eval(records: list, fraction: float, seed: int, source: str) -> tuple[list, list]:
    """(training, evaluation) records, as held_indices splits them."""
    held = held_indices(len(records), fraction, seed, source)
    return [r for i, r in enumerate(records) if i not in held], [r for i, r in enumerate(records) if i in held]


def labelled(labels) -> int:
    """Tokens a batch's loss is the mean over (the labels shift by one: a label's first column never counts)."""
    return int((labels[:, 1:] != IGNORE).sum())
