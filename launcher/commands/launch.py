"""`ftlaunch --model M --gpus G [...]` (also `ftlaunch run ...`): plan, write the run directory,
and start the job; `--dry-run` stops after writing it and prints the exact launch command."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import time
from pathlib import Path

from launcher import options
from launcher.errors import FtlaunchError

HELP = "plan, write the run directory and start the fine-tune (the default command)"
EPILOG = """examples:
  ftlaunch --model bloom-176b --gpus 8xA100 --dry-run             write runs/<name>/, print the command
  ftlaunch --model llama-3.1-8b --gpus 8xH100 --method lora --data train.jsonl
  ftlaunch --model tiny-llama --gpus 1x2xA100 --cpu --init random --zero-stage 3 --max-steps 30

The run directory holds plan.json, ds_config.json, accelerate_config.yaml, launch.sh,
explain.txt (and device_map.json for pipeline plans). `ftlaunch status|logs|cancel RUN` watch it.
Multi-node: pass --rdzv-endpoint HEAD:PORT and run the written launch.sh on every node."""


def add_parser(sub) -> None:
    from launcher.planner.constants import DEFAULT_MARGIN

    p = sub.add_parser(
        "run",
        help=HELP,
        description=HELP,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_model_and_cluster(p)
    options.add_training(p, search=True)
    p.add_argument(
        "--margin",
        type=options.non_negative_float,
        default=DEFAULT_MARGIN,
        metavar="F",
        help=f"fraction of GPU memory kept free (default {DEFAULT_MARGIN})",
    )
    t = p.add_argument_group("training run")
    t.add_argument(
        "--data",
        metavar="FILE",
        help="JSONL / JSON / parquet (prompt+response or text); default: the shipped demo set",
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
        "--max-steps", type=options.positive_int, default=50, metavar="N", help="optimizer steps (default 50)"
    )
    t.add_argument(
        "--lr",
        type=options.positive_float,
        metavar="LR",
        help="peak learning rate (default 2e-5 full, 2e-4 LoRA)",
    )
    t.add_argument("--warmup-steps", type=options.non_negative_int, default=0, metavar="N")
    t.add_argument(
        "--save-every",
        type=options.positive_int,
        default=10,
        metavar="N",
        help="checkpoint interval in steps (default 10)",
    )
    t.add_argument(
        "--keep-last", type=options.positive_int, default=2, metavar="K", help="checkpoints kept (default 2)"
    )
    t.add_argument("--seed", type=options.non_negative_int, default=0)
    r = p.add_argument_group("run directory and launch")
    r.add_argument("--name", help="run name (default MODEL-METHOD-TIMESTAMP)")
    r.add_argument(
        "--runs-dir",
        type=Path,
        default=Path("runs"),
        metavar="DIR",
        help="where run directories go (default ./runs)",
    )
    r.add_argument(
        "--dry-run", action="store_true", help="write the run directory and print the command; start nothing"
    )
    r.add_argument("--detach", action="store_true", help="start the job and return (default: follow its log)")
    r.add_argument(
        "--cpu",
        action="store_true",
        help="run the ranks as CPU processes (gloo, DeepSpeed's CPU accelerator): demos and tests",
    )
    r.add_argument(
        "--max-restarts",
        type=options.non_negative_int,
        default=2,
        metavar="N",
        help="elastic restarts after a rank fails (default 2)",
    )
    r.add_argument(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        help="multi-node c10d rendezvous (run launch.sh on every node)",
    )
    r.add_argument(
        "--nvme-path", default="/local_nvme", metavar="DIR", help="NVMe mount for ZeRO-Infinity offload"
    )
    r.add_argument(
        "--skip-preflight", action="store_true", help="do not check data and model before starting"
    )
    r.add_argument("--json", action="store_true", help="print the plan and run directory as JSON")
    p.set_defaults(run=run)


def _plan(args):
    from launcher.commands.plan import _base_and_pins, _hardware
    from launcher.models.catalog import resolve_model
    from launcher.planner import advise
    from launcher.planner.plans import NoPlanFitsError, Request
    from launcher.planner.search import plan

    arch = resolve_model(args.model)
    cluster = options.cluster_spec(args)
    base, pins = _base_and_pins(args)
    request = Request(arch, cluster, base, pins, args.global_batch, args.margin, _hardware(args))
    result = plan(request)
    if result.best is None:
        hints = [s.text for s in advise.suggestions(result)]
        raise NoPlanFitsError(
            f"no plan fits {arch.name} on {cluster.world_size} x {cluster.gpu.name}"
            + (f"; e.g. {hints[0]}" if hints else "")
            + " (`ftlaunch plan` shows the analysis)"
        )
    return arch, cluster, result


def _explain_text(result) -> str:
    from launcher.commands.plan import _cost, _print_result

    best = result.best
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        _print_result(
            result, 0.0, 5, None, None, _cost(best, best.cluster.gpu.price_per_hour_usd, None), None
        )
    return buf.getvalue()


def run(args: argparse.Namespace) -> int:
    from launcher.emit import artifacts
    from launcher.emit.deepspeed import DEFAULT_LR
    from launcher.rundir import TrainingConfig, check_name

    arch, cluster, result = _plan(args)
    best = result.best
    source = _source(args.model)
    name = check_name(args.name or f"{arch.name}-{best.spec.method}-{time.strftime('%Y%m%d-%H%M%S')}")
    training = TrainingConfig(
        data=str(Path(args.data).resolve()) if args.data else None,
        tokenizer=args.tokenizer or (None if args.init == "random" else source),
        init=args.init,
        max_steps=args.max_steps,
        lr=args.lr or DEFAULT_LR[best.spec.method],
        warmup_steps=args.warmup_steps,
        save_every=args.save_every,
        keep_last=args.keep_last,
        seed=args.seed,
    )
    run_file = artifacts.run_file(
        name,
        arch,
        source,
        best.spec,
        cluster,
        best.dp,
        best.global_batch,
        best.to_dict(),
        training,
        max_restarts=args.max_restarts,
    )
    env = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"} if args.cpu else {}
    explain = _explain_text(result)
    run_dir, argv = artifacts.write(
        args.runs_dir,
        run_file,
        arch,
        best.spec,
        cluster,
        explain,
        env=env,
        endpoint=args.rdzv_endpoint,
        nvme_path=args.nvme_path,
    )
    command = f"bash {shlex.quote(str(run_dir / 'launch.sh'))}"
    if args.json:
        print(
            json.dumps(
                {"run_dir": str(run_dir), "launch": command, "argv": argv, "plan": best.to_dict()}, indent=2
            )
        )
    else:
        print(explain, end="")
        print(f"\nrun directory: {run_dir}\nlaunch command: {command}\n  = {shlex.join(argv)}")
    if args.dry_run:
        return 0
    if not args.cpu:
        _require_gpus(cluster)
    from launcher.commands.jobs import start

    return start(run_dir, args.detach, args.skip_preflight)


def _require_gpus(cluster) -> None:
    try:
        import torch
    except ImportError:
        raise FtlaunchError("starting a job needs torch on this machine: pip install -e .[train]") from None
    have = torch.cuda.device_count()
    if have < cluster.gpus_per_node:
        raise FtlaunchError(
            f"this machine has {have} NVIDIA GPU(s), the plan needs {cluster.gpus_per_node} per node; run the written "
            "launch.sh where the GPUs are, or add --cpu to run the ranks as CPU processes (tiny models only)"
        )


def _source(model: str) -> str:
    """What the worker loads: the hub id behind a catalog short name, else what the user gave."""
    from launcher.models.catalog import INFO, catalog_name

    name = catalog_name(model)
    if name and not Path(model).exists() and INFO[name].hub_id and name == model.strip().lower():
        return INFO[name].hub_id
    return model
