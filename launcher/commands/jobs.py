"""`ftlaunch launch | status | logs | cancel RUN`: run and watch a written run directory.

RUN is a run directory, or the name of one under ./runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from launcher.errors import FtlaunchError

DEFAULT_ROOT = Path("runs")


def resolve_run(text: str) -> Path:
    p = Path(text)
    for candidate in (p, DEFAULT_ROOT / text):
        if (candidate / "plan.json").is_file():
            return candidate.resolve()
    raise FtlaunchError(f"no run directory {text!r} (looked for {p}/plan.json and runs/{text}/plan.json)")


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "launch", help="start a written run directory", description="Start a run directory's job."
    )
    p.add_argument("target", metavar="RUN", help="run directory or name under ./runs")
    p.add_argument("--detach", action="store_true", help="return at once instead of following the log")
    p.add_argument("--skip-preflight", action="store_true", help="do not check data, model and run dir first")
    p.set_defaults(run_cmd=run_launch)
    p = sub.add_parser("status", help="state of a job", description="Show a job's state.")
    p.add_argument("target", metavar="RUN", help="run directory or name under ./runs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run_cmd=run_status)
    p = sub.add_parser("logs", help="print (and follow) a job's log", description="Print a job's log.")
    p.add_argument("target", metavar="RUN", help="run directory or name under ./runs")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.set_defaults(run_cmd=run_logs)
    p = sub.add_parser("cancel", help="stop a job (ranks checkpoint first)", description="Cancel a job.")
    p.add_argument("target", metavar="RUN", help="run directory or name under ./runs")
    p.add_argument("--grace", type=float, default=60.0, help="seconds before SIGKILL (default 60)")
    p.set_defaults(run_cmd=run_cancel)
    for name in ("launch", "status", "logs", "cancel"):
        sub.choices[name].set_defaults(run=_dispatch)


def _dispatch(args: argparse.Namespace) -> int:
    return args.run_cmd(args, resolve_run(args.target))


def start(run_dir: Path, detach: bool, skip_preflight: bool) -> int:
    from launcher.backends import local

    if not skip_preflight:
        from launcher.preflight import check_run_dir

        check_run_dir(run_dir)
    local.submit(run_dir)
    print(f"started {run_dir}  (ftlaunch status {run_dir} | logs -f | cancel)", flush=True)
    if detach:
        return 0
    st = local.follow(run_dir, lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    print(f"{run_dir.name}: {st['state']}" + (f" (exit code {st['exit_code']})" if "exit_code" in st else ""))
    return 0 if st["state"] == "SUCCEEDED" else 1


def run_launch(args, run_dir: Path) -> int:
    return start(run_dir, args.detach, args.skip_preflight)


def run_status(args, run_dir: Path) -> int:
    from launcher.backends import local

    st = local.status(run_dir)
    if args.json:
        print(json.dumps(st, indent=2))
    else:
        extra = "".join(f"  {k}={st[k]}" for k in ("step", "exit_code", "pid", "reason") if k in st)
        print(f"{run_dir.name}: {st['state']}{extra}")
    return 0


def run_logs(args, run_dir: Path) -> int:
    from launcher.backends import local

    local.follow(run_dir, lambda s: (sys.stdout.write(s), sys.stdout.flush()), follow_=args.follow)
    return 0


def run_cancel(args, run_dir: Path) -> int:
    from launcher.backends import local

    st = local.cancel(run_dir, args.grace)
    print(f"{run_dir.name}: {st['state']}")
    return 0
