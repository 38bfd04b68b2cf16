"""Training data: records from JSONL / JSON / parquet / a saved `datasets` dir, tokenised once,
batched deterministically so that step N always sees the same samples (exact resume).

Records with `prompt` and `response` (or instruction/input/output) train on the response only
(prompt tokens masked with -100); records with `text` train on all of it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from launcher.errors import FtlaunchError

IGNORE = -100
DEMO = "demo_instruct.jsonl"


class DataError(FtlaunchError):
    pass


def demo_path() -> Path:
    return Path(str(resources.files("launcher.data").joinpath(DEMO)))


def read_records(path: str | None) -> list[dict]:
    p = demo_path() if path is None else Path(path)
    if not p.exists():
        raise DataError(f"data file {str(p)!r} does not exist; pass an existing JSONL / JSON / parquet file")
    try:
        if p.is_dir():
            from datasets import load_from_disk

            ds = load_from_disk(str(p))
            ds = ds["train"] if hasattr(ds, "keys") and "train" in ds else ds
            return [dict(r) for r in ds]
        if p.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(p).to_pylist()
        text = p.read_text(encoding="utf-8")
        if p.suffix == ".json":
            rows = json.loads(text)
            return rows["data"] if isinstance(rows, dict) and "data" in rows else rows
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, ValueError, ImportError) as exc:
        raise DataError(f"cannot read data file {str(p)!r}: {str(exc).splitlines()[0][:200]}") from None


def _fields(row: dict) -> tuple[str, str] | None:
    """(prompt, response); prompt '' for plain text records."""
    if not isinstance(row, dict):
        return None
    if isinstance(row.get("prompt"), str) and isinstance(row.get("response"), str):
        return row["prompt"], row["response"]
    if isinstance(row.get("instruction"), str) and isinstance(row.get("output"), str):
        extra = row.get("input") or ""
        return row["instruction"] + ("\n" + extra if extra else ""), row["output"]
    if isinstance(row.get("text"), str):
        return "", row["text"]
    return None


@dataclass
class Examples:
    input_ids: list[list[int]]
    labels: list[list[int]]


def tokenize(records: list[dict], tokenizer, seq_len: int, source: str) -> Examples:
    ids, labels = [], []
    for row in records:
        pair = _fields(row)
        if pair is None:
            continue
        prompt, response = pair
        p = tokenizer(prompt + ("\n" if prompt else ""), add_special_tokens=False)["input_ids"]
        r = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seq = ([tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []) + p + r
        lab = [IGNORE] * (len(seq) - len(r)) + r
        seq, lab = seq[:seq_len], lab[:seq_len]
        if any(x != IGNORE for x in lab):
            ids.append(seq)
            labels.append(lab)
    if not ids:
        raise DataError(
            f"no usable records in {source}: each needs prompt+response, instruction+output, or text fields"
        )
    return Examples(ids, labels)


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
        order = list(range(self.n))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order[i]

    def get(self, step: int, micro_step: int, dp_rank: int) -> tuple[dict, int]:
        """The model's inputs for one micro-batch, and how many real (unpadded) tokens it holds."""
        import torch

        per_step = self.micro * self.accum * self.dp
        start = step * per_step + (micro_step * self.dp + dp_rank) * self.micro
        rows = [self._index(start + j) for j in range(self.micro)]
        width = max(len(self.ex.input_ids[i]) for i in rows)
        ids = torch.full((self.micro, width), self.pad, dtype=torch.long)
        lab = torch.full((self.micro, width), IGNORE, dtype=torch.long)
        for b, i in enumerate(rows):
            n = len(self.ex.input_ids[i])
            ids[b, :n] = torch.tensor(self.ex.input_ids[i])
            lab[b, :n] = torch.tensor(self.ex.labels[i])
        return {"input_ids": ids, "labels": lab}, sum(len(self.ex.input_ids[i]) for i in rows)
