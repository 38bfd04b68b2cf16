"""`ftlaunch plan`: the fastest plan that fits, why, and what to change when nothing does.

Argument parsing and rendering only; the decisions are in launcher/planner/.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from dataclasses import replace

from launcher import options
from launcher.errors import FtlaunchError, InvalidSpecError
from launcher.memory.estimate import pipeline_stages
from launcher.planner.constants import DEFAULT_MARGIN, SPEED_UNCERTAINTY
from launcher.planner.plans import SEARCHED, NoPlanFitsError, Plan, Request

HELP = "search every way to split the job; the fastest plan that fits, explained"
EPILOG = """examples:
  ftlaunch plan --model bloom-176b --gpus 8xA100
  ftlaunch plan --model bloom-176b --gpus 8xA100 --method qlora --json
  ftlaunch plan --model llama-3.1-70b --gpus 2x8xH100 --zero-stage 3 --seq-len 8192 --ablate
  ftlaunch plan --model llama-3.1-8b --method lora --tokens 1B --price H100=2.5   (no --gpus: what to rent)

Any sharding or batch flag given (--zero-stage, --offload-*, --tp, --pp, --micro-batch,
--grad-accum, --grad-ckpt) pins that dimension of the search. Without --global-batch every plan
trains the same batch: ~262k tokens per optimizer step, rounded up to a multiple of the GPU count.
Feasible = the memory model's GPU total within the GPU's memory less --margin, host RAM and NVMe
within the node's. Speeds come from the performance model in launcher/planner/perf.py (its
assumptions in launcher/planner/constants.py): use them to compare plans, not as a promise."""

_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_TOKENS = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*", re.IGNORECASE)


def parse_tokens(text: str) -> float:
    """'1e9', '1B', '500M', '2.5T' -> a number of training tokens."""
    m = _TOKENS.fullmatch(text)
    value = float(m.group(1)) * _UNITS[m.group(2).lower()] if m else math.nan
    if not math.isfinite(value) or value < 1:
        raise argparse.ArgumentTypeError(f"expected a token count such as 1e9, 1B or 500M, got {text!r}")
    return value


def parse_price(text: str) -> tuple[str, float]:
    """'H100=2.5' -> ('H100-80GB', 2.5): GPU names resolve as in --gpus."""
    from launcher.gpus import resolve_gpu

    name, sep, value = text.partition("=")
    try:
        price = float(value)
    except ValueError:
        price = math.nan
    if not sep or not math.isfinite(price) or price <= 0:
        raise argparse.ArgumentTypeError(f"expected GPU=USD_PER_GPU_HOUR such as H100=2.5, got {text!r}")
    try:
        gpu, _ = resolve_gpu(name)
    except FtlaunchError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return gpu.name, price


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plan",
        help=HELP,
        description=HELP,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_model_and_cluster(p, gpus_required=False)
    options.add_training(p, search=True)
    g = p.add_argument_group("planning")
    g.add_argument(
        "--margin",
        type=options.non_negative_float,
        default=DEFAULT_MARGIN,
        metavar="F",
        help=f"fraction of GPU memory kept free (default {DEFAULT_MARGIN})",
    )
    g.add_argument("--top", type=options.positive_int, default=5, metavar="N", help="plans shown (default 5)")
    g.add_argument("--ablate", action="store_true", help="show memory and speed as techniques are added")
    g.add_argument("--tokens", type=parse_tokens, metavar="N", help="training tokens of the run (1e9, 1B)")
    g.add_argument(
        "--price",
        type=parse_price,
        action="append",
        default=[],
        metavar="GPU=USD",
        help="price per GPU-hour, e.g. H100=2.5 (repeatable; default: the catalog's)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def _base_and_pins(args: argparse.Namespace):
    """The user's non-searched choices as a TrainSpec, and the searched fields they pinned."""
    unpinned = argparse.Namespace(**{**vars(args), **dict.fromkeys(SEARCHED), "global_batch": None})
    base = options.train_spec(unpinned)
    pins = tuple((f, getattr(args, f)) for f in SEARCHED if getattr(args, f) is not None)
    return base, pins


