"""Cold-process time of `ftlaunch estimate --model bloom-176b --gpus 8xA100 --json` against
`python -c "import torch"`, measured alternately in the same run (the machine is noisy).

    python bench/cold_start.py [--runs 7]

Target (issue 2): median under 0.5 s and under a third of the torch import.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

ESTIMATE = [
    sys.executable,
    "-m",
    "launcher.cli",
    "estimate",
    "--model",
    "bloom-176b",
    "--gpus",
    "8xA100",
    "--json",
]
PLAN = [sys.executable, "-m", "launcher.cli", "plan", "--model", "bloom-176b", "--gpus", "8xA100", "--json"]
TORCH = [sys.executable, "-c", "import torch"]


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=7)
    a = p.parse_args()
    has_plan = subprocess.run(PLAN[:4] + ["--help"], capture_output=True).returncode == 0
    est, plan, torch = [], [], []
    timed(ESTIMATE)  # warm the page cache once
    for _ in range(a.runs):
        est.append(timed(ESTIMATE))
        if has_plan:
            plan.append(timed(PLAN))
        torch.append(timed(TORCH))
    e, t = statistics.median(est), statistics.median(torch)
    print(
        f"ftlaunch estimate bloom-176b --json  median {e:.3f} s  (runs: {', '.join(f'{x:.3f}' for x in est)})"
    )
    if plan:
        print(f"ftlaunch plan bloom-176b --json      median {statistics.median(plan):.3f} s")
    print(f"python -c 'import torch'             median {t:.3f} s")
    print(f"estimate / torch import = {e / t:.2f}  (target < 0.33; estimate target < 0.5 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
