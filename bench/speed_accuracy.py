"""The planner's speed model against published throughput: tokens/s per GPU, predicted vs measured.

    python bench/speed_accuracy.py
    python bench/speed_accuracy.py --markdown bench/results/speed_accuracy.md --json bench/results/speed_accuracy.json

Rows (bench/data/published_speed.jsonl): id, role ("calibration": bench/speed_fit.py fits the
efficiency constants on it; "check": never used to fit, chosen before any fit), measured
{tokens_per_s_per_gpu}, args (the flags of `ftlaunch plan` that pin the whole configuration:
model (a catalog name or a config.json under bench/data/speed_models/), gpus, method, precision,
micro_batch, seq_len, grad_ckpt, zero_stage, tp, pp, grad_accum; inter_node_bandwidth in GB/s per
node where the row's network differs from the catalog's; cpu_cores per node; gpu_memory where
the device is not in the GPU catalog), source, quote / derivation, assumed (what the source does
not state), note (what the measured program does differently), miss (for a check row outside
TARGET_WORST: why, as far as the source tells). bench/results/gpu_speed.jsonl (what
bench/gpu_memory.py measured with ftlaunch's own worker on a GPU) is read too when present.

The target on the check rows: median |error| <= TARGET_MEDIAN %, each row within TARGET_WORST %
or printed below the table with its reason.

Per row: the predicted tokens/s per GPU (launcher/planner/perf.py, what the planner ranks plans
by), its signed error, the matmul efficiency the model used for that GPU, the share of the
predicted step spent in matmuls, and the efficiency that would make the row exact (compute and
recompute scale with 1 / efficiency, the other terms do not): where the constants in
launcher/planner/constants.py come from. Published throughput is of other programs (torchtune,
torchtitan's FSDP2) running the same configuration; ours runs DeepSpeed. Each row's note says
what differs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.hardware import parse_gpus  # noqa: E402
from launcher.models.catalog import resolve_model  # noqa: E402
from launcher.planner.perf import matmul_efficiency, performance  # noqa: E402
from launcher.spec import TrainSpec  # noqa: E402

CASES = ROOT / "bench" / "data" / "published_speed.jsonl"
CLUSTER_KEYS = ("model", "gpus", "gpu_memory", "inter_node_bandwidth", "cpu_cores")
GPU_MEASURED = (ROOT / "bench" / "results" / "gpu_speed.jsonl", ROOT / "bench" / "results" / "gpu_speed.compiled.jsonl")
MATMUL_TERMS = ("compute", "recompute")
ROLES = ("calibration", "check")
TARGET_MEDIAN = 10.0
TARGET_WORST = 25.0
# issue 18: the TP, pipeline and offload terms against published 3D / offload runs, each row
TARGET_PARALLEL = 15.0


def configuration(args: dict):
    """(arch, spec, cluster, dp) from a row's flags."""
    model = args["model"]
    arch = resolve_model(str(ROOT / model) if model.startswith("bench/") else model)
    cluster = parse_gpus(
        args["gpus"],
        gpu_memory_gib=args.get("gpu_memory"),
        inter_node_bandwidth_gbs=args.get("inter_node_bandwidth"),
        cpu_cores=args.get("cpu_cores"),
    )
    spec = TrainSpec(**{k: v for k, v in args.items() if k not in CLUSTER_KEYS})
    return arch, spec, cluster, cluster.world_size // (spec.tp * spec.pp)


def evaluate(row: dict) -> dict:
    arch, spec, cluster, dp = configuration(row["args"])
    perf = performance(arch, spec, cluster, dp)
    used = matmul_efficiency(cluster.gpu, spec.precision)
    measured = row["measured"]["tokens_per_s_per_gpu"]
    predicted = perf.tokens_per_s / cluster.world_size
    matmul = sum(perf.breakdown[t] for t in MATMUL_TERMS)
    rest = perf.step_time_s - matmul
    target_step = perf.step_time_s * predicted / measured  # the step that gives the measured rate
    implied = used * matmul / (target_step - rest) if target_step > rest else None
    return {
        "id": row["id"],
        "role": row.get("role", "check"),
        "gpu": cluster.gpu.name,
        "measured": measured,
        "predicted": round(predicted, 1),
        "error_pct": round(100 * (predicted - measured) / measured, 2),
        "efficiency": round(used, 3),
        "matmul_share": round(matmul / perf.step_time_s, 3),
        "implied_efficiency": round(implied, 3) if implied else None,
        "mfu": round(perf.mfu, 3),
        # a row with the parallel or offload terms (TP all-reduce, pipeline bubble and sends, offload traffic)
        "parallel": spec.tp > 1 or spec.pp > 1 or spec.offload_optimizer != "none" or spec.offload_params != "none",
        "breakdown_s": {k: round(v, 4) for k, v in perf.breakdown.items() if v},
        "note": row.get("note", ""),
        "miss": row.get("miss", ""),
        "source": row.get("source", ""),
    }


