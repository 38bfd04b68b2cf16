"""Run `ftlaunch estimate` over measured runs and print the signed error per row and the median.

Input: a JSONL file in the shape of shared/data/published_memory.jsonl: each row has `args`
(the estimate flags, underscores for dashes), `measured` {value, unit GiB|GB}, `metric`
(allocated | reserved | nvidia-smi: which of our figures it is compared with) and `trust`.

    python bench/estimate_accuracy.py [FILE ...] [--json]

Defaults to ../shared/data/published_memory.jsonl next to the checkout, when present.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.cli import main as ftlaunch  # noqa: E402

DEFAULT = ROOT.parent / "shared" / "data" / "published_memory.jsonl"
METRIC_FIELD = {"allocated": "peak_allocated_gib", "reserved": "peak_reserved_gib", "nvidia-smi": "total_gib"}


def to_argv(args: dict) -> list[str]:
    argv = ["estimate", "--json"]
    for key, value in args.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


def estimate(args: dict) -> dict:
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        code = ftlaunch(to_argv(args))
    if code != 0:
        raise RuntimeError(err.getvalue().strip())
    return json.loads(buf.getvalue())


def measured_gib(row: dict) -> float:
    m = row["measured"]
    return m["value"] * (1e9 / 2**30 if m.get("unit", "GiB") == "GB" else 1.0)


def evaluate(rows: list[dict]) -> list[dict]:
    results = []
    for row in rows:
        try:
            est = estimate(row["args"])
        except RuntimeError as exc:
            results.append({"id": row["id"], "error": str(exc)})
            continue
        predicted = est["per_gpu"][METRIC_FIELD[row.get("metric", "allocated")]]
        measured = measured_gib(row)
        results.append(
            {
                "id": row["id"],
                "trust": row.get("trust", "?"),
                "metric": row.get("metric", "allocated"),
                "measured_gib": round(measured, 2),
                "ftlaunch_gib": predicted,
                "error_pct": round(100 * (predicted - measured) / measured, 1),
                "fits": est["fits"],
            }
        )
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", type=Path, help="JSONL files of measured runs")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    files = a.files or [DEFAULT]
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]
    results = evaluate(rows)
    errors = [abs(r["error_pct"]) for r in results if "error_pct" in r]
    summary = {
        "rows": len(results),
        "median_abs_error_pct": round(statistics.median(errors), 1) if errors else None,
        "worst_abs_error_pct": max(errors) if errors else None,
    }
    if a.json:
        print(json.dumps({"results": results, "summary": summary}, indent=2))
        return 0
    print(f"{'case':44} {'trust':5} {'metric':10} {'measured':>9} {'ftlaunch':>9} {'error':>8}")
    for r in results:
        if "error" in r:
            print(f"{r['id']:44} estimate failed: {r['error']}")
            continue
        print(
            f"{r['id']:44} {r['trust']:5} {r['metric']:10} {r['measured_gib']:9.1f} "
            f"{r['ftlaunch_gib']:9.1f} {r['error_pct']:+7.1f}%"
        )
    print(
        f"\nmedian |error| {summary['median_abs_error_pct']}%  worst |error| {summary['worst_abs_error_pct']}%"
        f"  over {len(errors)} rows (GiB; GB rows converted)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
