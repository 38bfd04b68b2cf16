"""Published fine-tuning recipes vs ftlaunch's verdict: does `ftlaunch estimate` say FITS where the
recipe ran, and DOES NOT FIT where it ran out of memory?

    python bench/recipes.py                  table on stdout, and bench/results/recipes.md
    python bench/recipes.py --json           the results as JSON on stdout instead

Rows: bench/data/published_recipes.jsonl, one published run each (torchtune, axolotl, LitGPT,
PEFT / QLoRA, DeepSpeed): id, source {ref, quote} (the sentence or table cells, verbatim),
published "fits" | "oom", trust "A" (every setting stated) | "B" (some read or assumed, see
"note"), args = `ftlaunch estimate` flags (model, gpus, cpu_memory and the TrainSpec fields), and
optionally model_config (a config.json, for models outside the catalog), skip (why the row cannot
be expressed) and known_disagreement (what ftlaunch counts differently, for a row whose verdict
disagrees). The verdict is the one `ftlaunch estimate` prints: FITS when the GPU total (peak
reserved + CUDA context and NCCL) is within the GPU's memory. A disagreeing row without a
known_disagreement fails tests/test_recipes_bench.py until someone has looked at it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.errors import FtlaunchError  # noqa: E402
from launcher.hardware import parse_gpus  # noqa: E402
from launcher.memory import constants as C  # noqa: E402
from launcher.memory.estimate import estimate  # noqa: E402
from launcher.models.catalog import resolve_model  # noqa: E402
from launcher.models.hf_config import arch_from_hf_config  # noqa: E402
from launcher.spec import TrainSpec  # noqa: E402

DATA = ROOT / "bench" / "data" / "published_recipes.jsonl"
MARKDOWN = ROOT / "bench" / "results" / "recipes.md"
# `ftlaunch estimate` flags that shape the cluster, not the TrainSpec
CLUSTER_ARGS = {
    "cpu_memory": "cpu_memory_gib",
    "gpu_memory": "gpu_memory_gib",
    "nvme": "nvme_gib",
    "gpus_per_node": "gpus_per_node",
}
PUBLISHED = ("fits", "oom")


def load_rows(path: Path = DATA) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def configuration(row: dict):
    """(arch, spec, cluster) from a row's flags; model_config stands in for a config.json path."""
    args = dict(row["args"])
    model = args.pop("model")
    arch = arch_from_hf_config(row["model_config"], model) if "model_config" in row else resolve_model(model)
    overrides = {CLUSTER_ARGS[k]: args.pop(k) for k in list(args) if k in CLUSTER_ARGS}
    cluster = parse_gpus(args.pop("gpus"), **overrides)
    return arch, TrainSpec(**args), cluster


def evaluate(row: dict) -> dict:
    """One row's verdict: fits (ours), agree, the GPU figure and, for a disagreement, its reason."""
    out = {
        "id": row["id"],
        "framework": row.get("framework", "?"),
        "trust": row.get("trust", "?"),
        "published": row["published"],
        "ref": row["source"]["ref"],
        "quote": row["source"]["quote"],
    }
    if row.get("skip"):
        return {**out, "status": "skip", "skip": row["skip"]}
    try:
        arch, spec, cluster = configuration(row)
        est = estimate(arch, spec, cluster)
    except (FtlaunchError, TypeError, KeyError, ValueError) as exc:
        return {**out, "status": "error", "error": f"{type(exc).__name__}: {exc}"}
    agree = est.fits == (row["published"] == "fits")
    out.update(
        status="agree" if agree else "disagree",
        fits=est.fits,
        gpu_total_gib=round(est.gpu_total / C.GIB, 2),
        gpu_memory_gib=round(est.gpu_memory / C.GIB, 2),
        peak_allocated_gib=round(est.peak_allocated / C.GIB, 2),
        peak_phase=est.peak_phase,
        components_gib={k: round(v / C.GIB, 2) for k, v in est.components.items() if v},
        host_gib=round(est.host_per_node / C.GIB, 1),
        host_fits=est.host_per_node <= cluster.node.cpu_memory_gib * C.GIB,
    )
    if not agree:
        out["reason"] = row.get("known_disagreement") or "NO REASON RECORDED: investigate this row"
    elif row.get("known_disagreement"):
        out["stale_reason"] = row["known_disagreement"]  # it agrees now: the data file's reason is stale
    return out


