"""Host RAM a node spends while its ranks load the model, measured on 2 and 4 CPU ranks.

    python bench/host_loading.py      ~10 min on 2 cores; writes bench/results/host_loading.{md,json}

Each row runs tests/load_probe.py: real worker ranks that load a ~1 GB bf16 Llama checkpoint (or
build it from its config) exactly as the worker does (launcher/train/model.rank_model), while the
summed PSS of the ranks is sampled every few milliseconds (PSS splits a page shared by several
ranks between them, so the sum is what the node holds; page cache that no rank maps is not in it).
Baseline: each rank's PSS after its libraries are imported and the process group is up, before it
loads. "copies" = (peak - baselines) / one model copy: 1 means the node held the model once.
Under ZeRO-0/1/2 a CPU rank keeps the checkpoint's pages mapped and reads each weight once (what
the copy to its GPU does on a GPU node); under ZeRO-3 every rank holds 1/N of each parameter.
The issue's target: 4 ranks below 1.5 x (one model copy + 4 baselines).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.spec import TrainSpec  # noqa: E402
from tests.load_probe import measure_loading  # noqa: E402
from tests.runs import cpu_env, make_run  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "host_loading.json"
LLAMA = dict(
    model_type="llama", hidden_size=2048, intermediate_size=5504, num_hidden_layers=12,
    num_attention_heads=16, num_key_value_heads=8, vocab_size=32000, tie_word_embeddings=False,
)
CASES = [("ZeRO-1, checkpoint", 1, "pretrained"), ("ZeRO-3, checkpoint", 3, "pretrained"), ("ZeRO-3, random init", 3, "random")]
MIB = 2**20


def checkpoint(root: Path) -> tuple[Path, int]:
    import torch
    import transformers

    cfg = dict(LLAMA)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(str(root / "llama"), max_shard_size="300MB")
    return root / "llama", sum(p.numel() for p in model.parameters()) * 2


def table(rows: list[dict]) -> str:
    lines = [
        "| case | ranks | model MiB | baselines MiB | peak MiB | after loading MiB | copies at peak | peak / (model + baselines) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = r["baselines"]
        lines.append(
            f"| {r['case']} | {r['ranks']} | {r['model'] / MIB:.0f} | {base / MIB:.0f} | {r['peak'] / MIB:.0f} | "
            f"{r['after'] / MIB:.0f} | {(r['peak'] - base) / r['model']:.2f} | {r['peak'] / (r['model'] + base):.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ckpt, model_bytes = checkpoint(root)
        for case, stage, init in CASES:
            for ranks in (2, 4):
                name = f"z{stage}-{init}-{ranks}"
                spec = TrainSpec(zero_stage=stage, micro_batch=1, seq_len=64)
                run_dir, _ = make_run(root, name, spec, model=str(ckpt), gpus=f"1x{ranks}xA100", init=init)
                got = measure_loading(run_dir, root / f"{name}-probe", ranks, cpu_env())
                rows.append({
                    "case": case, "ranks": ranks, "model": model_bytes, "peak": got["peak_sum"],
                    "baselines": sum(r["baseline"] for r in got["ranks"]),
                    "after": sum(r["loaded"] for r in got["ranks"]), "seconds": round(got["seconds"], 1),
                })
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")
    RESULTS.with_suffix(".md").write_text(table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
