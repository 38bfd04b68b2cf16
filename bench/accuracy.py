"""Memory estimators side by side: measured vs ftlaunch (analytic and trace) vs DeepSpeed,
accelerate and llm-analysis, with each one's signed error per case and its median / worst.

    python bench/accuracy.py                       every case, traces included (~5 min on 2 cores)
    python bench/accuracy.py --no-trace            analytic and the other tools only (seconds)
    python bench/accuracy.py --markdown bench/results/accuracy.md --json bench/results/accuracy.json

Cases are JSONL rows in the format of shared/data/published_memory.jsonl (id, trust, metric,
measured {value, unit}, args = `ftlaunch estimate` flags, source):
  bench/data/published_memory.jsonl   published measurements (a copy of the shared data set)
  bench/data/traced_cases.jsonl       configurations of small and mid-size models with no
                                      `measured`: their measurement is our trace (trust "trace")
  bench/results/gpu_measured.jsonl    what bench/gpu_memory.py measured on a GPU, when present

What each column compares, per GPU, in the row's metric (allocated = torch max allocated,
reserved = max reserved, nvidia-smi = reserved + CUDA context and NCCL):
  analytic      `ftlaunch estimate`: launcher/memory/ (what the planner searches with)
  trace         `ftlaunch estimate --trace`: one step under FakeTensorMode; its allocated figure,
                plus the analytic allocator margin / context for reserved / nvidia-smi rows
  deepspeed     estimate_zero2/3_model_states_mem_needs: model states only
  accelerate    `accelerate estimate-memory`'s "Training using Adam"
  llm-analysis  llm-analysis's weight+optimizer+grad+activation memory per GPU
Targets (issue 8) are checked and printed at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import other_estimators as others  # noqa: E402
from launcher.errors import FtlaunchError  # noqa: E402
from launcher.hardware import parse_gpus  # noqa: E402
from launcher.memory import constants as C  # noqa: E402
from launcher.memory.estimate import device_figures, estimate  # noqa: E402
from launcher.models.catalog import resolve_model  # noqa: E402
from launcher.spec import TrainSpec  # noqa: E402

DATA = ROOT / "bench" / "data"
DEFAULT_CASES = [DATA / "published_memory.jsonl", DATA / "traced_cases.jsonl"]
GPU_MEASURED = ROOT / "bench" / "results" / "gpu_measured.jsonl"
ESTIMATORS = ("analytic", "trace", "deepspeed", "accelerate", "llm-analysis")
CLUSTER_KEYS = ("model", "gpus")
TARGET_TRACE = 5.0
TARGET_MEDIAN_A = 8.0
TARGET_WORST_A = 15.0


def load_cases(files: list[Path]) -> list[dict]:
    rows = []
    for f in files:
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return rows


def measured_gib(row: dict) -> float | None:
    m = row.get("measured")
    if not m or "value" not in m:
        return None
    return m["value"] * (1e9 / 2**30 if m.get("unit", "GiB") == "GB" else 1.0)


def configuration(args: dict):
    """(arch, spec, cluster) from a row's `ftlaunch estimate` flags."""
    arch = resolve_model(args["model"])
    cluster = parse_gpus(args["gpus"])
    fields = {k: v for k, v in args.items() if k not in CLUSTER_KEYS}
    if "lora_targets" in fields and not isinstance(fields["lora_targets"], str):
        fields["lora_targets"] = ",".join(fields["lora_targets"])
    return arch, TrainSpec(**fields), cluster


def in_metric(allocated: float, metric: str, world: int) -> float:
    """An allocated figure (bytes) in the row's metric (GiB)."""
    reserved, total = device_figures(allocated, world)
    return {"allocated": allocated, "reserved": reserved, "nvidia-smi": total}[metric] / C.GIB


