"""The run command's options for the user's own program (--script / --module, --launcher, arguments
after `--`): checked before anything is planned or written, recorded in plan.json's "program", and
what the plan must be for them (launcher/program.py is the program itself)."""

from __future__ import annotations

from pathlib import Path

from launcher import program
from launcher.errors import FtlaunchError
from launcher.rundir import Program

_WORKER_ONLY = (
    "data", "tokenizer", "merge_adapter", "skip_bad_records", "eval_data", "eval_split", "eval_every", "report_to"
)


def entry(args):
    """plan.json's program entry for --script / --module (None: ftlaunch's worker); checked here,
    before anything is planned or written: the file exists and compiles, the placeholders are known."""
    given = args.program_args
    if args.script is None and args.module is None:
        if given:
            raise FtlaunchError("arguments after `--` go to your program: add --script FILE or --module NAME")
        if args.launcher != "torchrun":
            raise FtlaunchError(
                f"--launcher {args.launcher} starts your own program: add --script FILE or --module NAME "
                "(ftlaunch's worker runs under torchrun)"
            )
        return None
    if args.backend == "ray" and args.launcher != "torchrun":
        raise FtlaunchError(
            f"--launcher {args.launcher} with --backend ray: Ray Train starts the ranks of a Ray job; drop "
            "--launcher, or use --backend torchrun or slurm"
        )
    worker_only = [f"--{k.replace('_', '-')}" for k in _WORKER_ONLY if getattr(args, k)]
    if worker_only:
        raise FtlaunchError(
            f"{', '.join(worker_only)} configure ftlaunch's worker, which --script/--module replaces: pass your "
            "program its data and settings after `--`"
        )
    workdir = Path.cwd()
    program.check_target(args.script, args.module, workdir)
    if args.backend == "ray" and args.script is not None and not Path(args.script).resolve().is_relative_to(workdir):
        raise FtlaunchError(
            f"--script {args.script} is outside {workdir}, the directory a Ray job ships to the cluster: plan "
            "from a directory that holds the script"
        )
    program.check_args(given or [])
    script = str(Path(args.script).resolve()) if args.script is not None else None
    return Program(
        script=script, module=args.module, args=list(given or []), workdir=str(workdir), launcher=args.launcher
    )


def data_parallel_only(entry) -> bool:
    return entry.launcher == "accelerate" or "{hf_args}" in entry.args


def check_plan(entry, spec, cpu: bool) -> None:
    """What the placeholders need from the plan they expand to."""
    if entry.launcher == "accelerate" and spec.pp > 1:
        raise FtlaunchError(
            "--launcher accelerate runs DeepSpeed's data-parallel engine from accelerate_config.yaml, which has no "
            "pipeline form (accelerate does not drive DeepSpeed's pipeline engine); pin --pp 1, or use --launcher torchrun"
        )
    if spec.optimizer_step == "in-backward":
        raise FtlaunchError(
            "--optimizer-step in-backward is run by ftlaunch's worker; your program steps its own optimizer "
            "after the backward; drop --optimizer-step"
        )
    if spec.packing:
        raise FtlaunchError(
            "--packing is done by ftlaunch's worker; your program builds its own batches (pack them there, e.g. "
            "TRL's SFTConfig(packing=True)); drop --packing"
        )
    if "{hf_args}" not in entry.args:
        return
    if spec.pp > 1:
        raise FtlaunchError(program.NO_TRAINER_FORM)
    if spec.precision == "bf16-autocast":
        raise FtlaunchError(
            "{hf_args} with --precision bf16-autocast: the Trainer would run its own mixed precision over the "
            "DeepSpeed config's torch_autocast; use --precision bf16"
        )
    if spec.loss == "chunked":
        raise FtlaunchError(
            "--loss chunked with {hf_args}: the Hugging Face Trainer computes the whole loss, so the plan would "
            "count memory it does not save; drop --loss"
        )
    if cpu and spec.precision in ("bf16", "fp16", "bf16-pure"):
        raise FtlaunchError(
            f"{{hf_args}} with --cpu: the Trainer runs DeepSpeed on a CPU only in fp32 (it refuses --{spec.precision.split('-')[0]} "
            "there unless it drops DeepSpeed); add --precision fp32"
        )


def note(entry, model: str, spec) -> str:
    return (
        f"\nYour program ({program.name(entry)}) runs on every rank in place of ftlaunch's worker. The memory and "
        f"speed figures above hold only if it trains {model} ({spec.method}) with this plan's settings: micro-batch "
        f"{spec.micro_batch}, accumulation {spec.grad_accum}, sequence length {spec.seq_len}, ZeRO-{spec.zero_stage}, "
        f"{spec.precision}, activation checkpointing {spec.grad_ckpt}, {spec.loss} loss"
        + (", its blocks under torch.compile" if spec.compile else "")
        + " ({hf_args}, ds_config.json and accelerate_config.yaml "
        "carry them). Exit 75 after a checkpoint to be started again (Slurm requeues); exit 2 is not restarted.\n"
    )
