"""Measure real GPU memory against the estimate: the project's own worker, one process per row.

For each configuration of a matrix (model x method x activation checkpointing x sequence length
x micro-batch, one GPU, ZeRO-0, AdamW, sdpa) this writes a run directory, runs the real worker
(`python -m launcher.train RUN_DIR`, one process, world size 1) for --steps optimizer steps so
that the optimizer states exist at the peak, reads torch.cuda.max_memory_allocated / _reserved
from the worker's logs/metrics.jsonl at that step, and kills it as it trains on (no checkpoint,
eval or export is ever written). Each row records the estimate (`ftlaunch estimate --json`,
the same estimate bench/accuracy.py makes) next to the measured figures and the signed
error (estimate - measured) / measured. bench/gpu_memory_matrix.py orders and budgets the rows,
bench/gpu_memory_run.py runs one, bench/gpu_memory_outputs.py writes what they measured.

    python bench/gpu_memory.py --budget-s 480     on a machine with an NVIDIA GPU (~8 minutes)
    python bench/gpu_memory.py --cpu              the CPU smoke path: tiny-llama, full + lora, seq 128
    python bench/gpu_memory.py --dry-run          the matrix in run order with its estimates; runs nothing
    python bench/gpu_memory.py --compile --models llama-3.2-1b --methods full --budget-s 150
                                                  the same rows with compiled blocks (the speed model's
                                                  --compile term against our worker; after the plain run)

Rows run cheapest first in passes: pass 0 is every model x method at the first checkpointing
mode and the shortest sequence, pass 1 the longest sequence with the last checkpointing mode,
then the rest, so a short budget still covers every model. A row is skipped (and recorded so)
when the estimate says it does not fit the GPU (--run-unfit runs it anyway), when QLoRA has no
bitsandbytes or no GPU, and not run when its predicted time exceeds what is left of
--budget-s. Outputs are rewritten after every row, so a run cut short keeps what it measured.

Outputs (GPU run; a CPU run writes *.cpu.* beside them, a --compile run *.compiled.*):
    bench/results/gpu_memory.jsonl   one row per configuration: estimate, measured, error, status
    bench/results/gpu_memory.md      the same as a markdown table (for the README)
    bench/results/gpu_measured.jsonl two rows per measured configuration (metric allocated and
                                     reserved) in the shape of shared/data/published_memory.jsonl,
                                     trust A: `python bench/accuracy.py bench/results/gpu_measured.jsonl`
    bench/results/gpu_speed.jsonl    tokens/s of the last measured step beside the planner's speed
                                     model, in the shape of bench/data/published_speed.jsonl
                                     (`python bench/speed_accuracy.py` reads it)

Weights are random (the GPU machine has no internet): once per model a random checkpoint is
written to the work directory (initialised on the GPU, which is fast) and every row loads it as
a pretrained model, so QLoRA quantises it on load exactly as for a real checkpoint. Data is a
synthetic JSONL of long `text` records (1 byte = 1 token with the built-in byte tokenizer), so
every sample is exactly --seq-len tokens, no padding.

What the GPU machine needs (no internet there; carry wheels): torch with CUDA, transformers,
peft, accelerate, deepspeed (with nvcc + ninja: its FusedAdam is JIT-built once, ~1 min,
before the first row), pydantic, jinja2, rich, hjson; optionally bitsandbytes for QLoRA.
`python bench/gpu_memory.py --check` prints what is installed and the device. On the project's H200 image
deepspeed, hjson, pydantic (+ pydantic-core, annotated-types, typing-inspection) and bitsandbytes
are missing; deepspeed is an sdist: build its wheel here with
`DS_BUILD_OPS=0 pip wheel --no-deps --no-build-isolation -w .whl deepspeed==VERSION`. Then there:

    PYTHONUNBUFFERED=1 PYTHONPATH=.:$PYTHONPATH python3 bench/gpu_memory.py --budget-s 480
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_memory_matrix import matrix, plan_rows, run_rows  # noqa: E402
from bench.gpu_memory_outputs import markdown, write_outputs  # noqa: E402
from bench.gpu_memory_run import (  # noqa: E402
    build_fused_adam,
    make_weights,
    probe,
    run_worker,
    write_data,
    write_run,
)

RESULTS = ROOT / "bench" / "results"
GPU_DEFAULTS = {
    "models": "qwen2.5-0.5b,llama-3.2-1b,llama-3.2-3b,llama-3.1-8b",
    "methods": "full,lora,qlora",
    "grad_ckpt": "none,full",
    "seq_lens": "1024,4096",
}
CPU_DEFAULTS = {"models": "tiny-llama", "methods": "full,lora", "grad_ckpt": "none", "seq_lens": "128"}
CPU_NOMINAL_GPU = "H200"  # the CPU path still estimates for a GPU; its figures are not compared



# --- estimate and error ---------------------------------------------------------------------------


def estimate(args: dict) -> dict:
    """`ftlaunch estimate --json` in this process (as bench/accuracy.py estimates)."""
    from launcher.cli import main as ftlaunch

    argv = ["estimate", "--json"]
    for key, value in args.items():
        flag = f"--{key.replace('_', '-')}"
        if isinstance(value, bool):  # a switch (--compile)
            argv += [flag] if value else []
        else:
            argv += [flag, str(value)]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = ftlaunch(argv)
    if code != 0:
        return {
            "error": err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {code}"
        }
    return json.loads(out.getvalue())


def predicted_speed(args: dict) -> float | None:
    """Tokens/s the planner's speed model (launcher/planner/perf.py) gives this one-GPU row."""
    from bench.speed_accuracy import configuration
    from launcher.errors import FtlaunchError
    from launcher.planner.perf import performance

    try:
        arch, spec, cluster, dp = configuration(args)
    except FtlaunchError:
        return None
    return round(performance(arch, spec, cluster, dp).tokens_per_s, 1)


