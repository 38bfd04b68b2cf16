"""The run directory: the contract between planning and running.

Everything a rank needs is in the run directory; the worker and the backends read nothing else.

    plan.json            RunFile below: the spec that produced the plan, the plan with its memory
                         breakdown, the model's config, the training settings, the backend
    ds_config.json       the DeepSpeed config (launcher/emit/deepspeed.py)
    device_map.json      pipeline plans only (launcher/emit/device_map.py)
    device_map_stages.json  pipeline plans only: the stage boundaries beside it
    accelerate_config.yaml  the same plan for `accelerate launch`
    ds_config_hf.json, hf_args.txt  the same plan for a Hugging Face Trainer script (pp 1 plans:
                         launcher/emit/hf_trainer.py)
    launch.sh            the exact command the backend runs (ftlaunch's worker, or the user's program:
                         plan.json's "program", launcher/program.py)
    explain.txt          why this plan, in words
    logs/ checkpoints/ output/   written by the job

plan.json is validated with pydantic on read: unknown keys, missing keys or another schema
version are a one-line error telling the user to plan again.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from launcher import __version__
from launcher.errors import FtlaunchError

SCHEMA_VERSION = 1
PLAN_FILE = "plan.json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
SHARD_SIZE = r"[1-9][0-9]{0,5}(KB|MB|GB|KiB|MiB|GiB)"  # what transformers' max_shard_size reads


class RunDirError(FtlaunchError):
    pass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TrainingConfig(_Strict):
    """How the worker trains: data, steps, checkpoints. Defaults make the demo run."""

    data: str | None = None  # JSONL / JSON / parquet file or saved datasets dir; None = shipped demo set
    tokenizer: str | None = None  # hub id / path; None = the byte-level tokenizer built locally
    init: Literal["pretrained", "random"] = "pretrained"  # random: build from config (tests, demos)
    max_steps: int = Field(50, ge=1, le=10_000_000)
    lr: float = Field(2e-4, gt=0, lt=1)
    warmup_steps: int = Field(0, ge=0, le=10_000_000)
    weight_decay: float = Field(0.0, ge=0)
    save_every: int = Field(10, ge=1)
    keep_last: int = Field(2, ge=1, le=1000)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    skip_bad_records: bool = False  # records that fit no format: skipped and counted, not an error
    eval_data: str | None = None  # evaluation records (the same formats), or
    eval_split: float = Field(0.0, ge=0, lt=1)  # a seeded fraction of the training records held out
    eval_every: int = Field(0, ge=0, le=10_000_000)  # steps between evaluations; 0: at the end only
    log_every: int = Field(1, ge=1)
    # rank 0's metrics also go to these trackers (launcher/train/tracking.py)
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = []
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    merge_adapter: bool = False  # LoRA / QLoRA: also the adapter merged into the 16-bit base
    # the final model's safetensors shards (transformers' size syntax); pipelines: one per stage
    max_shard_size: str = Field("5GB", pattern=rf"^{SHARD_SIZE}$")

    @model_validator(mode="after")
    def _one_eval_set(self):
        if self.eval_data is not None and self.eval_split:
            raise ValueError("eval_data and eval_split both name an evaluation set; keep one")
        return self


class ModelEntry(_Strict):
    name: str
    source: str  # what the user passed: catalog name, hub id or path
    hf_config: dict


class Program(_Strict):
    """The user's own program, run on every rank in place of ftlaunch's worker (launcher/program.py)."""

    script: str | None = None  # absolute path
    module: str | None = None  # `python -m` name
    args: list[str] = []  # as given, placeholders unexpanded
    workdir: str  # where it was planned from: the ranks start there
    launcher: Literal["torchrun", "accelerate"] = "torchrun"  # what starts the ranks on each node

    @model_validator(mode="after")
    def _one(self):
        if (self.script is None) == (self.module is None):
            raise ValueError("a program is a script or a module, not both or neither")
        return self


class RunFile(_Strict):
    schema_version: int
    ftlaunch_version: str
    name: str
    model: ModelEntry
    spec: dict  # TrainSpec fields
    cluster: dict
    dp: int = Field(ge=1)
    global_batch: int = Field(ge=1)
    plan: dict  # memory breakdown and performance estimate
    training: TrainingConfig
    backend: dict
    program: Program | None = None  # None: ftlaunch's worker (python -m launcher.train RUN_DIR)


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RunDirError(
            f"run name {name[:40]!r} is not allowed: use 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit"
            if isinstance(name, str)
            else "run name must be text"
        )
    return name


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _holds(run_dir: Path) -> str:
    """What an existing run directory holds, in words (for the refusal to overwrite it)."""
    have = []
    if (run_dir / PLAN_FILE).is_file():
        have.append(PLAN_FILE)
    steps = sorted(d.name for d in (run_dir / "checkpoints").glob("step-*")) if (run_dir / "checkpoints").is_dir() else []
    if steps:
        have.append(f"{len(steps)} checkpoint(s), newest {steps[-1]}")
    if (run_dir / "job.json").exists():
        have.append("a job record (job.json)")
    if (run_dir / "logs" / "metrics.jsonl").exists():
        have.append("training logs")
    return ", ".join(have) or "other files"


def _check_replan(run_dir: Path, run: RunFile) -> None:
    """--replan keeps the checkpoints, so the new plan must train the same model the same way."""
    old = read_run_dir(run_dir)
    if old.model.hf_config != run.model.hf_config:
        raise RunDirError(
            f"{run_dir} holds a run of {old.model.name}, not {run.model.name}: its checkpoints cannot resume "
            "another model; choose another --name"
        )
    if old.spec.get("method") != run.spec.get("method"):
        raise RunDirError(
            f"{run_dir} holds a {old.spec.get('method')} run: its checkpoints cannot resume as "
            f"{run.spec.get('method')}; choose another --name"
        )


def write_run_dir(
    root: Path, run: RunFile, files: dict[str, str], executable: tuple[str, ...] = (), replan: bool = False
) -> Path:
    """Create `root/<name>` with plan.json and the given artifact files (name -> text).

    An existing run directory is never written over, unless `replan` (the run planned again in
    place, e.g. for another GPU count, keeping its checkpoints): then only its plan files change,
    and only for the same model and method. Whether it is running is the caller's check."""
    check_name(run.name)
    run_dir = Path(root) / run.name
    for fname in files:
        if "/" in fname or fname.startswith("."):
            raise RunDirError(f"refusing to write {fname!r} outside the run directory")
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"{run_dir} exists and is not a directory; choose another --name or --runs-dir")
    if run_dir.is_dir() and any(run_dir.iterdir()):
        if not replan:
            raise RunDirError(
                f"{run_dir} already exists ({_holds(run_dir)}); nothing was changed: choose another --name, "
                "or add --replan to plan that run again in place (keeps its checkpoints)"
            )
        _check_replan(run_dir, run)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        for sub in ("logs", "checkpoints", "output"):
            (run_dir / sub).mkdir(exist_ok=True)
        for fname, text in files.items():
            write_atomic(run_dir / fname, text, 0o755 if fname in executable else 0o644)
        write_atomic(run_dir / PLAN_FILE, json.dumps(run.model_dump(), indent=2, sort_keys=False) + "\n")
    except OSError as exc:
        raise RunDirError(
            f"cannot write the run directory {run_dir}: {exc.strerror or type(exc).__name__}; "
            "pick a writable --runs-dir"
        ) from None
    return run_dir


