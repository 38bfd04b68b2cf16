"""The run command's options for ftlaunch's worker (data, tokenizer, steps, checkpoints,
evaluation) and the TrainingConfig plan.json records from them."""

from __future__ import annotations

import argparse

from launcher import options
from launcher.errors import FtlaunchError
from launcher.train.data import data_argument

MAX_STEPS = 10_000_000  # TrainingConfig's bound
MAX_SEED = 2**32 - 1  # what every seeded generator the worker uses accepts


def add(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("training run")
    t.add_argument(
        "--data",
        metavar="FILE",
        help="JSONL / JSON / parquet / saved datasets dir: prompt+response, instruction+output, text, "
        "messages (role/content) or ShareGPT conversations (from/value; rendered with the tokenizer's chat "
        "template, trained on the assistant turns); `demo` (default) or `demo-chat`: the shipped demo sets",
    )
    t.add_argument(
        "--tokenizer",
        metavar="ID",
        help="tokenizer hub id or path (default: the model's, or the built-in byte tokenizer with --init random)",
    )
    t.add_argument(
        "--init",
        choices=("pretrained", "random"),
        default="pretrained",
        help="pretrained weights (default) or a model built from its config (demos, tests)",
    )
    t.add_argument(
        "--max-steps",
        type=options.at_most(options.positive_int, MAX_STEPS),
        default=50,
        metavar="N",
        help=f"optimizer steps (default 50, at most {MAX_STEPS:,})",
    )
    t.add_argument(
        "--lr",
        type=options.at_most(options.positive_float, 1.0),
        metavar="LR",
        help="peak learning rate, below 1 (default 2e-5 full, 2e-4 LoRA)",
    )
    t.add_argument(
        "--warmup-steps", type=options.at_most(options.non_negative_int, MAX_STEPS), default=0, metavar="N"
    )
    t.add_argument(
        "--save-every",
        type=options.at_most(options.positive_int, MAX_STEPS),
        default=10,
        metavar="N",
        help="checkpoint interval in steps (default 10)",
    )
    t.add_argument(
        "--keep-last",
        type=options.at_most(options.positive_int, 1000),
        default=2,
        metavar="K",
        help="checkpoints kept (default 2)",
    )
    t.add_argument(
        "--seed",
        type=options.at_most(options.non_negative_int, MAX_SEED),
        default=0,
        help=f"random seed, 0-{MAX_SEED} (default 0)",
    )
    t.add_argument(
        "--merge-adapter",
        action="store_true",
        help="LoRA / QLoRA: besides the adapter (output/final), write it merged into the 16-bit base "
        "as a full model (output/final-merged; rank 0 holds the whole 16-bit model on the host for it)",
    )
    t.add_argument(
        "--max-shard-size",
        type=options.shard_size,
        default="5GB",
        metavar="SIZE",
        help="largest safetensors file of the final model, e.g. 5GB, 500MB, 2GiB (default 5GB); "
        "above it the model is sharded with an index. Pipeline plans write one shard per stage",
    )
    held = t.add_mutually_exclusive_group()
    held.add_argument(
        "--eval-data",
        metavar="FILE",
        help="evaluation records (the formats --data takes): their loss, per labelled token, at the end and "
        "every --eval-every steps, in logs/metrics.jsonl; the best step goes into output/final.json",
    )
    held.add_argument(
        "--eval-split",
        type=_fraction,
        metavar="F",
        help="hold out this fraction of the training records for evaluation instead (seeded: the same records "
        "on every rank and every resume), e.g. 0.05",
    )
    t.add_argument(
        "--eval-every",
        type=options.at_most(options.positive_int, MAX_STEPS),
        metavar="N",
        help="steps between evaluations (default: at the end only)",
    )
    t.add_argument(
        "--report-to",
        type=_trackers,
        default=[],
        metavar="LIST",
        help="also send the metrics to tensorboard,wandb,mlflow (comma-separated; default none): TensorBoard "
        "event files in the run directory; W&B offline in it (WANDB_MODE=online and WANDB_API_KEY in the "
        "environment log live); MLflow to MLFLOW_TRACKING_URI, else a file store in the run directory",
    )
    t.add_argument(
        "--skip-bad-records",
        action="store_true",
        help="skip data records that fit no format (default: such a record is an error naming its line); "
        "the count is reported",
    )


def config(args: argparse.Namespace, source: str, method: str):
    """plan.json's training section from the options (the learning rate's default by method)."""
    from launcher.emit.deepspeed import DEFAULT_LR
    from launcher.rundir import TrainingConfig

    if args.eval_every and args.eval_data is None and not args.eval_split:
        raise FtlaunchError("--eval-every needs an evaluation set: add --eval-data FILE or --eval-split F")
    return TrainingConfig(
        data=data_argument(args.data),
        tokenizer=args.tokenizer or (None if args.init == "random" else source),
        init=args.init,
        max_steps=args.max_steps,
        lr=args.lr or DEFAULT_LR[method],
        warmup_steps=args.warmup_steps,
        save_every=args.save_every,
        keep_last=args.keep_last,
        seed=args.seed,
        skip_bad_records=args.skip_bad_records,
        merge_adapter=args.merge_adapter,
        max_shard_size=args.max_shard_size,
        eval_data=data_argument(args.eval_data),
        eval_split=args.eval_split or 0.0,
        eval_every=args.eval_every or 0,
        report_to=args.report_to,
    )


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a fraction between 0 and 1, e.g. 0.05")
    return value


def _trackers(text: str) -> list[str]:
    from launcher.train.tracking import TRACKERS

    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["none"]:
        return []
    unknown = [n for n in names if n not in TRACKERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of {', '.join(TRACKERS)}, or none")
    return list(dict.fromkeys(names))