def evaluate(row: dict, run_trace: bool) -> dict:
    out = {"id": row["id"], "trust": row.get("trust", "?"), "metric": row.get("metric", "allocated")}
    try:
        arch, spec, cluster = configuration(row["args"])
        est = estimate(arch, spec, cluster)
    except (FtlaunchError, TypeError, KeyError) as exc:
        return {**out, "error": str(exc)}
    metric, world = out["metric"], cluster.world_size
    gib = {"analytic": in_metric(est.peak_allocated, metric, world)}
    notes = {}
    out["fits"] = est.fits
    oom = bool(row.get("measured", {}).get("oom"))
    if run_trace and not oom:  # an OOM row has no figure to trace against
        from launcher.trace import TraceError, trace, untraceable

        why = untraceable(arch, spec)
        if why:
            notes["trace"] = why
        else:
            try:
                t = trace(arch, spec, est.dp, quiet=True)
                gib["trace"] = in_metric(t.peak_allocated, metric, world)
                out["trace_seconds"] = t.seconds
                out["analytic_vs_trace_pct"] = pct(est.peak_allocated, t.peak_allocated)
            except TraceError as exc:
                notes["trace"] = str(exc)
    for name, fn in (
        ("deepspeed", others.deepspeed),
        ("accelerate", others.accelerate),
        ("llm-analysis", others.llm_analysis),
    ):
        o = fn(arch, spec, cluster)
        if o.gib is not None:
            gib[name] = o.gib
        notes[name] = o.note
    measured = measured_gib(row)
    if measured is None and "trace" in gib:
        measured = gib["trace"]  # a traced case: the trace is the measurement
        out["measured_by"] = "trace"
    out["measured_gib"] = None if measured is None else round(measured, 3)
    out["gib"] = {k: round(v, 3) for k, v in gib.items()}
    if measured is not None:
        out["error_pct"] = {
            k: pct(v, measured)
            for k, v in gib.items()
            if not (k == "trace" and out.get("measured_by") == "trace")
        }
    out["notes"] = notes
    if oom:  # which estimators say it does not fit: ours by its budget, the others above the GPU
        out["oom"] = True
        capacity = cluster.gpu.memory_gib
        out["predicts_oom"] = {k: (not est.fits if k == "analytic" else v > capacity) for k, v in gib.items()}
    if row.get("note"):
        out["note"] = row["note"]
    return out


def pct(predicted: float, reference: float) -> float:
    return round(100 * (predicted - reference) / reference, 2)


def summarise(results: list[dict]) -> dict:
    summary = {}
    for group, keep in (
        ("published trust A", lambda r: r["trust"] == "A"),
        ("published trust B", lambda r: r["trust"] == "B"),
        ("traced", lambda r: r["trust"] == "trace"),
        ("all", lambda r: True),
    ):
        rows = [r for r in results if keep(r) and "error_pct" in r]
        per = {}
        for name in ESTIMATORS:
            errs = [abs(r["error_pct"][name]) for r in rows if name in r["error_pct"]]
            if errs:
                per[name] = {
                    "rows": len(errs),
                    "median": round(statistics.median(errs), 1),
                    "worst": round(max(errs), 1),
                }
        summary[group] = per
    return summary


def targets(results: list[dict], summary: dict) -> list[tuple[str, bool, str]]:
    """(target, met, evidence) for each of issue 8's targets."""
    out = []
    traced = [r for r in results if "analytic_vs_trace_pct" in r]
    worst = max((abs(r["analytic_vs_trace_pct"]) for r in traced), default=None)
    out.append(
        (
            f"analytic vs trace within {TARGET_TRACE:g} % on every traced case",
            worst is not None and worst <= TARGET_TRACE,
            f"{len(traced)} traced cases, worst {worst} %" if traced else "no case traced (--no-trace)",
        )
    )
    a = summary.get("published trust A", {}).get("analytic")
    out.append(
        (
            f"published trust A: median abs error <= {TARGET_MEDIAN_A:g} %, worst <= {TARGET_WORST_A:g} %",
            bool(a) and a["median"] <= TARGET_MEDIAN_A and a["worst"] <= TARGET_WORST_A,
            f"median {a['median']} %, worst {a['worst']} % over {a['rows']} rows" if a else "no trust-A rows",
        )
    )
    ooms = [r for r in results if r.get("oom")]
    out.append(
        (
            "every published OOM predicted as not fitting",
            all(not r.get("fits", True) for r in ooms),
            f"{sum(not r.get('fits', True) for r in ooms)} of {len(ooms)} OOM rows"
            if ooms
            else "no OOM rows in the data",
        )
    )
    worse = []
    for r in results:
        errs = r.get("error_pct", {})
        if "analytic" not in errs:
            continue
        for name in ("deepspeed", "accelerate", "llm-analysis"):
            if name in errs and abs(errs[name]) <= abs(errs["analytic"]):
                worse.append(f"{r['id']} ({name})")
    out.append(
        (
            "analytic closer than DeepSpeed, accelerate and llm-analysis in every case",
            not worse,
            ", ".join(worse) + " (see the notes above)" if worse else "all cases",
        )
    )
    return out


