"""bench/gpu_memory.py's outputs: the rows as JSONL and markdown, and in the shapes the accuracy
benches read (shared/data/published_memory.jsonl's for bench/accuracy.py, bench/data/
published_speed.jsonl's for bench/speed_accuracy.py). No torch here."""

from __future__ import annotations

import json
from pathlib import Path

STATUS_OK = "ok"


def published(rows: list[dict], meta: dict) -> list[dict]:
    """Measured rows in the shape of shared/data/published_memory.jsonl: metric allocated and reserved."""
    out = []
    for r in rows:
        for metric, key in (("allocated", "peak_allocated_gib"), ("reserved", "peak_reserved_gib")):
            if r["status"] != STATUS_OK or r.get(key) is None:
                continue
            out.append(
                {
                    "id": f"gpu-memory-{r['name']}-{metric}",
                    "trust": "A",
                    "metric": metric,
                    "measured": {"value": r[key], "unit": "GiB"},
                    "args": r["args"],
                    "source": (
                        f"bench/gpu_memory.py on {meta['device']}, {meta['date']} (torch {meta['torch']}, "
                        f"deepspeed {meta['deepspeed']}, {meta['optimizer_impl']}; the worker run for "
                        f"{meta['steps']} steps on random weights, one process, ZeRO-0, torch.cuda max {metric})"
                    ),
                }
            )
    return out


def speed_rows(rows: list[dict], meta: dict) -> list[dict]:
    """Measured tokens/s in the shape of bench/data/published_speed.jsonl (bench/speed_accuracy.py)."""
    return [
        {
            "id": f"gpu-speed-{r['name']}",
            "role": "measures ftlaunch's own worker",
            "measured": {"tokens_per_s_per_gpu": r["tokens_per_s"]},
            "args": r["args"],
            "source": (
                f"bench/gpu_memory.py on {meta['device']}, {meta['date']} (torch {meta['torch']}, "
                f"deepspeed {meta['deepspeed']}); tokens/s of step {meta['steps']}"
            ),
            "note": "ftlaunch's worker, one process, ZeRO-0, random weights; one step after warm-up",
        }
        for r in rows
        if r["status"] == STATUS_OK and r.get("tokens_per_s") and r.get("error_speed_pct") is not None
    ]


def markdown(rows: list[dict], meta: dict) -> str:
    def f(x, fmt=None):
        return "" if x is None else (fmt or ("{:.2f}" if abs(x) >= 1 else "{:.3f}")).format(x)

    lines = [
        f"Measured on {meta['device']} ({meta['date']}; torch {meta['torch']}, deepspeed {meta['deepspeed']}, "
        f"transformers {meta['transformers']}), {meta['steps']} steps, ZeRO-0, one process, "
        f"estimate for `--gpus {meta['gpus']}`. GiB; error = (estimate - measured) / measured.",
        "",
        "| model | method | ckpt | seq | mb | est alloc | alloc | err | est reserved | reserved | err "
        "| est tok/s | tok/s | err | host RSS | status |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['method']}{' compiled' if r.get('compile') else ''} | {r['grad_ckpt']} | {r['seq_len']} | {r['micro_batch']} "
            f"| {f(r['est_peak_allocated_gib'])} | {f(r.get('peak_allocated_gib'))} "
            f"| {f(r.get('error_allocated_pct'), '{:+.1f}%')} | {f(r['est_peak_reserved_gib'])} "
            f"| {f(r.get('peak_reserved_gib'))} | {f(r.get('error_reserved_pct'), '{:+.1f}%')} "
            f"| {f(r.get('est_tokens_per_s'), '{:,.0f}')} | {f(r.get('tokens_per_s'), '{:,.0f}')} "
            f"| {f(r.get('error_speed_pct'), '{:+.1f}%')} "
            f"| {f(r.get('host_rss_gib'))} | {r['status'] or 'pending'} |"
        )
    return "\n".join(lines) + "\n"


def write_outputs(rows: list[dict], meta: dict, out: Path, md: Path, pub: Path) -> None:
    speed = pub.parent / pub.name.replace("gpu_measured", "gpu_speed")
    for p in (out, md, pub):
        p.parent.mkdir(parents=True, exist_ok=True)
    if speed != pub:
        speed.write_text("".join(json.dumps(r) + "\n" for r in speed_rows(rows, meta)))
    keys = ("device", "torch", "date", "gpus")
    out.write_text("".join(json.dumps({**r, **{k: meta[k] for k in keys}}) + "\n" for r in rows))
    md.write_text(markdown(rows, meta))
    pub.write_text("".join(json.dumps(r) + "\n" for r in published(rows, meta)))