def _hardware(args: argparse.Namespace) -> tuple[tuple[str, float | int], ...]:
    given = {
        "gpu_memory_gib": args.gpu_memory,
        "cpu_memory_gib": args.cpu_memory,
        "nvme_gib": args.nvme,
        "gpus_per_node": args.gpus_per_node,
        "inter_node_bandwidth_gbs": args.inter_node_bandwidth,
        "cpu_cores": args.cpu_cores,
    }
    return tuple(sorted((k, v) for k, v in given.items() if v is not None))


def run(args: argparse.Namespace) -> int:
    from launcher.models.catalog import resolve_model

    arch = resolve_model(args.model)
    base, pins = _base_and_pins(args)
    hardware = _hardware(args)
    prices = dict(args.price)
    if args.gpus is None:
        return _run_selection(args, arch, base, pins, hardware, prices)

    from launcher.planner import advise
    from launcher.planner.search import plan

    cluster = options.cluster_spec(args)
    request = Request(arch, cluster, base, pins, args.global_batch, args.margin, hardware)
    started = time.perf_counter()
    result = plan(request)
    elapsed = time.perf_counter() - started
    best = result.best
    scale_out = alternatives = None
    if best is None:
        result = replace(result, suggestions=advise.suggestions(result))
    elif best.spec.offload_optimizer != "none" or best.spec.offload_params != "none":
        scale_out = advise.scale_out(request)
        alternatives = advise.lighter_methods(request)
    ablation = None
    if args.ablate:
        from launcher.planner.ablate import ablate

        ablation = ablate(request)
    price = prices.get(cluster.gpu.name, cluster.gpu.price_per_hour_usd)
    cost = _cost(best, price, args.tokens) if best else None

    if args.json:
        from launcher.planner.explain import why

        out = result.to_dict()
        out["why"] = why(result.ranked)
        out["scale_out"] = scale_out.to_dict() if scale_out else None
        out["alternatives"] = [a.to_dict() for a in alternatives or ()]
        out["cost"] = cost
        if ablation is not None:
            out["ablation"] = [r.to_dict() for r in ablation]
        print(json.dumps(out, indent=2))
    else:
        _print_result(result, elapsed, args.top, scale_out, alternatives, cost, ablation)
    if best is None:
        raise NoPlanFitsError(
            f"no plan fits {arch.name} on {cluster.world_size} x {cluster.gpu.name}; "
            + ("the suggestions above are computed changes that fit" if result.suggestions else "see above")
        )
    return 0


def _cost(plan: Plan, price: float, tokens: float | None) -> dict:
    gpus = plan.cluster.world_size
    per_m = gpus * price / 3600 / plan.perf.tokens_per_s * 1e6
    out = {"price_per_gpu_hour_usd": price, "gpus": gpus, "cost_per_million_tokens_usd": round(per_m, 4)}
    if tokens is not None:
        hours = tokens / plan.perf.tokens_per_s / 3600
        out |= {
            "run_tokens": tokens,
            "run_hours": round(hours, 3),
            "run_cost_usd": round(hours * gpus * price, 2),
        }
    return out


def _run_selection(args, arch, base, pins, hardware, prices) -> int:
    if args.gpu_memory is not None:
        raise InvalidSpecError("--gpu-memory needs --gpus (it overrides one GPU type's memory)")
    if args.ablate:
        raise InvalidSpecError(
            "--ablate needs --gpus (it shows one cluster's memory, technique by technique)"
        )
    from launcher.planner.select import select

    sel = select(
        arch,
        base,
        pins=pins,
        global_batch=args.global_batch,
        margin=args.margin,
        hardware=hardware,
        prices=prices,
        run_tokens=args.tokens,
    )
    if args.json:
        print(
            json.dumps({"model": {"name": arch.name, "params": arch.total_params}, **sel.to_dict()}, indent=2)
        )
    else:
        _print_selection(arch, base, sel, args.tokens)
    if not sel.choices:
        raise NoPlanFitsError(f"no GPU type of the catalog fits {arch.name} with --method {base.method}")
    return 0


# --- human output -----------------------------------------------------------------------------------


def _offload(spec) -> str:
    """'-', 'opt:CPU', 'opt,params:NVMe', 'opt:NVMe,params:CPU'."""
    from launcher.planner.plans import DEVICE

    opt, params = spec.offload_optimizer, spec.offload_params
    if opt == params:
        return "-" if opt == "none" else f"opt,params:{DEVICE[opt]}"
    return ",".join(f"{w}:{DEVICE[d]}" for w, d in (("opt", opt), ("params", params)) if d != "none")


