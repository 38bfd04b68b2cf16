"""Each pipeline stage's activation peak: measured in DeepSpeed's pipeline engine on CPU ranks
against the memory model (the cases of tests/test_pipeline_memory.py, which asserts 10 %).

    python bench/pipeline_memory.py      ~2 min on 2 cores; writes bench/results/pipeline_memory.{md,json}

Measured: the live bytes of the second optimizer step on each stage's first rank, parameter
gradients set apart (tests/memtrack.ActivationPeak). Modelled: the stage's activations, the
pipeline engine's buffers and the logits + loss working set at its peak
(launcher/memory/estimate.stage_activations). bench/accuracy.py shows these rows too.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.stage_memory_probe import measure_stages  # noqa: E402
from tests.test_pipeline_memory import CASES, LLAMA  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "pipeline_memory.json"


def table(rows: list[dict]) -> str:
    lines = [
        "| case | stage | micro-batches in flight | model MiB | measured MiB | error |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['stage']} | {r['in_flight']} | {r['model'] / 2**20:.3f} | "
            f"{r['measured'] / 2**20:.3f} | {100 * (r['model'] / r['measured'] - 1):+.1f} % |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    rows, t0 = [], time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for name, (spec, gpus) in CASES.items():
            print(f"{name} ...", file=sys.stderr, flush=True)
            for s, (model, measured) in enumerate(measure_stages(Path(tmp) / name, spec, gpus, LLAMA)):
                rows.append({"case": name, "stage": s, "in_flight": min(spec.pp - s, spec.grad_accum),
                             "model": model, "measured": measured})  # fmt: skip
    worst = max(abs(r["model"] / r["measured"] - 1) for r in rows)
    text = (
        "# Pipeline stages: activation peak, model vs measured (CPU ranks, tiny Llama, 4 blocks, seq 256)\n\n"
        + table(rows)
        + f"\nworst {100 * worst:.1f} % (target 10 %); {time.monotonic() - t0:.0f} s\n"
    )
    print(text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"rows": rows, "worst": worst}, indent=2) + "\n")
    RESULTS.with_suffix(".md").write_text(text)
    return 0 if worst < 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
