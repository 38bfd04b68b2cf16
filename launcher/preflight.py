"""Checks that stop a job before any rank starts: the run directory, the data, the model.

Each failure is one FtlaunchError line saying what is wrong and what to do. (More checks --
ports, shared filesystems, GPUs, an all-reduce across ranks -- belong here as they are built.)
"""

from __future__ import annotations

import json
from pathlib import Path

from launcher.errors import FtlaunchError
from launcher.rundir import read_run_dir
from launcher.spec import TrainSpec


class PreflightError(FtlaunchError):
    pass


def check_run_dir(run_dir: Path) -> None:
    run = read_run_dir(run_dir)
    spec = TrainSpec(**run.spec)
    for name in ("ds_config.json", "launch.sh"):
        if not (run_dir / name).is_file():
            raise PreflightError(f"{run_dir}/{name} is missing; write the run directory again with --dry-run")
    try:
        json.loads((run_dir / "ds_config.json").read_text())
    except json.JSONDecodeError:
        raise PreflightError(
            f"{run_dir}/ds_config.json is not valid JSON; write it again with --dry-run"
        ) from None
    cfg = run.training
    try:
        import torch
    except ImportError:
        raise PreflightError(
            "the worker needs torch: pip install torch, then `pip install -e .[train]`"
        ) from None
    from launcher.train.data import read_records, tokenize
    from launcher.train.model import check_loadable
    from launcher.train.tokenizer import load_tokenizer

    check_loadable(spec, run.model.source, cfg.init, torch.cuda.is_available())
    tokenizer = load_tokenizer(cfg.tokenizer, run.model.source, run.model.hf_config.get("vocab_size", 0))
    tokenize(read_records(cfg.data), tokenizer, spec.seq_len, cfg.data or "the demo data set")