def _zero(spec) -> str:
    """The ZeRO stage as the tables show it, with ZeRO++ hpZ's group size: '3', '3 hpZ8'."""
    return f"{spec.zero_stage}" + (f" hpZ{spec.hpz}" if spec.hpz > 1 else "")


def _plans_table(plans, asked: int | None):
    """The ranked plans; a plan whose global batch is not the one asked for shows its own."""
    from launcher.render import ckpt_label, gib, secs, table

    cols = ("#", "ZeRO", "offload", "TPxPPxDP", "micro x accum", "ckpt", "GPU GiB", "host GiB", "NVMe GiB")
    rows = [
        (
            str(i),
            _zero(p.spec),
            _offload(p.spec),
            f"{p.spec.tp}x{p.spec.pp}x{p.dp}",
            f"{p.spec.micro_batch} x {p.spec.grad_accum}" + ("" if asked in (None, p.global_batch) else f" = {p.global_batch:,}"),
            ckpt_label(p.spec),
            gib(p.estimate.gpu_total),
            gib(p.estimate.host_per_node),
            gib(p.estimate.nvme_per_node) if p.estimate.nvme_per_node else "-",
            f"{p.perf.tokens_per_s:,.0f}",
            secs(p.perf.step_time_s),
            f"{p.perf.mfu:.0%}",
        )
        for i, p in enumerate(plans, 1)
    ]
    return table((*cols, f"tokens/s ±{SPEED_UNCERTAINTY:.0%}", "step s", "MFU"), rows, left=("offload", "ckpt"))


def _print_chosen(out, plan: Plan, cost: dict, asked: int | None) -> None:
    from launcher.render import bar, breakdown_table, gib, secs, spec_line, stages_table, table

    e, node, perf = plan.estimate, plan.cluster.node, plan.perf
    out.print(f"[bold]chosen:[/] {spec_line(plan.spec, plan.dp)}")
    for note in (*filter(None, [plan.batch_note(asked)]), *e.notes):
        out.print(f"[yellow]note:[/] {note}")
    out.print()
    out.print(breakdown_table(e.components, plan.budget, title=f"per GPU, peak at {e.peak_phase}"))
    out.print(
        f"GPU total {gib(e.gpu_total)} GiB of a {gib(plan.budget)} GiB budget | host RAM "
        f"{gib(e.host_per_node)} of {node.cpu_memory_gib:,.0f} GiB per node"
        + (f" | NVMe {gib(e.nvme_per_node)} of {node.nvme_gib:,.0f} GiB per node" if e.nvme_per_node else "")
    )
    stages = pipeline_stages(plan.arch, plan.spec, plan.cluster)
    if stages:
        out.print()
        out.print(stages_table(stages))
    out.print()
    step = perf.step_time_s
    rows = [
        (name.replace("_", " "), secs(v), f"{v / step:.0%}", f"[cyan]{bar(v, step)}[/]")
        for name, v in perf.breakdown.items()
        if v > 0
    ]
    out.print(table(("term", "s", "share", ""), rows, title="time per optimizer step", left=("term", "")))
    line = (
        f"est. {perf.tokens_per_s:,.0f} tokens/s ± {SPEED_UNCERTAINTY:.0%} ({plan.tokens_per_step:,} tokens per step), "
        f"MFU {perf.mfu:.0%}; ${cost['cost_per_million_tokens_usd']:,.2f} per million tokens at "
        f"${cost['price_per_gpu_hour_usd']:g} per GPU-hour"
    )
    if "run_cost_usd" in cost:
        line += f"; the run ({cost['run_tokens']:,.0f} tokens): {cost['run_hours']:,.1f} h, ${cost['run_cost_usd']:,.0f}"
    out.print(line)