def run(path: Path = DATA) -> list[dict]:
    return [evaluate(r) for r in load_rows(path)]


def short_ref(ref: str) -> str:
    """'owner/repo path' of a row's reference, without its commit, date or quoted context."""
    for stop in (" @", ";", " (", " and "):
        ref = ref.split(stop)[0]
    return ref


def predicted(r: dict) -> str:
    if r["status"] == "skip":
        return "skipped: " + r["skip"]
    if r["status"] == "error":
        return "error: " + r["error"]
    verdict = "FITS" if r["fits"] else "DOES NOT FIT"
    host = "" if r["host_fits"] else f" (host RAM {r['host_gib']:g} GiB: over)"
    return f"{r['gpu_total_gib']:.1f} of {r['gpu_memory_gib']:.1f} GiB: {verdict}{host}"


def markdown(results: list[dict]) -> str:
    counts = {s: sum(r["status"] == s for r in results) for s in ("agree", "disagree", "skip", "error")}
    lines = [
        "Published fine-tuning recipes (bench/data/published_recipes.jsonl) against `ftlaunch estimate`'s",
        "verdict: GPU total (peak reserved + CUDA context / NCCL) within the GPU's memory = FITS.",
        "",
        "| recipe | source | trust | published | ftlaunch: GPU total of GPU memory | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['id']} | {short_ref(r['ref'])} | {r['trust']} | {r['published']} | {predicted(r)} | {r['status']} |"
        )
    lines += [
        "",
        f"{counts['agree']} agree, {counts['disagree']} disagree, {counts['skip']} skipped, {counts['error']} errors "
        f"of {len(results)} rows.",
    ]
    bad = [r for r in results if r["status"] in ("disagree", "error")]
    if bad:
        lines += ["", "Disagreements, and what ftlaunch counts differently:", ""]
        lines += [f"- {r['id']}: {r.get('reason') or r.get('error')}" for r in bad]
    stale = [r for r in results if r.get("stale_reason")]
    if stale:
        lines += ["", "Rows that agree but still carry a known_disagreement (remove it):", ""]
        lines += [f"- {r['id']}" for r in stale]
    lines += [
        "",
        "Sources, quoted verbatim ('...' marks text left out; whitespace, table padding and shell line",
        "continuations collapsed). Each row's settings and what was read or assumed: its `note` in the data.",
        "",
    ]
    lines += [f"- {r['id']}: {r['ref']}: \"{r['quote']}\"" for r in results]
    lines += ["", "Produced by `python bench/recipes.py`."]
    return "\n".join(lines) + "\n"


def unexplained(results: list[dict]) -> list[dict]:
    """Rows nobody has looked at yet: errors, disagreements without a reason, stale reasons."""
    return [
        r
        for r in results
        if r["status"] == "error" or r.get("stale_reason") or (r["status"] == "disagree" and r["reason"].startswith("NO REASON"))
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", nargs="?", type=Path, default=DATA, help="JSONL rows (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    p.add_argument("--markdown", type=Path, default=MARKDOWN, metavar="FILE", help="write the table here")
    a = p.parse_args()
    results = run(a.data)
    text = markdown(results)
    a.markdown.parent.mkdir(parents=True, exist_ok=True)
    a.markdown.write_text(text)
    print(json.dumps({"results": results}, indent=2) if a.json else text)
    return 1 if unexplained(results) else 0


if __name__ == "__main__":
    sys.exit(main())
