"""Fit the speed model's efficiency constants on the calibration rows, and only on them.

    python bench/speed_fit.py            # print the fitted values and both sets' errors
    python bench/speed_fit.py --write    # and write them into launcher/planner/constants.py

The rows of bench/data/published_speed.jsonl carry a role, chosen before any fit: "calibration"
rows fit the constants below, "check" rows never do (bench/speed_accuracy.py reports them apart:
they are the speed model's honest error). The objective is the mean absolute log error of the
predicted tokens/s per GPU over the calibration rows (robust to one odd row, symmetric in too
fast / too slow). Each constant is searched within its bounds by golden-section steps, one at a
time, for a few sweeps (the objective is cheap: ~0.1 s per evaluation).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.speed_accuracy import CASES, evaluate  # noqa: E402
from launcher.planner import constants as C  # noqa: E402

CONSTANTS = ROOT / "launcher" / "planner" / "constants.py"
# name: (low, high, start, digits written). Every fit starts from the same point, so it is
# reproducible: the objective is flat along some constants (attention and overlap trade against the
# GEMM efficiency on these rows), and a search started from its last result drifts along that
# valley. Fused attention is bounded by what FlashAttention-2 publishes (50-73 % of the A100's peak
# forward, less backward: 0.55-0.8 of the large-GEMM rate), not by 1.
FITTED = {
    "MATMUL_EFFICIENCY": (0.30, 0.95, 0.80, 3),
    "FAST_GPU_EFFICIENCY_RATIO": (0.40, 1.00, 0.80, 3),
    "ELEMENTWISE_BYTES": (0.0, 800.0, 100.0, 0),
    "ATTENTION_EFFICIENCY_RATIO": (0.4, 0.85, 0.6, 3),
    "OVERLAP": (0.0, 1.0, 0.5, 2),
    "COMPILE_ELEMENTWISE_RATIO": (0.05, 1.0, 0.5, 2),
}
GOLDEN = (math.sqrt(5) - 1) / 2


def rows(role: str) -> list[dict]:
    out = [json.loads(line) for line in CASES.read_text().splitlines() if line.strip()]
    return [r for r in out if r["role"] == role]


def loss(calibration: list[dict]) -> float:
    errs = [abs(math.log(1 + evaluate(r)["error_pct"] / 100)) for r in calibration]
    return sum(errs) / len(errs)


def _search(name: str, lo: float, hi: float, calibration: list[dict], steps: int) -> None:
    def at(x: float) -> float:
        setattr(C, name, x)
        return loss(calibration)

    a, b = lo, hi
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = at(c), at(d)
    for _ in range(steps):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = at(c)
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = at(d)
    setattr(C, name, (a + b) / 2)


def fit(calibration: list[dict], sweeps: int = 4, steps: int = 18) -> dict[str, float]:
    for name, (_lo, _hi, start, _digits) in FITTED.items():
        setattr(C, name, start)
    for _ in range(sweeps):
        for name, (lo, hi, _start, _digits) in FITTED.items():
            _search(name, lo, hi, calibration, steps)
    return {
        name: round(getattr(C, name), digits) if digits else round(getattr(C, name))
        for name, (_, _, _, digits) in FITTED.items()
    }


def errors(role: str) -> list[float]:
    return [evaluate(r)["error_pct"] for r in rows(role)]


def write(values: dict[str, float]) -> None:
    text = CONSTANTS.read_text()
    for name, value in values.items():
        text, n = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", text, count=1, flags=re.M)
        if n != 1:
            raise SystemExit(f"{name} not found in {CONSTANTS}")
    CONSTANTS.write_text(text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", action="store_true", help="write the fitted values into constants.py")
    a = p.parse_args()
    calibration = rows("calibration")
    before = {name: getattr(C, name) for name in FITTED}
    values = fit(calibration)
    for name, value in values.items():
        setattr(C, name, value)
    print(f"fitted on {len(calibration)} calibration rows (mean |log error| {loss(calibration):.3f}):")
    for name, value in values.items():
        print(f"  {name} = {value!r}   (was {before[name]!r})")
    for role in ("calibration", "check"):
        e = [abs(x) for x in errors(role)]
        print(f"{role}: {len(e)} rows, median |error| {statistics.median(e):.1f} %, worst {max(e):.1f} %")
    if a.write:
        write(values)
        print(f"written to {CONSTANTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