def _print_result(result, elapsed, top, scale_out, alternatives, cost, ablation) -> None:
    from launcher.planner.explain import why
    from launcher.render import bullets, console, gib, model_line

    out = console()
    req = result.request
    c, b, node = req.cluster, req.base, req.cluster.node
    out.print(f"[bold]{model_line(req.arch)}[/]")
    out.print(f"on {c.describe()}")
    for note in (*c.notes, *result.notes):
        out.print(f"[yellow]note:[/] {note}")
    gb = result.global_batch
    if gb:
        default = " (default)" if req.global_batch is None else ""
        batch = f"global batch {gb:,} sequences ({gb * b.seq_len:,} tokens) per optimizer step{default}"
    else:
        batch = f"accumulation pinned to {req.pinned['grad_accum']}"
    out.print(f"{b.method} | {b.precision} | {b.optimizer} | seq {b.seq_len} | {batch}")
    if req.pins:
        out.print("pinned: " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in req.pins))
    out.print(
        f"searched {result.candidates:,} candidate plans in {elapsed * 1000:.0f} ms ({result.evaluated:,} memory "
        f"estimates, {result.pruned:,} candidates pruned as provably over budget or slower)"
    )
    out.print(
        f"{len(result.ranked):,} fit in {gib(req.budget)} GiB per GPU ({c.gpu_memory_gib:g} GiB less the "
        f"{req.margin * 100:g}% margin), {node.cpu_memory_gib:,.0f} GiB host RAM and {node.nvme_gib:,.0f} GiB NVMe per node"
    )
    out.print()
    if result.ranked:
        out.print(_plans_table(result.ranked[:top], result.global_batch))
        out.print()
        _print_chosen(out, result.best, cost, result.global_batch)
        bullets(out, "why this plan", why(result.ranked))
    else:
        out.print("[bold red]nothing fits[/]")
    rejected = (r.reason for r in result.rejected)
    bullets(out, "rejected (the binding constraint of each family's closest member)", rejected)
    suggested = (s.text for s in result.suggestions)
    bullets(out, "what would fit (computed changes, each verified by planning with it)", suggested)
    if scale_out is not None:
        bullets(out, "more GPUs: the smallest cluster of this type without offload", [scale_out.text])
    bullets(out, "lighter methods on these GPUs", (a.text for a in alternatives or ()))
    if ablation:
        _print_ablation(out, ablation)


def _print_ablation(out, rows) -> None:
    from launcher.render import gib, table

    cols = ("technique", "GPU GiB", "host GiB/node", "NVMe GiB/node", "fits", "tokens/s")
    body = [
        (
            r.label,
            gib(r.estimate.gpu_total),
            gib(r.estimate.host_per_node),
            gib(r.estimate.nvme_per_node) if r.estimate.nvme_per_node else "-",
            "[green]yes[/]" if r.fits else "[red]no[/]",
            f"{r.perf.tokens_per_s:,.0f}",
        )
        for r in rows
    ]
    out.print()
    out.print(
        table(
            cols,
            body,
            title="what each technique buys (cumulative, TP = PP = 1, micro-batch 1)",
            left=cols[:1],
        )
    )


def _print_selection(arch, base, sel, tokens) -> None:
    from launcher.render import bullets, ckpt_label, console, gib, model_line, table

    out = console()
    out.print(f"[bold]{model_line(arch)}[/]")
    out.print(
        f"{base.method} | {base.precision} | {base.optimizer} | seq {base.seq_len}: what to rent, cheapest per token first"
    )
    plan_col = "ZeRO offload | TPxPPxDP | micro x accum | ckpt"
    cols = ["--gpus", plan_col, "GPU GiB", "tokens/s", "$/GPU-h", "$/M tokens"]
    cols += ["run h", "run $"] if tokens is not None else []
    rows = []
    for ch in sel.choices:
        p, s = ch.plan, ch.plan.spec
        sharding = f"ZeRO-{_zero(s)} {_offload(s)}".replace(" -", "")
        row = [
            ch.shape + ("" if ch.smallest else " (cheaper)"),
            f"{sharding} | {s.tp}x{s.pp}x{p.dp} | {s.micro_batch} x {s.grad_accum} | {ckpt_label(s)}",
            gib(p.estimate.gpu_total),
            f"{p.perf.tokens_per_s:,.0f}",
            f"{ch.price_per_gpu_hour:.2f}",
            f"{ch.cost_per_million_tokens:,.2f}",
        ]
        rows.append(row + ([f"{ch.run_hours:,.1f}", f"{ch.run_cost:,.0f}"] if tokens is not None else []))
    out.print(table(cols, rows, left=("--gpus", plan_col)))
    bullets(out, "no plan", (f"{g}: {why}" for g, why in sel.unfit))
