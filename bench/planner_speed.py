"""How fast the planner searches: the whole space for bloom-176b on 8 nodes x 8 A100s.

Prints the size of the search space, how many memory estimates the search computed, how many
candidates it pruned as provably over budget, and the median wall time of the search over
several runs (target: under 0.2 s on a 2-core CI box), then the cold-process time of
`ftlaunch plan --model bloom-176b --gpus 8xA100 --json` (a fresh interpreter each run).

    .venv/bin/python bench/planner_speed.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from launcher.hardware import parse_gpus
from launcher.models.catalog import resolve_model
from launcher.planner.plans import Request
from launcher.planner.search import plan

ROOT = Path(__file__).resolve().parent.parent
COLD = ["plan", "--model", "bloom-176b", "--gpus", "8xA100", "--json"]


def search_times(runs: int, global_batch: int | None) -> tuple[list[float], object]:
    request = Request(resolve_model("bloom-176b"), parse_gpus("8x8xA100"), global_batch=global_batch)
    times, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = plan(request)
        times.append(time.perf_counter() - started)
    return times, result


def cold_times(runs: int) -> list[float]:
    code = "import sys; from launcher.cli import main; sys.exit(main(sys.argv[1:]))"
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code, *COLD], cwd=ROOT, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    for global_batch, why in ((None, "the default"), (4096, "every micro-batch 1..64 reachable at DP 64")):
        times, result = search_times(args.runs, global_batch)
        print(
            f"bloom-176b, full fine-tuning, 8 x 8 x A100-80GB, global batch {result.global_batch} ({why}); "
            "every stage, offload, TP, PP, micro-batch, recompute"
        )
        print(f"  candidate plans in the space : {result.candidates:,}")
        print(f"  memory estimates computed    : {result.evaluated:,} (lower-bound checks included)")
        print(f"  pruned as provably over      : {result.pruned:,}")
        print(f"  feasible plans               : {len(result.ranked):,}; best: {result.best.summary()}")
        print(
            f"  search wall time             : median {statistics.median(times) * 1000:.1f} ms, "
            f"min {min(times) * 1000:.1f} ms over {len(times)} runs (first run: {times[0] * 1000:.1f} ms)"
        )
    cold = cold_times(max(3, args.runs // 2))
    print(f"cold process: ftlaunch {' '.join(COLD)}")
    print(f"  wall time                    : median {statistics.median(cold):.3f} s over {len(cold)} runs")


if __name__ == "__main__":
    main()
