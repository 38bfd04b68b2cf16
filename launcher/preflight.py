"""Checks that stop a job before any rank starts.

`check_run_dir` (run before every launch): the run directory, data, model and tokenizer as the
job will see them, GPUs against the plan, DeepSpeed ops the plan needs, the rendezvous port.
`allreduce` (`ftlaunch preflight RUN`): the job's own launch command runs one all-reduce over
every rank with a timeout and checks that every rank sees the run directory, naming the host
that fails. Each failure is one FtlaunchError line saying what is wrong and what to do.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

from launcher.errors import FtlaunchError
from launcher.rundir import read_run_dir
from launcher.spec import TrainSpec, uses_autotp


class PreflightError(FtlaunchError):
    pass


def check_run_dir(run_dir: Path) -> list[str]:
    """Raises PreflightError on what stops the job; returns notes on what it will work around
    (a damaged checkpoint it will skip)."""
    run = read_run_dir(run_dir)
    spec = TrainSpec(**run.spec)
    for name in ("ds_config.json", "launch.sh"):
        if not (run_dir / name).is_file():
            raise PreflightError(f"{run_dir}/{name} is missing; write the run directory again with --dry-run")
    try:
        ds = json.loads((run_dir / "ds_config.json").read_bytes()[: 16 * 2**20])
    except (ValueError, OSError):
        raise PreflightError(
            f"{run_dir}/ds_config.json is not valid JSON; write it again with --dry-run"
        ) from None
    differs = config_mismatch(spec, run.dp, ds)
    if differs:
        raise PreflightError(
            f"{run_dir}/ds_config.json does not match plan.json ({differs}): the job would train something "
            "other than the plan; write the run directory again (`--replan`) or undo the edit"
        )
    cfg = run.training
    try:
        import torch  # noqa: F401 -- the worker's first import
    except ImportError:
        raise PreflightError(
            "the worker needs torch: pip install torch, then pip install 'ftlaunch[train]'"
        ) from None
    if run.program is not None:  # the user's program: it, not ftlaunch's worker, reads data and model
        check_program(run.program)
        check_gpus(run, cpu=_is_cpu_run(run_dir))
        check_ops(spec)
        check_compile(spec, cpu=_is_cpu_run(run_dir))
        return []
    check_versions()
    from launcher.train.tracking import check_installed

    check_installed(cfg.report_to)
    from launcher.train.checkpoint import usable
    from launcher.train.model import check_loadable
    from launcher.train.token_cache import prepare
    from launcher.train.tokenizer import load_tokenizer

    check_loadable(spec, run.model.hf_config, run.model.source, cfg.init, has_gpu=not _is_cpu_run(run_dir))
    tokenizer = load_tokenizer(cfg.tokenizer, run.model.source, run.model.hf_config.get("vocab_size", 0))
    source = cfg.data or "the demo data set"
    examples, _, _ = prepare(run_dir, cfg, tokenizer, spec.seq_len)  # tokenised once, here, for all ranks
    check_gpus(run, cpu=_is_cpu_run(run_dir))
    check_ops(spec)
    check_compile(spec, cpu=_is_cpu_run(run_dir))
    found, skipped = usable(run_dir / "checkpoints")
    then = f"the job resumes from step {found[0]}" if found else "the job starts from step 0"
    notes = [f"checkpoint step {step} is damaged ({why}): {then}" for step, why in skipped]
    if examples.skipped or examples.no_target:
        notes.append(examples.report(source))
    from launcher.train.packing import data_note

    speed = (run.plan.get("perf") or {}).get("tokens_per_s")
    notes.append(data_note(examples, spec, cfg.seed, speed, run.model.hf_config.get("model_type", "?")))
    return notes


def check_program(entry) -> None:
    """The program plan.json names is still there and compiles, from the directory it starts in."""
    from launcher import program

    if not Path(entry.workdir).is_dir():
        raise PreflightError(
            f"your program starts in {entry.workdir}, which does not exist here: launch from the machine it was "
            "planned on, or plan again where the job runs"
        )
    program.check_target(entry.script, entry.module, Path(entry.workdir))


def config_mismatch(spec: TrainSpec, dp: int, ds: dict) -> str | None:
    """The first setting where ds_config.json and plan.json disagree (None if none does)."""
    if not isinstance(ds, dict):
        return "it is not a JSON object"
    zero = ds.get("zero_optimization") if isinstance(ds.get("zero_optimization"), dict) else {}
    tp = ds.get("tensor_parallel", {}).get("autotp_size", 1) if isinstance(ds.get("tensor_parallel"), dict) else 1
    enabled = {k: isinstance(ds.get(k), dict) and bool(ds[k].get("enabled")) for k in ("bf16", "fp16")}

    def device(key: str) -> str:
        sub = zero.get(key)
        return sub.get("device", "none") if isinstance(sub, dict) else "none"

    checks = (
        ("train_micro_batch_size_per_gpu", ds.get("train_micro_batch_size_per_gpu"), spec.micro_batch),
        ("gradient_accumulation_steps", ds.get("gradient_accumulation_steps"), spec.grad_accum),
        ("train_batch_size", ds.get("train_batch_size"),
         spec.micro_batch * spec.grad_accum * dp * (spec.tp if uses_autotp(spec) else 1)),
        ("zero_optimization.stage", zero.get("stage", 0), spec.zero_stage),
        ("zero_optimization.offload_optimizer", device("offload_optimizer"), spec.offload_optimizer),
        ("zero_optimization.offload_param", device("offload_param"), spec.offload_params),
        ("tensor_parallel.autotp_size", tp, spec.tp if uses_autotp(spec) else 1),
        ("bf16.enabled", enabled["bf16"], spec.precision in ("bf16", "bf16-pure")),
        ("fp16.enabled", enabled["fp16"], spec.precision == "fp16"),
    )
    for key, got, want in checks:
        if got != want:
            return f"{key} is {got!r}, the plan says {want!r}"
    return None


def _is_cpu_run(run_dir: Path) -> bool:
    return "DS_ACCELERATOR=cpu" in (run_dir / "launch.sh").read_text()


def check_versions() -> None:
    """The worker's dependencies (ftlaunch's train extra) are installed at versions it is tested with:
    a site's preinstalled DeepSpeed 0.14 starts no rank on a CPU, for one, and fails only in the ranks."""
    from importlib import metadata

    try:
        requires = metadata.requires("ftlaunch") or []
    except metadata.PackageNotFoundError:
        return  # a source tree that is not installed declares nothing to check against
    from packaging.requirements import Requirement

    for text in requires:
        req = Requirement(text)
        if req.marker is None or not req.marker.evaluate({"extra": "train"}):
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            raise PreflightError(f"the worker needs {req.name}{req.specifier}: pip install 'ftlaunch[train]'") from None
        if not req.specifier.contains(have, prereleases=True):
            raise PreflightError(
                f"{req.name} {have} is installed, ftlaunch's worker is tested with {req.name}{req.specifier}: "
                f"pip install '{req.name}{req.specifier}' (or --skip-preflight to try it anyway)"
            )


