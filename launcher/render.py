"""Human output: tables and terminal bar charts. Rendering only, no decisions."""

from __future__ import annotations

from launcher.memory.constants import GIB

BAR_WIDTH = 36
LABELS = {
    "weights": "weights",
    "gradients": "gradients",
    "master_weights": "fp32 master weights",
    "optimizer_states": "optimizer states",
    "activations": "activations",
    "logits_loss": "logits + loss",
    "zero_buffers": "ZeRO buffers / gathered params",
    "allocator_margin": "allocator margin (reserved)",
    "cuda_context_nccl": "CUDA context + NCCL",
}


def console():
    import sys

    from rich.console import Console

    # piped output (logs, CI) gets a fixed width instead of rich's 80-column default
    width = None if sys.stdout.isatty() else 132
    return Console(highlight=False, soft_wrap=False, width=width)


def gib(x: float) -> str:
    v = x / GIB
    return f"{v:,.1f}" if v >= 10 else f"{v:,.2f}"


def bar(value: float, scale: float) -> str:
    if scale <= 0 or value <= 0:
        return ""
    n = value / scale * BAR_WIDTH
    full = int(n)
    return "█" * full + ("▌" if n - full >= 0.5 else "")


def breakdown_table(components: dict[str, float], budget: float, title: str = "per GPU"):
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("component")
    table.add_column("GiB", justify="right")
    table.add_column("", no_wrap=True)
    scale = max(budget, sum(components.values()))
    for name, value in components.items():
        if value <= 0:
            continue
        table.add_row(LABELS.get(name, name), gib(value), f"[cyan]{bar(value, scale)}[/]")
    return table


def model_line(arch) -> str:
    return (
        f"{arch.name}: {arch.total_params / 1e9:,.2f}B params, {arch.layers} layers, hidden {arch.hidden}, "
        f"{arch.heads} heads / {arch.kv_heads} KV, vocab {arch.vocab:,}"
    )


def spec_line(spec, dp: int) -> str:
    m = spec.method
    if spec.trains_adapters:
        m += f" r={spec.lora_r} targets={spec.lora_targets}"
        if spec.method == "qlora":
            m += f" {spec.quant}"
    off = ""
    if spec.offload_optimizer != "none":
        off += f" +opt->{spec.offload_optimizer}"
    if spec.offload_params != "none":
        off += f" +params->{spec.offload_params}"
    if spec.hpz > 1:
        off += f" +hpZ {spec.hpz}"
    return (
        f"{m} | {spec.precision} | {spec.optimizer} | ZeRO-{spec.zero_stage}{off} | "
        f"tp {spec.tp} pp {spec.pp} dp {dp} | micro-batch {spec.micro_batch} x seq {spec.seq_len} "
        f"x accum {spec.grad_accum} | ckpt {spec.grad_ckpt} | attention {spec.attention}"
        + (" | packed rows" if spec.packing else "")
        + (" | compiled blocks" if spec.compile else "")
        + "".join(f" | {t}" for t in spec.techniques())
    )


def ckpt_label(spec) -> str:
    """Recompute and what else happens in backward (chunked loss, optimizer step):
    'full +chunk +step'."""
    return spec.grad_ckpt + (" +chunk" if spec.loss == "chunked" else "") + (
        " +step" if spec.optimizer_step == "in-backward" else ""
    )