def _stats(results: list[dict]) -> dict:
    errs = [abs(r["error_pct"]) for r in results]
    return {
        "rows": len(results),
        "median_abs_error_pct": round(statistics.median(errs), 1) if errs else None,
        "worst_abs_error_pct": round(max(errs), 1) if errs else None,
    }


def summarise(results: list[dict]) -> dict:
    """Both sets' errors, every row's, and whether the check rows meet the target."""
    out = _stats(results)
    for role in ROLES:
        out[role] = _stats([r for r in results if r["role"] == role])
    check = out["check"]
    out["check_misses"] = [r["id"] for r in results if r["role"] == "check" and abs(r["error_pct"]) > TARGET_WORST]
    out["check_median_met"] = check["rows"] > 0 and check["median_abs_error_pct"] <= TARGET_MEDIAN
    out["parallel"] = _stats([r for r in results if r["parallel"]])
    out["parallel_misses"] = [r["id"] for r in results if r["parallel"] and abs(r["error_pct"]) > TARGET_PARALLEL]
    return out


def _table(results: list[dict]) -> list[str]:
    lines = [
        "| case | GPU | measured | predicted | error | efficiency | matmul share | implied | predicted MFU |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        implied = f"{r['implied_efficiency']:.3f}" if r["implied_efficiency"] else "—"
        lines.append(
            f"| {r['id']} | {r['gpu']} | {r['measured']:,.0f} | {r['predicted']:,.0f} | {r['error_pct']:+.1f}% "
            f"| {r['efficiency']:.3f} | {r['matmul_share']:.0%} | {implied} | {r['mfu']:.0%} |"
        )
    return lines


def markdown(results: list[dict], summary: dict) -> str:
    lines = [
        "Tokens/s per GPU, published vs the planner's speed model (launcher/planner/perf.py). Efficiency =",
        "the large-GEMM efficiency the model takes for that GPU; matmul share = compute + recompute of the",
        "predicted step; implied = the efficiency that would make the row exact.",
    ]
    for role, title in (
        ("calibration", "Calibration rows (bench/speed_fit.py fits the constants on these)"),
        ("check", "Check rows (never used to fit)"),
    ):
        part = [r for r in results if r["role"] == role]
        stats = summary[role]
        lines += ["", f"### {title}", ""] + _table(part)
        if part:
            lines += [
                "",
                f"{role.capitalize()}: median |error| {stats['median_abs_error_pct']} %, worst "
                f"{stats['worst_abs_error_pct']} % over {stats['rows']} rows.",
            ]
    check = summary["check"]
    if check["rows"]:
        met = "met" if summary["check_median_met"] else "NOT met"
        lines += [
            "",
            f"Target on the check rows: median |error| <= {TARGET_MEDIAN:g} % ({met}: {check['median_abs_error_pct']} %), "
            f"each row within {TARGET_WORST:g} % or listed here with its reason "
            f"({len(summary['check_misses'])} outside):",
            "",
        ]
        for r in results:
            if r["id"] in summary["check_misses"]:
                lines.append(f"- {r['id']} ({r['error_pct']:+.1f} %): {r['miss'] or 'no reason recorded'}")
    par = summary["parallel"]
    if par["rows"]:
        lines += [
            "",
            f"Parallel and offload terms (rows with TP, PP or offload, both sets): median |error| "
            f"{par['median_abs_error_pct']} % over {par['rows']} rows; target each within {TARGET_PARALLEL:g} % or "
            f"listed here with its reason ({len(summary['parallel_misses'])} outside):",
            "",
        ]
        for r in results:
            if r["id"] in summary["parallel_misses"]:
                why = r["miss"] or r["note"] or "no reason recorded"
                lines.append(f"- {r['id']} ({r['role']}, {r['error_pct']:+.1f} %): {why}")
    lines += ["", "What the measured programs do differently:", ""]
    lines += [f"- {r['id']}: {r['note']}" for r in results if r["note"]]
    lines += ["", "Sources:", ""]
    lines += [f"- {r['id']}: {r['source']}" for r in results if r["source"]]
    lines += ["", "Produced by `python bench/speed_accuracy.py`."]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "cases", nargs="*", type=Path, help="JSONL rows (default: published_speed.jsonl + GPU results)"
    )
    p.add_argument("--markdown", type=Path, metavar="FILE", help="write the table as markdown")
    p.add_argument("--json", type=Path, metavar="FILE", help="write every result as JSON")
    a = p.parse_args()
    files = a.cases or [CASES] + [p for p in GPU_MEASURED if p.exists()]
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]
    results = [evaluate(r) for r in rows]
    summary = summarise(results)
    text = markdown(results, summary)
    print(text)
    for path, body in (
        (a.markdown, text),
        (a.json, json.dumps({"results": results, "summary": summary}, indent=2) + "\n"),
    ):
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