def error_pct(est: float | None, measured: float | None) -> float | None:
    if est is None or not measured:
        return None
    return round(100 * (est - measured) / measured, 1)


# --- what this machine can run ---------------------------------------------------------------------


def unavailable_methods(env: dict, cpu: bool) -> dict[str, str]:
    out = {}
    if cpu or not env.get("cuda"):
        # QLoRA trains on CPU ranks too (tests/test_train_e2e.py), but this bench records the CUDA
        # allocator's peaks, which only an NVIDIA GPU has
        out["qlora"] = "QLoRA's GPU memory is measured on an NVIDIA GPU (the CPU path is tested elsewhere)"
    elif env.get("bitsandbytes") is None:
        out["qlora"] = f"bitsandbytes is not importable ({env.get('bitsandbytes_error', '?')})"
    return out


def gpu_for_estimate(env: dict, cpu: bool, override: str | None) -> tuple[str, float | None]:
    """The estimate's --gpus (and --gpu-memory when the device is not in the GPU catalog)."""
    from launcher.errors import FtlaunchError
    from launcher.gpus import resolve_gpu

    if override:
        return f"1x{override}", None
    if cpu or not env.get("cuda"):
        return f"1x{CPU_NOMINAL_GPU}", None
    try:
        return f"1x{resolve_gpu(env['device'])[0].name}", None
    except FtlaunchError:
        return "1xH100-80GB", env["gpu_memory_gib"]


