"""`ftlaunch models` and `ftlaunch gpus`: what the catalogs hold."""

from __future__ import annotations

import argparse
import json


def add_parsers(sub) -> None:
    p = sub.add_parser("models", help="list the model catalog", description="List the model catalog.")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(run=run_models)
    p = sub.add_parser(
        "gpus", help="list the GPU catalog", description="List the GPU catalog and node defaults."
    )
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(run=run_gpus)


def run_models(args: argparse.Namespace) -> int:
    from launcher.models.catalog import list_models, resolve_model

    rows = []
    for name in list_models():
        a = resolve_model(name)
        rows.append(
            {
                "name": name,
                "model_type": a.model_type,
                "params": a.total_params,
                "layers": a.layers,
                "hidden": a.hidden,
                "heads": a.heads,
                "kv_heads": a.kv_heads,
                "ffn": a.ffn,
                "vocab": a.vocab,
                "experts": a.experts,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.table import Table

    from launcher.render import console

    t = Table(show_edge=False)
    for col in ("name", "type", "params", "layers", "hidden", "heads/kv", "ffn", "vocab"):
        t.add_column(col, justify="left" if col in ("name", "type") else "right")
    for r in rows:
        t.add_row(
            r["name"],
            r["model_type"],
            f"{r['params'] / 1e9:,.2f}B" + (f" ({r['experts']} experts)" if r["experts"] > 1 else ""),
            str(r["layers"]),
            str(r["hidden"]),
            f"{r['heads']}/{r['kv_heads']}",
            str(r["ffn"]),
            f"{r['vocab']:,}",
        )
    console().print(t)
    return 0


def run_gpus(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from launcher.gpus import list_gpus
    from launcher.hardware import default_node

    rows = [
        {**asdict(g), "default_node": asdict(default_node(g, g.default_gpus_per_node))} for g in list_gpus()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.table import Table

    from launcher.render import console

    t = Table(show_edge=False)
    for col in (
        "gpu",
        "GiB",
        "bf16",
        "fp8",
        "TFLOPS bf16",
        "HBM GB/s",
        "link",
        "$/h",
        "node: GPUs, RAM GiB, NVMe GiB",
    ):
        t.add_column(col)
    for r in rows:
        n = r["default_node"]
        t.add_row(
            r["name"],
            f"{r['memory_gib']:.1f}",
            "yes" if r["bf16"] else "no",
            "yes" if r["fp8"] else "no",
            f"{r['peak_bf16_tflops']:g}",
            f"{r['hbm_bandwidth_gbs']:g}",
            f"{r['intra_node_link']} {r['intra_node_bandwidth_gbs']:g}",
            f"{r['price_per_hour_usd']:.2f}",
            f"{n['gpus_per_node']}, {n['cpu_memory_gib']:,.0f}, {n['nvme_gib']:,.0f}",
        )
    console().print(t)
    return 0