def check_gpus(run, cpu: bool) -> None:
    """On GPU runs: this node has the GPUs the plan counts on, with the memory it assumed."""
    import torch

    if cpu:
        return
    want, have = run.cluster["gpus_per_node"], torch.cuda.device_count()
    if have < want:
        raise PreflightError(
            f"this node has {have} NVIDIA GPU(s) (driver/CUDA visible to torch: "
            f"{torch.version.cuda or 'none'}), the plan needs {want}; check CUDA_VISIBLE_DEVICES and nvidia-smi"
        )
    need = run.cluster["gpu_memory_gib"] * 0.97 * 2**30
    for i in range(want):
        total = torch.cuda.get_device_properties(i).total_memory
        if total < need:
            raise PreflightError(
                f"GPU {i} has {total / 2**30:.1f} GiB, the plan assumed {run.cluster['gpu_memory_gib']:.1f}; "
                "plan again with --gpus matching this machine (or --gpu-memory)"
            )


def check_ops(spec: TrainSpec) -> None:
    """DeepSpeed ops the plan needs can be built here (CPU Adam for offload, async I/O for NVMe)."""
    needed = []
    if spec.offload_optimizer != "none" and spec.optimizer == "adamw":
        needed.append(("CPUAdamBuilder", "CPU Adam (optimizer offload)"))
    if "nvme" in (spec.offload_optimizer, spec.offload_params):
        needed.append(("AsyncIOBuilder", "async I/O (NVMe offload): apt-get install libaio-dev"))
    if not needed:
        return
    from launcher.train import deepspeed_import

    deepspeed_import.load()
    from deepspeed.ops import op_builder

    for name, what in needed:
        builder = getattr(op_builder, name)()
        if not builder.is_compatible(verbose=False):
            raise PreflightError(f"DeepSpeed cannot build {what} on this machine; ds_report shows why")


def check_compile(spec: TrainSpec, cpu: bool) -> None:
    """--compile: torch.compile's inductor builds its kernels here. On a CPU it compiles C++ (CXX, else
    g++ / clang++ / c++); on GPUs its kernels are Triton's, and Triton builds a C launcher (CC, else cc /
    gcc / clang). A container without a compiler fails in every rank at the first step otherwise."""
    if not spec.compile:
        return
    import importlib.util
    import shutil

    env, names = ("CXX", ("g++", "clang++", "c++")) if cpu else ("CC", ("cc", "gcc", "clang"))
    given = os.environ.get(env)
    if not (shutil.which(given) if given else any(shutil.which(n) for n in names)):
        what = f"${env}={given!r} is not" if given else f"no {' / '.join(names)} is"
        raise PreflightError(
            f"--compile: torch.compile builds its kernels with a {'C++' if cpu else 'C'} compiler and {what} on "
            "the PATH here; install one (apt-get install build-essential) or plan without --compile"
        )
    if not cpu and importlib.util.find_spec("triton") is None:
        raise PreflightError(
            "--compile: torch.compile's GPU kernels are Triton's, and triton is not installed (it comes with "
            "the CUDA builds of torch); pip install triton, or plan without --compile"
        )


