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
from launcher.commands import program_options, training_options
from launcher.errors import FtlaunchError
from launcher.program import PLACEHOLDERS

HELP = "plan, write the run directory and start the fine-tune (the default command)"
EPILOG = """examples:
  ftlaunch --model bloom-176b --gpus 8xA100 --dry-run             write runs/<name>/, print the command
  ftlaunch --model llama-3.1-8b --gpus 8xH100 --method lora --data train.jsonl
  ftlaunch --model tiny-llama --gpus 1x2xA100 --cpu --init random --zero-stage 3 --max-steps 30
  ftlaunch --model llama-3.1-70b --gpus 4x8xH100 --method lora --backend slurm --partition gpu --time 2-00:00:00
  ftlaunch --model llama-3.1-8b --gpus 2x8xA100 --method lora --backend ray --address http://HEAD:8265

  ftlaunch --model llama-3.1-8b --gpus 2x8xH100 --backend slurm --script sft.py -- {hf_args} --output_dir {output_dir}

The run directory holds plan.json, ds_config.json, accelerate_config.yaml, launch.sh,
explain.txt (and device_map.json for pipeline plans; job.sbatch for --backend slurm;
ray_job.json and ray_cluster.yaml for --backend ray).
`ftlaunch status|logs|cancel RUN` watch it. Multi-node without Slurm: pass --rdzv-endpoint
HEAD:PORT and run the written launch.sh on every node."""


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
    training_options.add(p)
    u = p.add_argument_group(
        "your own training program (instead of ftlaunch's worker)",
        "Each rank runs it under the launcher with the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, "
        "MASTER_ADDR, ...) and FTLAUNCH_RUN_DIR, FTLAUNCH_DS_CONFIG, FTLAUNCH_ACCELERATE_CONFIG, FTLAUNCH_PLAN, "
        "from the directory you plan in. Arguments after `--` go to it; these placeholders are replaced: "
        + " ".join(f"{{{k}}}" for k in PLACEHOLDERS)
        + ". {hf_args} is the Hugging Face TrainingArguments flags of the plan, so a stock Trainer / TRL script "
        "runs it with: --script train.py -- {hf_args} --output_dir {output_dir}",
    )
    which = u.add_mutually_exclusive_group()
    which.add_argument("--script", metavar="FILE", help="a Python file to run on every rank")
    which.add_argument("--module", metavar="NAME", help="a module to run on every rank (python -m NAME)")
    u.add_argument(
        "--launcher",
        choices=("torchrun", "accelerate"),
        default="torchrun",
        help="what starts your program on each node: torchrun (default), or `accelerate launch` with the run's "
        "accelerate_config.yaml (for scripts built on Accelerator(); the DeepSpeed plan comes from the config)",
    )
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
    r.add_argument(
        "--replan",
        action="store_true",
        help="plan an existing run (--name) again in place, e.g. for another GPU count: its checkpoints "
        "stay and the job resumes from them; same model and method only, refused while it runs "
        "(without it an existing run directory is never written over)",
    )
    r.add_argument("--detach", action="store_true", help="start the job and return (default: follow its log)")
    r.add_argument(
        "--cpu",
        action="store_true",
        help="run the ranks as CPU processes (gloo, DeepSpeed's CPU accelerator): demos and tests",
    )
    r.add_argument(
        "--max-restarts",
        type=options.at_most(options.non_negative_int, 1000),
        default=2,
        metavar="N",
        help="elastic restarts after a rank fails (default 2)",
    )
    r.add_argument(
        "--rdzv-endpoint",
        type=options.endpoint,
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
    r.add_argument(
        "--backend",
        choices=("torchrun", "slurm", "ray"),
        default="torchrun",
        help="torchrun on this machine (default), a Slurm batch job (job.sbatch) or a Ray job (ray_job.json)",
    )
    _add_slurm_options(p)
    g = p.add_argument_group("Ray (with --backend ray)")
    g.add_argument(
        "--address", metavar="URL", help="the Ray dashboard, http://HEAD:8265 (default $RAY_ADDRESS)"
    )
    g.add_argument(
        "--ray-storage",
        type=Path,
        metavar="DIR",
        help="a directory every Ray node sees; the run lives in DIR/NAME there (default: --runs-dir)",
    )
    p.set_defaults(run=run)


# Slurm flags: flag -> (SlurmOptions field, metavar, help, other argparse keywords)
_POS, _NONNEG, _MANY = (
    {"type": options.positive_int},
    {"type": options.non_negative_int},
    {"action": "append"},
)
_SLURM_FLAGS = {
    "--partition": ("partition", "NAME", "partition (default: the cluster's default)", {}),
    "--account": ("account", "NAME", "account to charge", {}),
    "--qos": ("qos", "NAME", "quality of service", {}),
    "--time": ("time", "T", "time limit: MINUTES, HH:MM:SS or D-HH:MM:SS", {}),
    "--constraint": ("constraint", "EXPR", "node features, e.g. 'a100&ib'", {}),
    "--job-name": ("job_name", "NAME", "job name (default: the run name)", {}),
    "--cpus-per-node": ("cpus_per_node", "N", "CPUs per node (default: whole nodes, --exclusive)", _POS),
    "--mem": ("mem", "SIZE", "memory per node, e.g. 500G (default 0: all of it)", {}),
    "--sbatch-line": ("sbatch_lines", "OPT", "extra #SBATCH line, e.g. --mail-type=END (repeatable)", _MANY),
    "--setup": ("setup", "LINE", "shell line run before srun, e.g. 'module load cuda' (repeatable)", _MANY),
    "--container-image": ("container_image", "IMAGE", "run the ranks in this container image (pyxis)", {}),
    "--python": (
        "python",
        "PATH",
        "the Python on the nodes (default: the one running ftlaunch; `python`: the one --setup puts on PATH, "
        "e.g. after --setup 'source /shared/venv/bin/activate')",
        {},
    ),
    "--signal-lead": ("signal_lead", "S", "seconds before the time limit to checkpoint (default 180)", _POS),
    "--max-requeues": ("max_requeues", "N", "most times the job requeues itself (default 3)", _NONNEG),
}


def _add_slurm_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Slurm (with --backend slurm)")
    for flag, (field, metavar, help_, kwargs) in _SLURM_FLAGS.items():
        g.add_argument(flag, dest=field, metavar=metavar, help=help_, **kwargs)


def _slurm_options(args):
    """SlurmOptions for --backend slurm; None for torchrun (where no Slurm flag may be given)."""
    values = {spec[0]: getattr(args, spec[0]) for spec in _SLURM_FLAGS.values()}
    if args.backend != "slurm":
        given = [flag for flag, spec in _SLURM_FLAGS.items() if values[spec[0]] is not None]
        if given:
            raise FtlaunchError(f"{', '.join(given)} only apply to --backend slurm; add it or drop them")
        return None
    if args.rdzv_endpoint:
        raise FtlaunchError(
            "--rdzv-endpoint is for --backend torchrun; a Slurm job finds its head node itself"
        )
    from launcher.backends import slurm_script

    return slurm_script.options(**values)


def _ray_options(args) -> dict | None:
    """The Ray settings for --backend ray (backends/ray.py); None for the other backends."""
    if args.backend != "ray":
        given = [f for f, v in (("--address", args.address), ("--ray-storage", args.ray_storage)) if v]
        if given:
            raise FtlaunchError(f"{', '.join(given)}: only for --backend ray; add it or drop them")
        return None
    if args.rdzv_endpoint:
        raise FtlaunchError("--rdzv-endpoint is for --backend torchrun; Ray Train connects the ranks itself")
    storage = args.ray_storage.resolve() if args.ray_storage else None
    return {"address": args.address, "storage": str(storage) if storage else None, "cpu": args.cpu}


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
    from launcher.backends.ray_request import submit_command as ray_submit_command
    from launcher.emit import artifacts
    from launcher.rundir import check_name

    slurm = _slurm_options(args)
    ray = _ray_options(args)
    if args.merge_adapter and args.method not in ("lora", "qlora"):
        raise FtlaunchError("--merge-adapter merges a LoRA / QLoRA adapter: add --method lora or qlora, or drop it")
    nodes = options.cluster_spec(args).nodes
    if args.backend == "torchrun" and not args.rdzv_endpoint and nodes > 1:
        raise FtlaunchError(
            f"--gpus spans {nodes} nodes: torchrun needs --rdzv-endpoint HOST:PORT (node 0's address, reachable "
            "from every node; launch.sh then runs on each node), or use --backend slurm or ray, which find "
            "the head node themselves"
        )
    program_entry = program_options.entry(args)
    if program_entry is not None and args.pp is None and program_options.data_parallel_only(program_entry):
        args.pp = 1  # searched without pipelines: their engine is not one the Trainer / accelerate drive
    if program_entry is not None and args.loss is None:
        args.loss = "full"  # a program computes its own loss: the whole one, unless --loss chunked says otherwise
    if program_entry is not None and args.optimizer_step is None:
        args.optimizer_step = "after-backward"  # and steps its own optimizer
    arch, cluster, result = _plan(args)
    best = result.best
    source = _source(args.model)
    name = check_name(
        args.name
        if args.name is not None
        else f"{arch.name}-{best.spec.method}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    if args.replan:
        existing = args.runs_dir / name
        if not (existing / "plan.json").is_file():
            raise FtlaunchError(f"--replan: there is no run {name!r} under {args.runs_dir} to plan again")
        from launcher.commands.jobs import refuse_if_active

        refuse_if_active(existing.resolve(), "planning it again")
    training = training_options.config(args, source, best.spec.method)
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
        slurm=slurm,
        ray=ray,
        program_entry=program_entry,
    )
    if program_entry is not None:
        program_options.check_plan(program_entry, best.spec, args.cpu)
    env = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"} if args.cpu else {}
    explain = _explain_text(result)
    if program_entry is not None:
        explain += program_options.note(program_entry, arch.name, best.spec)
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
        replan=args.replan,
    )
    command = f"bash {shlex.quote(str(run_dir / 'launch.sh'))}"
    if slurm is not None:
        from launcher.backends.slurm_script import SCRIPT, submit_argv

        command, argv = shlex.join(submit_argv(run_dir)), submit_argv(run_dir)
    if ray is not None:
        command, argv = f"ftlaunch launch {shlex.quote(str(run_dir))}", ["ftlaunch", "launch", str(run_dir)]
    if args.json:
        out = {"run_dir": str(run_dir), "launch": command, "argv": argv, "plan": best.to_dict()}
        if slurm is not None:
            out["sbatch"] = (run_dir / SCRIPT).read_text()
        if ray is not None:
            out["ray_job"] = json.loads((run_dir / "ray_job.json").read_text())
            out["ray_job_submit"] = ray_submit_command(out["ray_job"], ray["address"])
        print(json.dumps(out, indent=2))
    else:
        print(explain, end="")
        if ray is not None:
            request = (run_dir / "ray_job.json").read_text()
            by_hand = shlex.join(ray_submit_command(json.loads(request), ray["address"]))
            print(
                f"\nrun directory: {run_dir}\nRay job request (ray_job.json):\n{request}submit command: {command}\n"
                f"  (or with Ray's own CLI, without ftlaunch's checks and job record: {by_hand})"
            )
        elif slurm is None:
            print(f"\nrun directory: {run_dir}\nlaunch command: {command}\n  = {shlex.join(argv)}")
        else:
            script = (run_dir / SCRIPT).read_text() if args.dry_run else f"(in {run_dir / SCRIPT})\n"
            print(f"\nrun directory: {run_dir}\nbatch script:\n{script}submit command: {command}")
    if args.dry_run:
        return 0
    if not args.cpu and args.backend == "torchrun":
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