def print_estimate(arch, spec, cluster, est) -> None:
    out = console()
    out.print(f"[bold]{model_line(arch)}[/]")
    out.print(f"on {cluster.describe()}")
    for note in (*cluster.notes, *est.notes):
        out.print(f"[yellow]note:[/] {note}")
    out.print(spec_line(spec, est.dp))
    out.print(
        f"trainable: {est.params_trainable / 1e9:,.3f}B params "
        f"({100 * est.params_trainable / arch.total_params:.2f} %) | peak at {est.peak_phase}"
    )
    out.print()
    out.print(breakdown_table(est.components, est.gpu_memory))
    out.print()
    out.print(f"peak allocated  {gib(est.peak_allocated):>8} GiB   (torch.cuda.max_memory_allocated)")
    out.print(f"peak reserved   {gib(est.peak_reserved):>8} GiB   (torch.cuda.max_memory_reserved)")
    verdict = "[bold green]FITS[/]" if est.fits else "[bold red]DOES NOT FIT[/]"
    free = est.gpu_memory - est.gpu_total
    out.print(
        f"GPU total       {gib(est.gpu_total):>8} GiB of {gib(est.gpu_memory)} GiB  {verdict} "
        f"({'+' if free >= 0 else '-'}{gib(abs(free))} GiB headroom)"
    )
    node = cluster.node
    host_ok = est.host_per_node <= node.cpu_memory_gib * GIB
    nvme_ok = est.nvme_per_node <= node.nvme_gib * GIB
    out.print(
        f"host RAM / node {gib(est.host_per_node):>8} GiB of {node.cpu_memory_gib:,.0f} GiB "
        + ("" if host_ok else "[bold red]OVER[/]")
    )
    if est.nvme_per_node > 0:
        out.print(
            f"NVMe / node     {gib(est.nvme_per_node):>8} GiB of {node.nvme_gib:,.0f} GiB "
            + ("" if nvme_ok else "[bold red]OVER[/]")
        )


def print_trace(est, traced, err_pct: float) -> None:
    """The traced step's peak beside the analytic one, component by component."""
    from rich.table import Table

    out = console()
    out.print()
    out.print(
        f"[bold]traced step[/] (FakeTensorMode on the CPU, {traced.seconds:.0f} s): "
        f"peak at {traced.peak_phase}"
    )
    t = Table(show_edge=False)
    t.add_column("component")
    t.add_column("analytic GiB", justify="right")
    t.add_column("traced GiB", justify="right")
    names = [k for k in est.components if k not in ("allocator_margin", "cuda_context_nccl")]
    for k in names:
        t.add_row(k, gib(est.components[k]), gib(traced.components.get(k, 0.0)))
    t.add_row("[bold]peak allocated[/]", gib(est.peak_allocated), gib(traced.peak_allocated))
    out.print(t)
    out.print(
        f"analytic vs trace: {err_pct:+.1f} %  (the trace counts tensors, not the allocator's "
        "rounding, the CUDA context or NCCL: compare peak allocated)"
    )


def secs(x: float) -> str:
    """Seconds, three significant figures or so: '557.3', '6.17', '0.04', '4.7e-04'."""
    return f"{x:,.1f}" if x >= 10 else f"{x:.2f}" if x >= 0.01 else f"{x:.1e}"


def table(columns, rows, title: str | None = None, left=()):
    """A borderless table: columns named in `left` align left, the others (numbers) right."""
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for col in columns:
        t.add_column(col, justify="left" if col in left else "right", no_wrap=True)
    for row in rows:
        t.add_row(*row)
    return t


def bullets(out, title: str, lines) -> None:
    """A bold title and one '- ' line per item; nothing at all when there are no items."""
    lines = list(lines)
    if lines:
        out.print()
        out.print(f"[bold]{title}[/]")
        for line in lines:
            out.print(f"  - {line}")


def stages_table(stages: list[dict]):
    """One row per pipeline stage: its blocks, what else it holds, where it runs, its peak."""
    rows = []
    for st in stages:
        held = (("embeddings", st["embeddings"]), ("norm + LM head", st["lm_head"]))
        extra = [name for name, on in held if on]
        ranks = st["ranks"]
        rows.append((
            str(st["stage"]),
            f"{st['blocks'][0]}-{st['blocks'][1]}",
            ", ".join(extra) or "-",
            str(st["micro_batches_in_flight"]),
            f"{ranks[0]}-{ranks[1]}" if ranks[1] > ranks[0] else str(ranks[0]),
            ", ".join(map(str, st["nodes"])),
            f"{st['gpu_total_gib']:.1f}",
        ))
    cols = ("stage", "blocks", "also holds", "in flight", "ranks", "node", "GPU GiB")
    title = "pipeline stages (1F1B; the worker trains this split)"
    return table(cols, rows, title=title, left=("also holds",))