def cell(r: dict, name: str) -> str:
    if name not in r.get("gib", {}):
        return "—"
    v = r["gib"][name]
    if r.get("oom"):
        return f"{v:.1f} ({'OOM' if r['predicts_oom'][name] else 'fits: wrong'})"
    e = r.get("error_pct", {}).get(name)
    return f"{v:.1f}" if e is None else f"{v:.1f} ({e:+.1f}%)"


def markdown(results: list[dict], summary: dict, checks: list, seconds: float) -> str:
    lines = [
        "GiB per GPU in each row's metric; (signed error vs measured). Measured = published figure, or",
        "for trust `trace` rows our own trace of the step (so their trace column is the measurement).",
        "OOM rows: a published run that ran out of memory; each estimator's figure and its verdict",
        "(ftlaunch: its fit check; the others: above the GPU's memory or not).",
        "",
        "| case | trust | metric | measured | ftlaunch analytic | ftlaunch trace | DeepSpeed | accelerate | llm-analysis |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['id']} | {r['trust']} | {r['metric']} | estimate failed: {r['error']} ||||||")
            continue
        m = "OOM" if r.get("oom") else "—" if r.get("measured_gib") is None else f"{r['measured_gib']:.1f}"
        lines.append(
            f"| {r['id']} | {r['trust']} | {r['metric']} | {m} | "
            + " | ".join(
                cell(r, n) if not (n == "trace" and r.get("measured_by") == "trace") else "(= measured)"
                for n in ESTIMATORS
            )
            + " |"
        )
    notes = [f"- {r['id']}: {r['note']}" for r in results if r.get("note")]
    if notes:
        lines += ["", "What the measured program does differently (the case files' notes):", "", *notes]
    lines += [
        "",
        "| rows | estimator | cases | median abs error | worst abs error |",
        "|---|---|---:|---:|---:|",
    ]
    for group, per in summary.items():
        for name, s in per.items():
            lines.append(f"| {group} | {name} | {s['rows']} | {s['median']} % | {s['worst']} % |")
    lines += ["", "| target | met | evidence |", "|---|---|---|"]
    lines += [f"| {t} | {'yes' if ok else '**no**'} | {ev} |" for t, ok, ev in checks]
    lines += ["", f"Produced by `python bench/accuracy.py` in {seconds:.0f} s."]
    return "\n".join(lines) + "\n"


def pipeline_rows() -> str:
    """Per-stage activation peaks of pipeline plans, measured on CPU ranks (bench/pipeline_memory.py
    writes them; re-run it to refresh), as a section of their own: they compare one term of a
    stage, not a whole GPU's figure."""
    path = ROOT / "bench" / "results" / "pipeline_memory.json"
    if not path.exists():
        return "\n(no pipeline stage rows: run bench/pipeline_memory.py)\n"
    from bench.pipeline_memory import table

    got = json.loads(path.read_text())
    return (
        "\n## Pipeline stages: activation peak per stage, measured on CPU ranks (bench/pipeline_memory.py)\n\n"
        + table(got["rows"])
        + f"\nworst {100 * got['worst']:.1f} % (target 10 %)\n"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "cases", nargs="*", type=Path, help="JSONL case files (default: bench/data/*.jsonl + GPU results)"
    )
    p.add_argument("--no-trace", action="store_true", help="skip the traces (seconds instead of minutes)")
    p.add_argument("--only", metavar="TEXT", help="only cases whose id contains TEXT")
    p.add_argument("--markdown", type=Path, metavar="FILE", help="write the tables as markdown")
    p.add_argument("--json", type=Path, metavar="FILE", help="write every result as JSON")
    a = p.parse_args()
    files = a.cases or DEFAULT_CASES + ([GPU_MEASURED] if GPU_MEASURED.exists() else [])
    rows = [r for r in load_cases(files) if not a.only or a.only in r["id"]]
    t0 = time.monotonic()
    results = []
    for i, row in enumerate(rows, 1):
        print(f"[{i}/{len(rows)}] {row['id']}", file=sys.stderr, flush=True)
        results.append(evaluate(row, run_trace=not a.no_trace))
    summary = summarise(results)
    checks = targets(results, summary)
    text = markdown(results, summary, checks, time.monotonic() - t0) + pipeline_rows()
    print(text)
    if a.markdown:
        a.markdown.parent.mkdir(parents=True, exist_ok=True)
        a.markdown.write_text(text)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(
            json.dumps({"results": results, "summary": summary, "targets": checks}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