def read_run_dir(run_dir: str | Path) -> RunFile:
    """Load and validate plan.json; every problem is one line that says to plan again."""
    path = Path(run_dir) / PLAN_FILE
    if not path.is_file():
        raise RunDirError(
            f"{run_dir} is not a run directory (no {PLAN_FILE}); create one with `ftlaunch ... --dry-run`"
        )
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunDirError(
            f"{path} is not valid JSON ({type(exc).__name__}); plan again with --dry-run"
        ) from None
    if not isinstance(raw, dict):
        raise RunDirError(f"{path} does not hold a JSON object; plan again with --dry-run")
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RunDirError(
            f"{path} has schema version {version!r}, this ftlaunch {__version__} reads version {SCHEMA_VERSION}; "
            "plan again with this version (`ftlaunch ... --dry-run`)"
        )
    try:
        return RunFile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise RunDirError(f"{path}: {where}: {first['msg']}; plan again with --dry-run") from None


def new_run_file(**fields) -> RunFile:
    return RunFile(schema_version=SCHEMA_VERSION, ftlaunch_version=__version__, **fields)


JOB_FILE = "job.json"  # written by a backend's submit: what identifies the job there


def read_job(run_dir: str | Path, needs: dict[str, type]) -> dict | None:
    """job.json as a backend wrote it (None if there is none). Unreadable, not an object, or
    without the keys `needs` names (of those types): a one-line error, never a traceback."""
    path = Path(run_dir) / JOB_FILE
    if not path.exists():
        return None
    try:
        if not path.is_file():
            raise ValueError("not a regular file")
        job = json.loads(path.read_bytes()[:65536])
    except (OSError, ValueError, RecursionError) as exc:
        raise RunDirError(f"{path} is unreadable ({type(exc).__name__}); nothing was done with it") from None
    if not isinstance(job, dict):
        raise RunDirError(f"{path} does not hold a job record; nothing was done with it")
    for key, kind in needs.items():
        if not isinstance(job.get(key), kind) or isinstance(job.get(key), bool):
            raise RunDirError(f"{path} has no valid {key!r}; nothing was done with it")
    return job


def last_step(run_dir: str | Path) -> int | None:
    """The newest step in the run's logs/metrics.jsonl (None before the first one)."""
    path = Path(run_dir) / "logs" / "metrics.jsonl"
    step = None
    if path.is_file():
        for line in path.read_bytes().decode("utf-8", "replace").splitlines():
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                step = row["step"]
    return step


def read_exit_code(run_dir: str | Path) -> tuple[bool, int | None]:
    """(whether logs/exit_code exists, its integer); None for one that holds no integer (or is no
    regular file: a FIFO there must not hang the reader)."""
    path = Path(run_dir) / "logs" / "exit_code"
    if not path.exists():
        return False, None
    try:
        if not path.is_file():
            return True, None
        return True, int(path.read_bytes()[:64].decode().strip())
    except (OSError, ValueError):
        return True, None


def read_new(path: Path, pos: int) -> tuple[str, int]:
    """The text appended to a log file since byte `pos`, and the new position."""
    if not path.is_file():  # absent, or a FIFO / device that reading would hang on
        return "", pos
    with open(path, "rb") as f:
        f.seek(pos)
        chunk = f.read()
        return chunk.decode("utf-8", "replace"), f.tell()
