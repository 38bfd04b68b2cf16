"""Where the storages alive at a step's peak were allocated, in DeepSpeed's own engine on CPU ranks.

A debugging tool for the memory model (not a test): it runs tests/stage_memory_probe.py's setup with
a tracker that records each new storage's allocation site (the innermost frames in deepspeed/,
transformers/ and launcher/) and prints the largest storages alive when the measured step's peak
was reached, on rank 0. Every DeepSpeed term in launcher/memory/transients.py and hpZ's secondary
shards were found this way.

    .venv/bin/python tests/alloc_sites.py --zero-stage 3 --hpz 2 --precision fp32 \
        --micro-batch 1 --seq-len 32 --gpus 1x4xA100
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEEP = ("deepspeed", "launcher", "transformers")


def _rank_main() -> int:
    import gc

    from launcher.train import engines, loop
    from tests import memtrack, stage_memory_probe

    class Sites(memtrack.ActivationPeak):
        def __init__(self, params) -> None:
            super().__init__(params)
            self.site: dict[int, tuple[int, str]] = {}
            self.at_peak: list[tuple[int, str]] = []

        def _track(self, t) -> None:
            st = t.untyped_storage()
            key = id(st)
            if key in self._seen or st.nbytes() == 0:
                return
            frames = [f for f in traceback.extract_stack()[:-3] if any(k in f.filename for k in KEEP)]
            where = " < ".join(f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in reversed(frames[-4:]))
            self.site[key] = (st.nbytes(), where)
            before = self.peak
            super()._track(t)
            if self.peak > before:
                alive = (self.site[k] for k in self.site if k in self._seen)
                self.at_peak = sorted(alive, reverse=True)[:20]

        def _release(self, key: int, n: int) -> None:
            super()._release(key, n)
            self.site.pop(key, None)

    def measured(step_fn):
        def step(self, batches, step: int):
            if step != stage_memory_probe.MEASURED_STEP:
                return step_fn(self, batches, step)
            gc.collect()
            with Sites(self.ds.module.parameters()) as live:
                out = step_fn(self, batches, step)
            if os.environ["RANK"] == "0":
                print(f"peak of the step's new storages: {live.peak:,} bytes; the largest alive then:")
                for n, where in live.at_peak:
                    print(f"  {n:>14,}  {where}")
            return out

        return step

    engines.DataParallel.step = measured(engines.DataParallel.step)
    return loop.exit_process(loop.main())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", default="1x2xA100", help="ranks as a cluster shape (CPU ranks stand for them)")
    for flag, kind in (("--zero-stage", int), ("--hpz", int), ("--micro-batch", int), ("--seq-len", int)):
        p.add_argument(flag, type=kind)
    for flag in ("--precision", "--offload-optimizer", "--offload-params", "--grad-ckpt"):
        p.add_argument(flag)
    p.add_argument("--tied", action="store_true", help="tie the embeddings to the LM head")
    a = p.parse_args()

    from launcher.spec import TrainSpec
    from tests.runs import cpu_env, make_run
    from tests.stage_memory_probe import long_records
    from tests.test_memory_activations import CFG

    fields = ("zero_stage", "hpz", "micro_batch", "seq_len", "precision", "offload_optimizer", "offload_params", "grad_ckpt")
    spec = TrainSpec(**{f: getattr(a, f) for f in fields if getattr(a, f) is not None})
    root = Path(tempfile.mkdtemp(prefix="alloc-sites-"))
    config = root / "config.json"
    config.write_text(json.dumps({**CFG, "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": a.tied}))
    run_dir, _ = make_run(root, "sites", spec, model=str(config), gpus=a.gpus, max_steps=2, save_every=100,
                          data=str(long_records(root / "long.jsonl")))  # fmt: skip
    from launcher.hardware import parse_gpus

    world = parse_gpus(a.gpus).world_size
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}", __file__, "--rank", str(run_dir)]
    env = {**cpu_env(), "FTLAUNCH_PROBE_OUT": str(root)}
    return subprocess.run(cmd, env=env, timeout=900).returncode


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        sys.path.insert(0, str(ROOT))
        sys.argv = [sys.argv[0], *sys.argv[2:]]  # the worker reads the run directory from argv
        sys.exit(_rank_main())
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
