"""Host RAM while a node's ranks load the model, measured on real ranks.

Run as a script under torchrun (`python tests/load_probe.py RUN_DIR OUT_DIR`) it is a worker rank
up to the end of loading: it joins the process group, notes its proportional set size (PSS: each
shared page split between the processes mapping it, so the ranks' PSS add up to what the node
holds), loads its model exactly as the worker does (launcher/train/model.rank_model), reads every
weight once where the weights are not partitioned (what the move to a GPU does), notes its PSS
again and, with FTLAUNCH_PROBE_DIGEST=1, writes a digest of every full parameter (gathered under
ZeRO-3). `measure_loading` runs the ranks and samples the summed PSS of all of them every few
milliseconds, so the peak includes transients inside loading. Used by tests/test_loading.py and
bench/host_loading.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SAMPLE_S = 0.02


def pss(pid: int | str = "self") -> int:
    """Bytes of the process's proportional set size (0 once it has gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _digests(model) -> dict[str, str]:
    import torch

    out = {}
    for name, p in model.named_parameters():
        if hasattr(p, "ds_id"):
            import deepspeed

            with deepspeed.zero.GatheredParameters([p]):
                out[name] = hashlib.sha256(p.detach().to(torch.float32).numpy().tobytes()).hexdigest()
        else:
            out[name] = hashlib.sha256(p.detach().to(torch.float32).numpy().tobytes()).hexdigest()
    return out


def rank_main(run_dir: Path, out: Path) -> None:
    import torch

    from launcher.rundir import read_run_dir
    from launcher.spec import TrainSpec
    from launcher.train.distributed import init
    from launcher.train.model import rank_model

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    (out / f"pid-{rank}").write_text(str(os.getpid()))
    run = read_run_dir(run_dir)
    spec = TrainSpec(**run.spec)
    ds_config = json.loads((run_dir / "ds_config.json").read_text())
    init("gloo")
    import deepspeed  # noqa: F401 -- a rank's baseline holds the libraries it trains with
    import peft  # noqa: F401
    import transformers  # noqa: F401

    torch.distributed.barrier()
    before = pss()
    torch.distributed.barrier()  # every rank's baseline taken before any rank loads
    model, _, hf_ds = rank_model(run, spec, ds_config, rank, world, None)
    partitioned = [p for p in model.parameters() if hasattr(p, "ds_id")]
    held = sum(p.ds_tensor.numel() for p in partitioned) if partitioned else None
    if not partitioned:
        for p in model.parameters():
            p.detach().float().sum()  # every page read once, as a copy to the GPU reads it
    after = pss()
    torch.distributed.barrier()
    record = {"rank": rank, "baseline": before, "loaded": after, "held_numel": held,
              "numel": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())}
    if os.environ.get("FTLAUNCH_PROBE_DIGEST") == "1":
        record["digests"] = _digests(model)
    (out / f"rank-{rank}.json").write_text(json.dumps(record))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    del hf_ds


def measure_loading(run_dir: Path, out: Path, ranks: int, env: dict, digest: bool = False) -> dict:
    """Runs `ranks` probe ranks on run_dir; returns the per-rank records, the peak of their
    summed PSS over the whole run and its wall time."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(ranks), __file__, str(run_dir), str(out)]
    env = {**env, "FTLAUNCH_PROBE_DIGEST": "1" if digest else "0"}
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = 0
    while proc.poll() is None:
        pids = [f.read_text() for f in out.glob("pid-*") if f.read_text()]
        peak = max(peak, sum(pss(p) for p in pids))
        time.sleep(SAMPLE_S)
    log = proc.stdout.read()
    if proc.returncode != 0:
        raise RuntimeError(f"probe ranks failed ({proc.returncode}):\n{log[-4000:]}")
    records = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)]
    return {"ranks": records, "peak_sum": peak, "seconds": time.monotonic() - start}


if __name__ == "__main__":
    rank_main(Path(sys.argv[1]), Path(sys.argv[2]))
