"""One row of bench/gpu_memory.py: the run directory, random weights, data, and the real worker.

The worker (`python -m launcher.train RUN_DIR`) runs as one process with world size 1, as
torchrun would start rank 0 of one; it logs torch.cuda max allocated / max reserved (and the
host RSS) with every step in logs/metrics.jsonl. Once step --steps is logged the process is
killed while it trains on (max_steps is far beyond, save_every farther): nothing is being
checkpointed, evaluated or exported then, and the figures are those logged at step --steps.
Everything that imports torch runs in a subprocess: this process never creates a CUDA context.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.2
EXTRA_STEPS = 1_000_000  # steps the worker may run on before it is seen and killed


def write_data(path: Path, seq_len: int, records: int = 8) -> Path:
    """Long plain-text records: with the byte tokenizer every sample is exactly seq_len tokens."""
    rng = random.Random(0)
    words = ["memory", "gradient", "optimizer", "activation", "token", "layer", "shard", "adapter"]
    with open(path, "w") as f:
        for _ in range(records):
            text = ""
            while len(text) < seq_len + 64:
                text += rng.choice(words) + " "
            f.write(json.dumps({"text": text}) + "\n")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(cpu: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    if cpu:
        env.update(DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="2")
    return env


MAKE_WEIGHTS = """
import copy, json, sys, torch, transformers
cfg = json.loads(sys.argv[1]); out, device = sys.argv[2], sys.argv[3]
config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
torch.manual_seed(0)
with torch.device(device):
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
model.save_pretrained(out)
"""


def make_weights(model: str, out: Path, cpu: bool, timeout: float) -> None:
    """A random checkpoint of the catalog model, written once (initialised on the GPU if there is one)."""
    from launcher.models.catalog import resolve_model

    if (out / "config.json").is_file():
        return
    cfg = json.dumps(resolve_model(model).hf_config)
    proc = subprocess.run(
        [sys.executable, "-c", MAKE_WEIGHTS, cfg, str(out), "cpu" if cpu else "cuda"],
        env=worker_env(cpu),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"random weights for {model}: {last_error(proc.stderr)}")


def last_error(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    for line in reversed(lines):
        if "Error" in line or "error:" in line or "Killed" in line:
            return line[:300]
    return lines[-1][:300] if lines else "no output"


def write_run(work: Path, c, gpus: str, weights: Path, data: Path, steps: int, est: dict) -> Path:
    """The run directory of config `c` (gpu_memory.Config) as `ftlaunch --dry-run` writes it: pretrained = the random checkpoint,
    max_steps far past --steps (the worker is killed once step --steps is logged), no saves."""
    from launcher.emit import artifacts
    from launcher.hardware import parse_gpus
    from launcher.models.catalog import resolve_model
    from launcher.rundir import TrainingConfig
    from launcher.spec import TrainSpec

    arch, cluster = resolve_model(c.model), parse_gpus(gpus)
    spec = TrainSpec(
        method=c.method,
        precision=c.precision,
        micro_batch=c.micro_batch,
        seq_len=c.seq_len,
        grad_ckpt=c.grad_ckpt,
        zero_stage=0,
        compile=c.compile,
    )
    cfg = TrainingConfig(
        data=str(data),
        init="pretrained",
        max_steps=steps + EXTRA_STEPS,
        save_every=10**9,
        log_every=1,
        lr=1e-5,
    )
    run = artifacts.run_file(
        c.name, arch, str(weights), spec, cluster, 1, c.micro_batch, {"estimate": est}, cfg, max_restarts=0
    )
    run_dir, _ = artifacts.write(work, run, arch, spec, cluster, explain="bench/gpu_memory.py\n")
    return run_dir


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "logs" / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows


def run_worker(run_dir: Path, steps: int, cpu: bool, timeout: float, torch_adam: bool) -> dict:
    """Start the worker, wait for its step-`steps` record, stop it; the record's peaks or the error."""
    if torch_adam:
        ds = json.loads((run_dir / "ds_config.json").read_text())
        ds["optimizer"]["params"]["torch_adam"] = True
        (run_dir / "ds_config.json").write_text(json.dumps(ds, indent=2) + "\n")
    log = run_dir / "logs" / "worker.log"
    deadline = time.monotonic() + timeout
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "launcher.train", str(run_dir)],
            env=worker_env(cpu),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
        record, code = None, None
        try:
            while record is None and code is None and time.monotonic() < deadline:
                time.sleep(POLL_S)
                code = proc.poll()
                record = next((r for r in _records(run_dir) if r.get("step") == steps), None)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if record is not None:
        keys = ("peak_allocated_gib", "peak_reserved_gib", "host_rss_gib", "tokens_per_s")
        return {"status": "ok", **{k: record.get(k) for k in keys}, "loss": record.get("loss")}
    if code is None:
        return {"status": f"failed: timeout after {timeout:.0f} s (step {steps} not reached)"}
    return {"status": f"failed: {last_error(log.read_text(errors='replace'))}"}


PACKAGES = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "deepspeed",
    "bitsandbytes",
    "pydantic",
    "jinja2",
    "rich",
)
PROBE = """
import json
out = {}
try:
    import bitsandbytes  # noqa: F401
except Exception as exc:
    out["bitsandbytes_error"] = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
import torch
out["cuda"] = torch.cuda.is_available()
if out["cuda"]:
    p = torch.cuda.get_device_properties(0)
    out["device"], out["gpu_memory_gib"] = p.name, round(p.total_memory / 2**30, 2)
print(json.dumps(out))
"""

FUSED_ADAM = "from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load()"


def probe(cpu: bool) -> dict:
    """Installed versions (package metadata: nothing imported) and, unless --cpu, the CUDA device
    and whether bitsandbytes imports, from a subprocess."""
    from importlib import metadata

    env: dict = {"cuda": False}
    for name in PACKAGES:
        try:
            env[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            env[name], env[name + "_error"] = None, "not installed"
    if cpu:
        return env
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"gpu_memory: cannot import torch: {last_error(proc.stderr)}")
    env.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    if "bitsandbytes_error" in env:
        env["bitsandbytes"] = None
    return env


def build_fused_adam(timeout: float = 300) -> str | None:
    """JIT-build DeepSpeed's FusedAdam (its AdamW on a GPU) once, outside any row; None when it
    builds, else why not (the rows then run with torch's AdamW and say so)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", FUSED_ADAM], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return f"the build took over {timeout:.0f} s"
    return None if proc.returncode == 0 else last_error(proc.stderr)
