"""`ftlaunch report RUN`: one self-contained HTML page of a run (RUN/report/report.html: inline SVG
charts, no script, no outside file) with the training and evaluation loss, tokens/s, and the plan's
memory breakdown beside the measured peaks; and the charts as PNG files when Pillow is installed.

Read from plan.json and logs/metrics.jsonl only, so it works for a finished, a failed and a running
job, on any backend; a damaged line of metrics.jsonl is skipped, never an error.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path

from launcher.progress import number
from launcher.rundir import read_run_dir

W, H, PAD = 720, 300, 56  # chart size and margin (px)
COLORS = {"train": "#1f77b4", "eval": "#d62728", "tokens": "#2ca02c"}


@dataclass
class Series:
    label: str
    color: str
    points: list[tuple[float, float]]
    dots: bool = False  # points only (evaluations), not a line


@dataclass
class Chart:
    name: str
    title: str
    ylabel: str
    series: list[Series] = field(default_factory=list)

    def bounds(self) -> tuple[float, float, float, float]:
        xs = [x for s in self.series for x, _ in s.points] or [0.0, 1.0]
        ys = [y for s in self.series for _, y in s.points] or [0.0, 1.0]
        lo, hi = min(ys), max(ys)
        pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 1.0
        return min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1, lo - pad, hi + pad

    def place(self, x: float, y: float) -> tuple[float, float]:
        x0, x1, y0, y1 = self.bounds()
        return PAD + (x - x0) / (x1 - x0) * (W - 2 * PAD), H - PAD - (y - y0) / (y1 - y0) * (H - 2 * PAD)


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "logs" / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(row, dict):
            out.append(row)
    return out


def charts(rows: list[dict]) -> list[Chart]:
    steps = [r for r in rows if isinstance(r.get("step"), int) and number(r.get("loss")) and "event" not in r]
    evals = [r for r in rows if r.get("event") == "eval" and isinstance(r.get("step"), int) and number(r.get("eval_loss"))]
    loss = Chart("loss", "Loss", "loss per token", [Series("training loss", COLORS["train"], [(r["step"], r["loss"]) for r in steps])])
    if evals:
        loss.series.append(Series("evaluation loss", COLORS["eval"], [(r["step"], r["eval_loss"]) for r in evals], dots=True))
    speed = [(r["step"], r["tokens_per_s"]) for r in steps if number(r.get("tokens_per_s"))]
    return [loss, Chart("tokens", "Throughput", "tokens/s", [Series("tokens/s", COLORS["tokens"], speed)])]


def _ticks(lo: float, hi: float, n: int = 5, whole: bool = False) -> list[float]:
    """n ticks from lo to hi; whole: steps, never two ticks on one step."""
    ticks = [lo + (hi - lo) * i / (n - 1) for i in range(n)]
    return sorted({round(t) for t in ticks}) if whole else ticks


def _label(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def svg(chart: Chart) -> str:
    x0, x1, y0, y1 = chart.bounds()
    parts = [f'<svg id="{chart.name}-chart" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'viewBox="0 0 {W} {H}" role="img" aria-label="{html.escape(chart.title)}">',
             f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="15">{html.escape(chart.title)}</text>']
    for y in _ticks(y0, y1):
        _, py = chart.place(x0, y)
        parts.append(f'<line x1="{PAD}" x2="{W - PAD}" y1="{py:.1f}" y2="{py:.1f}" stroke="#ddd"/>'
                     f'<text x="{PAD - 6}" y="{py + 4:.1f}" text-anchor="end" font-size="11">{_label(y)}</text>')
    for x in _ticks(x0, x1, whole=True):
        px, _ = chart.place(x, y0)
        parts.append(f'<text x="{px:.1f}" y="{H - PAD + 16}" text-anchor="middle" font-size="11">{x:.0f}</text>')
    parts.append(f'<text x="{W / 2}" y="{H - 12}" text-anchor="middle" font-size="12">step</text>'
                 f'<text x="14" y="{H / 2}" text-anchor="middle" font-size="12" '
                 f'transform="rotate(-90 14 {H / 2})">{html.escape(chart.ylabel)}</text>')
    for i, s in enumerate(chart.series):
        pts = [chart.place(x, y) for x, y in s.points]
        if s.dots:
            parts += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="{s.color}"/>' for px, py in pts]
        elif pts:
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py in pts)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{s.color}" stroke-width="2"/>')
        parts.append(f'<text x="{W - PAD}" y="{40 + 16 * i}" text-anchor="end" font-size="12" fill="{s.color}">'
                     f"{html.escape(s.label)}</text>")
    parts.append("</svg>")
    return "".join(parts)


def png(chart: Chart, path: Path) -> bool:
    """The chart as a PNG (Pillow); False when Pillow is not installed."""
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        return False
    image = Image.new("RGB", (W, H), "white")
    draw = ImageDraw.Draw(image)
    x0, x1, y0, y1 = chart.bounds()
    draw.text((W / 2, 8), chart.title, fill="black", anchor="mt")
    for y in _ticks(y0, y1):
        _, py = chart.place(x0, y)
        draw.line([(PAD, py), (W - PAD, py)], fill="#dddddd")
        draw.text((PAD - 6, py), _label(y), fill="black", anchor="rm")
    for x in _ticks(x0, x1, whole=True):
        px, _ = chart.place(x, y0)
        draw.text((px, H - PAD + 10), f"{x:.0f}", fill="black", anchor="mt")
    draw.text((W / 2, H - 14), "step", fill="black", anchor="mm")
    for i, s in enumerate(chart.series):
        pts = [chart.place(x, y) for x, y in s.points]
        if s.dots:
            for px, py in pts:
                draw.ellipse([px - 4, py - 4, px + 4, py + 4], fill=s.color)
        elif len(pts) > 1:
            draw.line(pts, fill=s.color, width=2)
        draw.text((W - PAD, 34 + 16 * i), s.label, fill=s.color, anchor="rt")
    image.save(path)
    return True


def memory_rows(plan: dict, rows: list[dict]) -> tuple[list[tuple[str, str, str]], str]:
    """(component, planned GiB, measured GiB) rows and a note on what was measured."""
    per_gpu = plan.get("memory", {}).get("per_gpu", {})
    table = [(name.replace("_", " "), f"{gib:.3f}", "") for name, gib in per_gpu.get("components", {}).items()]
    measured = {k: max((r[k] for r in rows if number(r.get(k))), default=None)
                for k in ("peak_allocated_gib", "peak_reserved_gib", "host_rss_gib")}
    for key, label in (("peak_allocated_gib", "peak allocated"), ("peak_reserved_gib", "peak reserved")):
        got = measured[key]
        table.append((label, f"{per_gpu.get(key, float('nan')):.3f}", "" if got is None else f"{got:.3f}"))
    if measured["peak_allocated_gib"] is not None:
        note = "Measured: torch.cuda's peaks on rank 0, over the run."
    elif measured["host_rss_gib"] is not None:
        note = (f"No GPU in this run (CPU ranks): nothing to set beside the GPU peaks; rank 0's host memory "
                f"peaked at {measured['host_rss_gib']:.3f} GiB.")
    else:
        note = "No step logged yet: nothing measured."
    return table, note


def write(run_dir: Path) -> dict:
    """Write RUN/report/ and say what it holds."""
    run = read_run_dir(run_dir)
    rows = _rows(run_dir)
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    figures = charts(rows)
    steps = len(figures[0].series[0].points)
    pngs = [str(out / f"{c.name}.png") for c in figures if png(c, out / f"{c.name}.png")]
    table, note = memory_rows(run.plan, rows)
    spec = run.spec
    finished = next((r for r in reversed(rows) if r.get("event") == "finished"), None)
    layout = (f"{spec.get('method')} · ZeRO-{spec.get('zero_stage')} · tp {spec.get('tp')} × pp {spec.get('pp')} × "
              f"dp {run.dp} · micro-batch {spec.get('micro_batch')} × {spec.get('grad_accum')} · seq {spec.get('seq_len')}")
    c = run.cluster
    shape = f"{c.get('nodes')}x{c.get('gpus_per_node')}x{c.get('gpu')}"
    cells = "".join(f"<tr><td>{html.escape(a)}</td><td>{b}</td><td>{c}</td></tr>" for a, b, c in table)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ftlaunch report: {html.escape(run.name)}</title>
<style>body{{font-family:sans-serif;margin:24px;color:#222}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}} td:first-child{{text-align:left}}</style></head>
<body><h1>{html.escape(run.name)}</h1>
<p>{html.escape(run.model.name)} on {html.escape(shape)}: {html.escape(layout)}</p>
<p>{steps} of {run.training.max_steps} steps logged{'; finished' if finished else ''}.</p>
{"".join(svg(c) + "<br>" for c in figures)}
<h2>Memory per GPU (GiB)</h2>
<table id="memory"><tr><th>component</th><th>planned</th><th>measured</th></tr>{cells}</table>
<p>{html.escape(note)}</p>
</body></html>
"""
    (out / "report.html").write_text(page, encoding="utf-8")
    return {"html": str(out / "report.html"), "png": pngs, "steps": steps}
