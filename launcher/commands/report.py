"""`ftlaunch report RUN`: the run's HTML report and PNG charts (launcher/report.py)."""

from __future__ import annotations

import argparse
import json


def add_parser(sub) -> None:
    p = sub.add_parser(
        "report",
        help="write an HTML report of a run (loss, eval, tokens/s, memory)",
        description="Write RUN/report/report.html: loss and evaluation curves, tokens/s, and the plan's memory "
        "breakdown beside the measured peaks, one self-contained page (inline SVG, no script); the charts also "
        "as PNG files when Pillow is installed. Works while the job runs, and after it ends.",
    )
    p.add_argument("target", metavar="RUN", help="run directory or name under ./runs")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from launcher import report
    from launcher.commands.jobs import resolve_run

    written = report.write(resolve_run(args.target))
    if args.json:
        print(json.dumps(written))
    else:
        print(f"{written['html']}  ({written['steps']} steps; PNG charts: {', '.join(written['png']) or 'none, pip install pillow'})")
    return 0
