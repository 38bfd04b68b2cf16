"""Checkpoints that never corrupt: written under a temporary tag, renamed into place once every
rank has finished (a rename is atomic), keep-last-K, resume from the newest complete one.

A directory named step-NNNNNNNN under checkpoints/ is complete by construction; `.tmp-*`
directories are unfinished saves (a crash mid-save) and are removed at the next start.

Each checkpoint also records what it holds (manifest.json: every file's size and a CRC-32 of up to
three 1 MiB windows, head, middle and tail: cheap at any size, whole-file for small files). A start
verifies the newest checkpoint against it and, if a file is missing, truncated or changed, falls
back to the newest one that verifies, saying which and why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

from launcher.errors import FtlaunchError

# below this much free space a failed save is reported as a full disk
_LOW_SPACE = 64 * 2**20


class CheckpointError(FtlaunchError):
    pass


_TAG = re.compile(r"^step-(\d{8})$")
LAYOUT = "layout.json"  # world size, TP degree and ZeRO stage the checkpoint was written with
MANIFEST = "manifest.json"  # what the checkpoint holds: files, sizes, sampled CRC-32s
_WINDOW = 1 << 20


def tag_for(step: int) -> str:
    return f"step-{step:08d}"


def complete(root: Path) -> list[tuple[int, Path]]:
    out = []
    if root.is_dir():
        for d in root.iterdir():
            m = _TAG.match(d.name)
            if m and d.is_dir():
                out.append((int(m.group(1)), d))
    return sorted(out)


def latest(root: Path) -> tuple[int, Path] | None:
    found = complete(root)
    return found[-1] if found else None


def _crc(path: Path, size: int) -> int:
    """CRC-32 of the head, middle and tail windows (the whole file when it is small)."""
    crc = 0
    with open(path, "rb") as f:
        if size <= 3 * _WINDOW:
            return zlib.crc32(f.read())
        for offset in (0, size // 2 - _WINDOW // 2, size - _WINDOW):
            f.seek(offset)
            crc = zlib.crc32(f.read(_WINDOW), crc)
    return crc


def write_manifest(ckpt: Path) -> None:
    files = {}
    for f in sorted(ckpt.rglob("*")):
        if f.is_file() and f.name != MANIFEST:
            size = f.stat().st_size
            files[str(f.relative_to(ckpt))] = {"size": size, "crc32": _crc(f, size)}
    tmp = ckpt / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"files": files}, indent=1))
    os.replace(tmp, ckpt / MANIFEST)


def damage(ckpt: Path) -> str | None:
    """Why a checkpoint cannot be resumed from (None if its files match its manifest)."""
    try:
        files = json.loads((ckpt / MANIFEST).read_text())["files"]
        if not isinstance(files, dict):
            raise ValueError
    except FileNotFoundError:
        return f"it has no {MANIFEST} (an unfinished save, or written by an older ftlaunch)"
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {MANIFEST} is unreadable"
    for name, want in files.items():
        path = ckpt / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if not isinstance(want, dict) or size != want.get("size"):
            return f"{name} has {size} bytes, the save wrote {want.get('size') if isinstance(want, dict) else '?'}"
        if _crc(path, size) != want.get("crc32"):
            return f"{name} is not what the save wrote (checksum differs)"
    return None


def usable(root: Path) -> tuple[tuple[int, Path] | None, list[tuple[int, str]]]:
    """The newest checkpoint that verifies, and the newer ones skipped (step, why)."""
    skipped = []
    for step, path in reversed(complete(root)):
        why = damage(path)
        if why is None:
            return (step, path), skipped
        skipped.append((step, why))
    return None, skipped


def clean_partial(root: Path) -> None:
    if root.is_dir():
        for d in root.iterdir():
            if d.name.startswith(".tmp-"):
                shutil.rmtree(d, ignore_errors=True)


def save(
    engine, root: Path, step: int, client_state: dict, rank_state: dict, keep_last: int, barrier, layout: dict
) -> Path:
    """Collective: every rank calls it. Returns the final checkpoint directory."""
    tag = tag_for(step)
    tmp = ".tmp-" + tag
    engine.save_checkpoint(str(root), tag=tmp, client_state=client_state, save_latest=False)
    tmp_dir = root / tmp
    tmp_dir.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    import torch

    torch.save(rank_state, tmp_dir / f"rank-{rank:05d}.pt")
    if rank == 0:
        (tmp_dir / LAYOUT).write_text(json.dumps(layout))
    if rank == 0 and (root / tag).exists():  # this step saved by an earlier attempt
        shutil.rmtree(root / tag)
    barrier()
    if rank == 0:  # every rank's files are written: record them
        write_manifest(tmp_dir)
    barrier()
    if int(os.environ.get("LOCAL_RANK", "0")) == 0 and tmp_dir.exists():
        # one rename per node: on a shared filesystem the first one wins, the rest find nothing
        try:
            os.replace(tmp_dir, root / tag)
        except FileNotFoundError:
            pass
        for _, old in complete(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    barrier()
    return root / tag


def load_rank_state(ckpt: Path) -> dict | None:
    """This rank's RNG states saved with the checkpoint (None for checkpoints without them)."""
    import torch

    path = ckpt / f"rank-{int(os.environ.get('RANK', '0')):05d}.pt"
    return torch.load(path, weights_only=False) if path.exists() else None


def failure(root: Path, step: int, exc: BaseException) -> CheckpointError:
    """A failed save as one clear line; the unfinished directory is removed, the last complete
    checkpoint is untouched."""
    shutil.rmtree(root / (".tmp-" + tag_for(step)), ignore_errors=True)
    last = latest(root)
    kept = (
        f"the last complete checkpoint, step {last[0]}, is intact" if last else "no earlier checkpoint exists"
    )
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = None
    full = (isinstance(exc, OSError) and exc.errno == 28) or (free is not None and free < _LOW_SPACE)
    if full:
        what = f"no space left on the device of {root}"
        todo = "free space (or write runs elsewhere with --runs-dir) and launch again to resume"
    else:
        what = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        todo = "fix the cause and launch again to resume"
    return CheckpointError(f"saving checkpoint step {step} failed ({what}); {kept}; {todo}")


def saved_layout(ckpt: Path) -> dict | None:
    path = ckpt / LAYOUT
    return json.loads(path.read_text()) if path.exists() else None


def to_universal(ckpt: Path, rank: int, barrier) -> Path:
    """Convert a checkpoint written with another world size into DeepSpeed's universal format
    (rank 0 converts, everyone waits); returns the directory holding the converted tag."""
    out_root = ckpt.parent / "universal"
    target = out_root / ckpt.name
    if rank == 0 and not target.exists():
        tmp = out_root / (".tmp-" + ckpt.name)
        shutil.rmtree(tmp, ignore_errors=True)
        argv = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(ckpt)]
        argv += ["--output_folder", str(tmp), "--num_extract_workers", "1", "--num_merge_workers", "1"]
        argv += ["--inject_missing_state"]  # HF models carry no Megatron universal_checkpoint_info
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise CheckpointError(f"converting {ckpt.name} to a universal checkpoint failed: {tail[0][:200]}")
        os.replace(tmp, target)
    barrier()
    return out_root
