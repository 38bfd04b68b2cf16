"""The planner's speed model against published throughput: tokens/s per GPU, predicted vs measured.

    python bench/speed_accuracy.py
    python bench/speed_accuracy.py --markdown bench/results/speed_accuracy.md --json bench/results/speed_accuracy.json

Rows (bench/data/published_speed.jsonl): id, role (what the row calibrates or checks), measured {tokens_per_s_per_gpu}, args (the flags of
`ftlaunch plan` that pin the whole configuration: model, gpus, method, precision, micro_batch,
seq_len, grad_ckpt, zero_stage, tp, pp, grad_accum; inter_node_bandwidth in GB/s per node where
the row's network differs from the catalog's; gpu_memory where the device is not in the GPU
catalog), source, note. bench/results/gpu_speed.jsonl (what bench/gpu_memory.py measured with
ftlaunch's own worker on a GPU) is read too when present.

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
CLUSTER_KEYS = ("model", "gpus", "gpu_memory", "inter_node_bandwidth")
GPU_MEASURED = ROOT / "bench" / "results" / "gpu_speed.jsonl"
MATMUL_TERMS = ("compute", "recompute")


def configuration(args: dict):
    """(arch, spec, cluster, dp) from a row's flags."""
    arch = resolve_model(args["model"])
    cluster = parse_gpus(
        args["gpus"],
        gpu_memory_gib=args.get("gpu_memory"),
        inter_node_bandwidth_gbs=args.get("inter_node_bandwidth"),
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
        "breakdown_s": {k: round(v, 4) for k, v in perf.breakdown.items() if v},
        "note": row.get("note", ""),
    }


def summarise(results: list[dict]) -> dict:
    errs = [abs(r["error_pct"]) for r in results]
    return {
        "rows": len(results),
        "median_abs_error_pct": round(statistics.median(errs), 1),
        "worst_abs_error_pct": round(max(errs), 1),
    }


def markdown(results: list[dict], summary: dict) -> str:
    lines = [
        "Tokens/s per GPU, published vs the planner's speed model (launcher/planner/perf.py). Efficiency =",
        "the matmul efficiency the model takes for that GPU; matmul share = compute + recompute of the",
        "predicted step; implied = the efficiency that would make the row exact.",
        "",
        "| case | role | GPU | measured | predicted | error | efficiency | matmul share | implied | predicted MFU |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        implied = f"{r['implied_efficiency']:.3f}" if r["implied_efficiency"] else "—"
        lines.append(
            f"| {r['id']} | {r['role']} | {r['gpu']} | {r['measured']:,.0f} | {r['predicted']:,.0f} | {r['error_pct']:+.1f}% "
            f"| {r['efficiency']:.3f} | {r['matmul_share']:.0%} | {implied} | {r['mfu']:.0%} |"
        )
    lines += ["", "What the measured programs do differently:", ""]
    lines += [f"- {r['id']}: {r['note']}" for r in results if r["note"]]
    lines += [
        "",
        f"Median absolute error {summary['median_abs_error_pct']} %, worst {summary['worst_abs_error_pct']} % "
        f"over {summary['rows']} rows.",
        "",
        "Produced by `python bench/speed_accuracy.py`.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "cases", nargs="*", type=Path, help="JSONL rows (default: published_speed.jsonl + GPU results)"
    )
    p.add_argument("--markdown", type=Path, metavar="FILE", help="write the table as markdown")
    p.add_argument("--json", type=Path, metavar="FILE", help="write every result as JSON")
    a = p.parse_args()
    files = a.cases or [CASES] + ([GPU_MEASURED] if GPU_MEASURED.exists() else [])
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
