"""Tokenise once per run, not once per rank per start.

The training (and evaluation) examples are written into the run directory as flat int32 files
under cache/tokens-KEY/, where KEY hashes everything the tokens depend on: the data files' bytes,
the tokenizer (its full serialisation, chat template and special tokens), the sequence length, the
evaluation split and --skip-bad-records. A relaunch or resume with the same inputs reads the files
back memory-mapped (no re-tokenising, no copy per rank); changing any input makes a new key.

Who builds: the launcher's preflight check (it reads every record anyway, to refuse bad data
before any rank starts), or, when the cache is missing on a node (a run directory not shared,
or the worker started by hand), local rank 0 of each node while the node's other ranks wait at a
barrier. The build streams records (JSONL / parquet are never whole in memory) into a temporary
folder that is renamed into place, so a reader sees a whole cache or none.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
from array import array
from pathlib import Path

from launcher.train.data import (
    DataError,
    Examples,
    data_path,
    encoder,
    held_indices,
    iter_records,
    none_usable,
)

VERSION = 1  # of the files' layout and of what the tokens are made of: a change makes a new key
CHUNK = 1 << 20  # bytes hashed at a time


def _hash_file(path: Path, h) -> None:
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)


def content_hash(path: str | None, memo: Path) -> str:
    """sha256 of a data file's bytes (a saved datasets dir: of all its files). Remembered in memo by
    (path, size, mtime) so that later starts and the other ranks do not read a large file again."""
    p = data_path(path).resolve()
    if not p.exists():
        raise DataError(f"data file {str(p)!r} does not exist; pass an existing JSONL / JSON / parquet file")
    if not (p.is_dir() or p.is_file()):
        raise DataError(f"data file {str(p)!r} is not a regular file (a FIFO or device?); pass a file")
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    stamp = [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    entry = known.get(str(p)) if isinstance(known, dict) else None
    if isinstance(entry, dict) and entry.get("stamp") == stamp:
        return entry["sha256"]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode() + b"\0")
        _hash_file(f, h)
    digest = h.hexdigest()
    known = known if isinstance(known, dict) else {}
    known[str(p)] = {"stamp": stamp, "sha256": digest}
    _write_atomic(memo, json.dumps(known, indent=1))
    return digest


def tokenizer_fingerprint(tokenizer) -> str:
    """What decides the tokens a tokenizer gives: its whole definition, chat template and specials."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    parts = [type(tokenizer).__name__, body, str(getattr(tokenizer, "chat_template", None))]
    parts += [str(getattr(tokenizer, k, None)) for k in ("bos_token_id", "eos_token_id", "pad_token_id")]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def cache_key(cfg, tokenizer, seq_len: int, memo: Path) -> str:
    inputs = {
        "version": VERSION,
        "data": content_hash(cfg.data, memo),
        "eval_data": content_hash(cfg.eval_data, memo) if cfg.eval_data is not None and not cfg.eval_split else None,
        "eval_split": cfg.eval_split or None,
        "seed": cfg.seed if cfg.eval_split else None,  # the split's only dependence on the seed
        "skip_bad_records": bool(cfg.skip_bad_records),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "seq_len": seq_len,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:20]


class Ragged:
    """Rows of token ids stored flat (a memory-mapped int32 file) with their offsets."""

    def __init__(self, flat, offsets) -> None:
        self.flat, self.offsets = flat, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int):
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.flat[int(self.offsets[i]) : int(self.offsets[i + 1])]


class _Writer:
    """Appends encoded examples of one set to its files in a cache folder."""

    def __init__(self, folder: Path, name: str) -> None:
        self.name = name
        self.ids = (folder / f"{name}.ids").open("wb")
        self.labels = (folder / f"{name}.labels").open("wb")
        self.offsets = array("q", [0])
        self.tally = Examples([], [])

    def add(self, pair) -> None:
        if pair is not None:
            array("i", pair[0]).tofile(self.ids)
            array("i", pair[1]).tofile(self.labels)
            self.offsets.append(self.offsets[-1] + len(pair[0]))

    def close(self, folder: Path) -> dict:
        self.ids.close()
        self.labels.close()
        with (folder / f"{self.name}.offsets").open("wb") as f:
            self.offsets.tofile(f)
        return {"records": len(self.offsets) - 1, "tokens": self.offsets[-1], "skipped": self.tally.skipped,
                "no_target": self.tally.no_target}


