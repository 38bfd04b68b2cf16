"""The user's own training program (`--script FILE` / `--module NAME`, arguments after `--`).

plan.json records the program as the user gave it (the script's absolute path or the module, the
arguments with their placeholders, the directory it was planned from); the backends start it on
every rank in place of ftlaunch's worker, from that directory, with the torchrun environment plus
FTLAUNCH_RUN_DIR / _DS_CONFIG / _ACCELERATE_CONFIG / _PLAN. Placeholders in the arguments are
replaced when the launch command is written (a word inside the run directory is written relative to
where launch.sh lies, so a copied run directory still runs itself):

    {run_dir} {output_dir} {ds_config} {accelerate_config} {micro_batch} {grad_accum} {lr}
    {seq_len} {max_steps}, and {hf_args}: the Hugging Face TrainingArguments flags of the plan
    (launcher/emit/hf_trainer.py), a word of its own. `{{` and `}}` are literal braces.
"""

from __future__ import annotations

import importlib.util
import string
import sys
from pathlib import Path

from launcher.emit import hf_trainer
from launcher.errors import FtlaunchError

HF_ARGS = "hf_args"
PLACEHOLDERS = {
    "run_dir": "the run directory",
    "output_dir": "RUN_DIR/output, where the final model belongs",
    "ds_config": "RUN_DIR/ds_config.json, for deepspeed.initialize(config=...)",
    "accelerate_config": "RUN_DIR/accelerate_config.yaml",
    "micro_batch": "the plan's micro-batch per rank",
    "grad_accum": "the plan's gradient accumulation steps",
    "lr": "the peak learning rate (--lr)",
    "seq_len": "the planned sequence length",
    "max_steps": "--max-steps",
    HF_ARGS: "the TrainingArguments flags that realise the plan (a word of its own)",
}


NO_TRAINER_FORM = (
    "{hf_args}: a pipeline plan has no Hugging Face Trainer form (the Trainer does not drive DeepSpeed's "
    "pipeline engine); pin --pp 1, or pass the plan's values with the other placeholders"
)


class ProgramError(FtlaunchError):
    pass


def env(run_dir: Path) -> dict[str, str]:
    """What every rank finds in its environment, besides torchrun's RANK, WORLD_SIZE, ..."""
    run_dir = Path(run_dir)
    return {
        "FTLAUNCH_RUN_DIR": str(run_dir),
        "FTLAUNCH_PLAN": str(run_dir / "plan.json"),
        "FTLAUNCH_DS_CONFIG": str(run_dir / "ds_config.json"),
        "FTLAUNCH_ACCELERATE_CONFIG": str(run_dir / "accelerate_config.yaml"),
    }


def _fields(arg: str) -> list[str]:
    try:
        return [name for _, name, _, _ in string.Formatter().parse(arg) if name is not None]
    except ValueError as exc:  # a lone brace
        raise ProgramError(f"program argument {arg[:60]!r}: {exc}; write a literal brace as {{{{ or }}}}") from None


def check_args(args: list[str]) -> None:
    """Every placeholder is known and {hf_args} stands alone (raised before anything is written)."""
    for arg in args:
        for name in _fields(arg):
            if name not in PLACEHOLDERS:
                raise ProgramError(
                    f"unknown placeholder {{{name}}} in program argument {arg[:60]!r}; known: "
                    + " ".join(f"{{{k}}}" for k in PLACEHOLDERS)
                    + " (a literal brace is {{ or }})"
                )
            if name == HF_ARGS and arg != "{hf_args}":
                raise ProgramError(f"{{hf_args}} expands to several flags: give it as an argument of its own, not in {arg!r}")


def check_target(script: str | None, module: str | None, workdir: Path) -> None:
    """The script exists and compiles, or the module can be found from `workdir`: one line if not."""
    if script is not None:
        path = Path(script)
        if not path.exists():
            raise ProgramError(f"--script {script}: no such file")
        if not path.is_file():
            raise ProgramError(f"--script {script}: not a file (a directory? give the .py file, or --module for a package)")
        try:
            compile(path.read_bytes(), str(path), "exec")
        except SyntaxError as exc:
            raise ProgramError(f"--script {script}: line {exc.lineno}: {exc.msg}; fix the script before planning") from None
        except (OSError, ValueError) as exc:
            raise ProgramError(f"--script {script}: cannot be read as Python ({exc})") from None
        return
    sys.path.insert(0, str(workdir))
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        raise ProgramError(f"--module {module}: {exc}") from None
    finally:
        sys.path.remove(str(workdir))
    if found is None:
        raise ProgramError(f"--module {module}: no such module importable from {workdir} (or the installed packages)")


def values(run_dir: Path, spec, ds: dict, training) -> dict[str, object]:
    """Each placeholder's value for this plan ({hf_args}: a list of words, None for pipeline plans)."""
    run_dir = Path(run_dir)
    hf = None
    if spec.pp == 1 and spec.optimizer_step == "after-backward":  # the Trainer steps after the backward
        hf = hf_trainer.trainer_args(
            spec, ds, run_dir, training.lr, training.weight_decay, training.warmup_steps
        )
    return {
        "run_dir": str(run_dir),
        "output_dir": str(run_dir / "output"),
        "ds_config": str(run_dir / "ds_config.json"),
        "accelerate_config": str(run_dir / "accelerate_config.yaml"),
        "micro_batch": spec.micro_batch,
        "grad_accum": spec.grad_accum,
        "lr": repr(training.lr),
        "seq_len": spec.seq_len,
        "max_steps": training.max_steps,
        HF_ARGS: hf,
    }


def expand(args: list[str], vals: dict[str, object]) -> list[str]:
    check_args(args)
    out: list[str] = []
    for arg in args:
        if arg == "{hf_args}":
            if vals[HF_ARGS] is None:
                raise ProgramError(NO_TRAINER_FORM)
            out += vals[HF_ARGS]
        else:
            out.append(arg.format(**{k: v for k, v in vals.items() if k != HF_ARGS}))
    return out


def words(program, vals: dict[str, object]) -> list[str]:
    """What follows the launcher's own options: `SCRIPT ARGS` or `-m MODULE ARGS`, run under
    launcher/backends/rank_exit.py, which carries exit codes 75 and 2 past torchrun."""
    head = [program.script] if program.script is not None else ["-m", program.module]
    return ["-m", "launcher.backends.rank_exit", str(vals["run_dir"]), *head, *expand(program.args, vals)]


def name(program) -> str:
    return Path(program.script).name if program.script is not None else f"-m {program.module}"