# --- main -------------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/gpu_memory.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--cpu", action="store_true", help="CPU smoke path (automatic when there is no CUDA GPU)")
    p.add_argument("--models", help=f"catalog names (GPU default {GPU_DEFAULTS['models']}; CPU tiny-llama)")
    p.add_argument("--methods", help="full,lora,qlora (CPU default full,lora)")
    p.add_argument(
        "--grad-ckpt", help="activation checkpointing modes: none,selective,full (default none,full)"
    )
    p.add_argument("--seq-lens", help="sequence lengths (default 1024,4096; CPU 128)")
    p.add_argument("--micro-batch", default="1", help="micro-batch sizes (default 1)")
    p.add_argument("--precision", default="bf16", help="bf16 (mixed, the default), bf16-pure, fp16, fp32")
    p.add_argument(
        "--compile",
        action="store_true",
        help="every row with its blocks under torch.compile (rows named -compiled): the measured tokens/s "
        "checks the speed model's fused element-wise term; run beside a plain run of the same rows",
    )
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per row (default 3)")
    p.add_argument("--budget-s", type=float, default=480, help="wall-clock budget in seconds (default 480)")
    p.add_argument("--row-timeout-s", type=float, default=300, help="longest one row may run (default 300)")
    p.add_argument("--gpu", help="GPU catalog name for the estimate (default: the device's)")
    p.add_argument("--run-unfit", action="store_true", help="also run rows the estimate says do not fit")
    p.add_argument("--out", type=Path, help="rows JSONL (default bench/results/gpu_memory[.cpu].jsonl)")
    p.add_argument("--md", type=Path, help="markdown table (default beside --out, .md)")
    p.add_argument("--published", type=Path, help="published-format JSONL (default gpu_measured[.cpu].jsonl)")
    p.add_argument("--work-dir", type=Path, help="run dirs and random weights (default a temporary dir)")
    p.add_argument("--keep", action="store_true", help="keep the work dir (run dirs, logs, weights)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    p.add_argument("--dry-run", action="store_true", help="print the matrix in run order, run nothing")
    p.add_argument(
        "--check", action="store_true", help="print the installed packages and the device, then exit"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    env = probe(a.cpu)
    if a.check:
        print(json.dumps(env, indent=2))
        return 0
    cpu = a.cpu or not env.get("cuda")
    d = CPU_DEFAULTS if cpu else GPU_DEFAULTS
    models = (a.models or d["models"]).split(",")
    methods = (a.methods or d["methods"]).split(",")
    ckpts = (a.grad_ckpt or d["grad_ckpt"]).split(",")
    seqs = [int(s) for s in (a.seq_lens or d["seq_lens"]).split(",")]
    mbs = [int(b) for b in a.micro_batch.split(",")]
    gpus, gpu_memory = gpu_for_estimate(env, cpu, a.gpu)
    suffix = (".cpu" if cpu else "") + (".compiled" if a.compile else "")
    out = a.out or RESULTS / f"gpu_memory{suffix}.jsonl"
    md = a.md or out.with_suffix(".md")
    pub = a.published or out.parent / f"gpu_measured{suffix}.jsonl"
    meta = {
        "device": "CPU (host RSS only)" if cpu else env["device"],
        "torch": env["torch"],
        "deepspeed": env.get("deepspeed"),
        "transformers": env.get("transformers"),
        "date": datetime.date.today().isoformat(),
        "gpus": gpus,
        "steps": a.steps,
        "optimizer_impl": "DeepSpeed's CPU AdamW" if cpu else "DeepSpeed FusedAdam",
    }

    passes = matrix(models, methods, ckpts, seqs, mbs, a.precision, a.compile)
    args = {c: c.args(gpus, gpu_memory) for _, c in passes}
    estimates = {c: estimate(args[c]) for _, c in passes}
    unavailable = unavailable_methods(env, cpu)
    if env.get("deepspeed") is None:
        unavailable.update(
            dict.fromkeys(methods, f"deepspeed is not importable ({env.get('deepspeed_error')})")
        )
    rows = plan_rows(passes, estimates, unavailable, a.run_unfit)
    by_name = {c.name: c for _, c in passes}
    for r in rows:
        r["args"] = args[by_name[r["name"]]]
        r["est_tokens_per_s"] = predicted_speed(r["args"])
    if a.dry_run:
        for r in rows:
            print(
                f"pass {r['pass']}  {r['name']:48} est {r['est_peak_allocated_gib'] or 0:7.2f} GiB  "
                f"{r['status'] or ''}"
            )
        return 0

    start = time.monotonic()
    work = a.work_dir or Path(tempfile.mkdtemp(prefix="ftlaunch-gpu-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    torch_adam = False
    if not cpu:  # DeepSpeed JIT-builds FusedAdam on first use: once, before the first row
        why = build_fused_adam()
        if why:
            torch_adam, meta["optimizer_impl"] = True, f"torch AdamW (FusedAdam unavailable: {why})"
    print(
        f"[gpu_memory] {meta['device']}, torch {meta['torch']}, estimate for {gpus}, {len(rows)} rows",
        file=sys.stderr,
    )
    data = write_data(work / "data.jsonl", max(seqs))
    remaining = {m: sum(1 for r in rows if r["model"] == m and r["status"] is None) for m in models}
    no_weights: dict[str, str] = {}  # model -> why its random checkpoint could not be written

    def run_one(row: dict, left: float) -> dict:
        c, t0 = by_name[row["name"]], time.monotonic()
        weights = work / "weights" / c.model
        timeout = min(a.row_timeout_s, max(left, 30))
        try:
            if c.model in no_weights:
                raise RuntimeError(no_weights[c.model])
            try:
                make_weights(c.model, weights, cpu, timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                no_weights[c.model] = str(exc).splitlines()[0]
                raise
            run_dir = write_run(work / "runs", c, gpus, weights, data, a.steps, estimates[c])
            result = run_worker(run_dir, a.steps, cpu, timeout - (time.monotonic() - t0), torch_adam)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            result = {"status": f"failed: {str(exc).splitlines()[0][:300]}"}
        finally:
            remaining[c.model] -= 1
            if not a.keep:
                shutil.rmtree(work / "runs" / c.name, ignore_errors=True)
                if remaining[c.model] == 0:
                    shutil.rmtree(weights, ignore_errors=True)
        result["error_allocated_pct"] = error_pct(
            row["est_peak_allocated_gib"], result.get("peak_allocated_gib")
        )
        result["error_reserved_pct"] = error_pct(
            row["est_peak_reserved_gib"], result.get("peak_reserved_gib")
        )
        # a CPU run's tokens/s is not the estimated GPU's: not compared, as its memory is not
        result["error_speed_pct"] = (
            None if cpu else error_pct(row["est_tokens_per_s"], result.get("tokens_per_s"))
        )
        result["optimizer_impl"] = meta["optimizer_impl"]
        print(f"[gpu_memory] {row['name']}: {result['status']}", file=sys.stderr)
        return result

    def progress(rows_now: list[dict]) -> None:
        write_outputs(rows_now, meta, out, md, pub)

    write_outputs(rows, meta, out, md, pub)
    run_rows(rows, run_one, a.budget_s, started=start, on_row=progress)
    write_outputs(rows, meta, out, md, pub)
    if not a.keep:  # a given --work-dir stays, emptied of what this run wrote
        for path in [work] if a.work_dir is None else [work / "runs", work / "weights"]:
            shutil.rmtree(path, ignore_errors=True)
        data.unlink(missing_ok=True)
    if a.json:
        print(json.dumps(rows, indent=2))
    else:
        print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