def _build(folder: Path, cfg, tokenizer, seq_len: int) -> dict:
    source = cfg.data or "the demo data set"
    held = None
    if cfg.eval_split:
        held = held_indices(sum(1 for _ in iter_records(cfg.data)), cfg.eval_split, cfg.seed, source)
    train = _Writer(folder, "train")
    sets = {"train": (train, source)}
    evaluation = None
    if held is not None or cfg.eval_data is not None:
        evaluation = _Writer(folder, "eval")
        sets["eval"] = (evaluation, cfg.eval_data if held is None else f"the --eval-split records of {source}")
    encode = {name: encoder(tokenizer, seq_len, where, cfg.skip_bad_records, w.tally) for name, (w, where) in sets.items()}
    for i, (where, row) in enumerate(iter_records(cfg.data)):
        name = "eval" if held is not None and i in held else "train"
        sets[name][0].add(encode[name](where, row))
    if held is None and evaluation is not None:
        for where, row in iter_records(cfg.eval_data):
            evaluation.add(encode["eval"](where, row))
    meta = {"sets": {}, "built_by": f"{socket.gethostname()} pid {os.getpid()}", "built_at": time.time()}
    for name, (w, where) in sets.items():
        meta["sets"][name] = counts = w.close(folder)
        if not counts["records"]:
            raise none_usable(where, seq_len, w.tally)
    (folder / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def _load(folder: Path, name: str, counts: dict) -> Examples:
    import numpy as np

    offsets = np.fromfile(folder / f"{name}.offsets", dtype=np.int64)

    def flat(kind: str):
        path = folder / f"{name}.{kind}"
        return np.memmap(path, dtype=np.int32, mode="r") if path.stat().st_size else np.zeros(0, np.int32)

    return Examples(Ragged(flat("ids"), offsets), Ragged(flat("labels"), offsets), counts["skipped"], counts["no_target"])


def _read(folder: Path) -> tuple[Examples, Examples | None, dict] | None:
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    sets = meta["sets"]
    held = _load(folder, "eval", sets["eval"]) if "eval" in sets else None
    return _load(folder, "train", sets["train"]), held, meta


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def prepare(run_dir: Path, cfg, tokenizer, seq_len: int, build: bool = True):
    """(training examples, evaluation examples or None, whether this call built the cache); None
    when the cache is missing and build is False."""
    root = run_dir / "cache"
    root.mkdir(parents=True, exist_ok=True)
    folder = root / f"tokens-{cache_key(cfg, tokenizer, seq_len, root / 'data-hashes.json')}"
    found = _read(folder)
    if found is not None:
        return found[0], found[1], False
    if not build:
        return None
    tmp = root / f".{folder.name}.{socket.gethostname()}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _build(tmp, cfg, tokenizer, seq_len)
        try:
            os.rename(tmp, folder)
        except OSError:  # another node's rank 0 (a shared run directory) renamed its own first
            if _read(folder) is None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with (root / "builds.log").open("a") as f:  # one line per build: what tests and users can count
        f.write(f"{folder.name} built by {socket.gethostname()} pid {os.getpid()} at {time.time():.3f}\n")
    for old in root.glob("tokens-*"):  # the inputs changed since: those tokens are never read again
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)
    train, held, _ = _read(folder)
    return train, held, True


def on_ranks(run_dir: Path, cfg, tokenizer, seq_len: int, local_rank: int):
    """prepare() as the worker's ranks call it: local rank 0 builds a missing cache, the node's other
    ranks wait for it (every rank passes the barrier exactly once)."""
    import torch.distributed as dist

    found = prepare(run_dir, cfg, tokenizer, seq_len, build=local_rank == 0)
    if dist.is_initialized():
        dist.barrier()
    if found is None:
        found = prepare(run_dir, cfg, tokenizer, seq_len, build=False)
        if found is None:
            raise DataError(
                f"local rank 0 built the token cache in {run_dir}/cache, and this rank cannot read it: the run "
                "directory must be the same folder for all the ranks of a node"
            )
    return found