def port_free(port: int, host: str = "0.0.0.0") -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _program_start(argv: list[str], entry) -> int | None:
    """Where the ranks' program begins in launch.sh's torchrun (or accelerate launch) command (None:
    not found)."""
    if entry is not None and entry.script is not None:
        return argv.index(entry.script) if entry.script in argv[1:] else None
    module = "launcher.train" if entry is None else entry.module
    for i in range(1, len(argv) - 1):
        if argv[i] in ("-m", "--module") and argv[i + 1] == module:
            return i
    return None


def allreduce(run_dir: Path, timeout: float = 60.0) -> list[dict]:
    """Run the all-reduce check with the job's own torchrun options; returns the per-rank reports."""
    from launcher.backends import torchrun

    argv, exported = torchrun.parse((run_dir / "launch.sh").read_text(errors="replace"), run_dir)
    if "--rdzv-endpoint" in argv[:-1]:
        host, _, port = argv[argv.index("--rdzv-endpoint") + 1].rpartition(":")
        if (
            host in ("127.0.0.1", "localhost", socket.gethostname())
            and port.isdigit()
            and not port_free(int(port))
        ):
            raise PreflightError(
                f"rendezvous port {port} is already in use on this host; pick another --rdzv-endpoint"
            )
    i = _program_start(argv, read_run_dir(run_dir).program)
    if i is None:
        raise PreflightError(
            f"{run_dir}/launch.sh does not start the program plan.json names; the all-reduce check runs only "
            "with launch.sh as ftlaunch writes it (write it again with --dry-run, or --no-allreduce)"
        )
    # the program's place: `-m NAME` (torchrun, or rank_exit's), `--module NAME` (accelerate), or a script
    # (run by rank_exit, which takes -m)
    flag = argv[i] if argv[i] in ("-m", "--module") else "-m"
    argv = [*argv[:i], flag, "launcher.train.allreduce_check", str(run_dir), str(timeout)]
    argv = [a for a in argv if a not in ("--tee", "3")]
    env = {**os.environ, **exported}
    out = run_dir / "logs" / "preflight"
    if out.exists():
        for f in out.glob("rank-*.json"):
            f.unlink()
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        proc = None
    reports = [json.loads(f.read_text()) for f in sorted(out.glob("rank-*.json"))] if out.exists() else []
    cluster = read_run_dir(run_dir).cluster
    expected = cluster["nodes"] * cluster["gpus_per_node"]
    bad = [r for r in reports if r.get("allreduce") != "ok"]
    if proc is None or len(reports) < expected or bad:
        hosts = sorted({r["host"] for r in bad}) or ["(ranks that never reported)"]
        detail = (
            bad[0]["allreduce"]
            if bad
            else f"{len(reports)} of {expected} ranks reported within {timeout:.0f} s"
        )
        raise PreflightError(
            f"all-reduce across {expected} ranks failed on {', '.join(hosts)}: {detail}; check the network between "
            "nodes, and for NCCL set NCCL_SOCKET_IFNAME to the right interface (NCCL_IB_DISABLE=1 if InfiniBand is "
            "down, NCCL_DEBUG=INFO for details)"
        )
    if not _is_cpu_run(run_dir):  # every node, not only this one, has the GPUs the plan counts on
        short = sorted({r["host"] for r in reports if r.get("gpus", 0) < cluster["gpus_per_node"]})
        small = sorted(
            {r["host"] for r in reports if r.get("gpu_memory_gib", 0) < cluster["gpu_memory_gib"] * 0.97}
        )
        if short or small:
            raise PreflightError(
                f"GPUs on {', '.join(short or small)} do not match the plan ({cluster['gpus_per_node']} x "
                f"{cluster['gpu_memory_gib']:.0f} GiB per node); plan again for the hardware these nodes have"
            )
    blind = sorted({r["host"] for r in reports if not r.get("sees_run_dir")})
    if blind:
        raise PreflightError(
            f"the run directory is not visible from {', '.join(blind)}: multi-node runs need it on a shared filesystem"
        )
    unseen = [r for r in reports if r.get("missing")]
    if unseen:
        raise PreflightError(
            f"{unseen[0]['missing']} is not visible from {', '.join(sorted({r['host'] for r in unseen}))}: your program "
            "and the directory it starts in must be on a filesystem every node sees (or at the same path on each)"
        )
    return reports
