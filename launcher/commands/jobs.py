"""`ftlaunch launch | status | logs | cancel RUN`: run and watch a written run directory;
`ftlaunch jobs`: the runs with a job, and their states.

RUN is a run directory, or the name of one under ./runs. The backend is the run's: plan.json's
backend name when launching, job.json's "backend" once started.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from launcher import options
from launcher.errors import FtlaunchError

DEFAULT_ROOT = Path("runs")
_BACKENDS = {
    "torchrun": "launcher.backends.local",
    "slurm": "launcher.backends.slurm",
    "ray": "launcher.backends.ray",
}
_DONE = ("SUCCEEDED", "COMPLETED")  # a job that ended well, as the backends call it


def resolve_run(text: str) -> Path:
    shown = text if len(text) <= 60 else text[:57] + "..."
    try:
        p = Path(text)
        for candidate in (p, DEFAULT_ROOT / text):
            if (candidate / "plan.json").is_file():
                return candidate.resolve()
    except (OSError, ValueError):  # a name too long for the filesystem, a NUL byte
        pass
    raise FtlaunchError(
        f"no run directory {shown!r}: pass a run directory (with plan.json) or a name under ./runs"
    )


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
    p.add_argument(
        "--grace",
        type=options.at_most(options.non_negative_float, 86400),
        default=60.0,
        help="seconds the ranks get to checkpoint before SIGKILL (default 60)",
    )
    p.set_defaults(run_cmd=run_cancel)
    p = sub.add_parser(
        "preflight",
        help="check a run directory before queueing it",
        description="Check a run directory: data, model, GPUs, DeepSpeed ops, and (unless --no-allreduce) one "
        "all-reduce over every rank with the job's own launch command, naming the host that fails.",
    )
    p.add_argument("target", metavar="RUN", help="run directory or name under ./runs")
    p.add_argument(
        "--timeout",
        type=options.at_most(options.positive_float, 86400),
        default=60.0,
        help="seconds for the all-reduce (default 60)",
    )
    p.add_argument("--no-allreduce", action="store_true", help="only the static checks")
    p.set_defaults(run_cmd=run_preflight)
    for name in ("launch", "status", "logs", "cancel", "preflight"):
        sub.choices[name].set_defaults(run=_dispatch)
    p = sub.add_parser("jobs", help="list runs with a job and their states", description="List jobs.")
    p.add_argument("--runs-dir", type=Path, default=DEFAULT_ROOT, metavar="DIR", help="default ./runs")
    p.add_argument("--address", metavar="URL", help="also list the ftlaunch jobs on this Ray cluster")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run_jobs)


def _dispatch(args: argparse.Namespace) -> int:
    return args.run_cmd(args, resolve_run(args.target))


def backend(run_dir: Path, launching: bool = False):
    """The backend module (submit / status / follow / cancel) of a run directory: plan.json's
    when launching, then job.json's (any backend reports a run without a job as NOT_STARTED)."""
    from launcher.rundir import RunDirError, read_job, read_run_dir

    name = None
    if not launching:
        try:
            name = (read_job(run_dir, {}) or {}).get("backend")
        except RunDirError:
            pass  # the backend's own status says what is wrong with it
    if not isinstance(name, str):  # launching, or a job record that does not say: the plan's
        name = read_run_dir(run_dir).backend.get("name", "torchrun")
    if name not in _BACKENDS:
        raise FtlaunchError(f"{run_dir.name}: unknown backend {name!r}; write the run directory again")
    return importlib.import_module(_BACKENDS[name])


# states in which a run's job may still run or start: its run directory is not to be rewritten
_ACTIVE = ("RUNNING", "PENDING", "REQUEUED", "UNKNOWN")


def refuse_if_active(run_dir: Path, doing: str) -> None:
    st = backend(run_dir).status(run_dir)
    if st["state"] in _ACTIVE:
        why = f" ({st['reason']})" if st.get("reason") else ""
        raise FtlaunchError(
            f"{run_dir.name} is {st['state']}{why}: {doing} is refused while its job may run; "
            f"`ftlaunch cancel {run_dir}` first"
        )


def _print(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def start(run_dir: Path, detach: bool, skip_preflight: bool) -> int:
    be = backend(run_dir, launching=True)
    if not skip_preflight:
        from launcher.preflight import check_run_dir

        for note in check_run_dir(run_dir):
            print(f"{run_dir.name}: note: {note}", flush=True)
    job = be.submit(run_dir)
    queued = f"queued as Slurm job {job['job_id']}" if "job_id" in job else "started"
    if "submission_id" in job:
        queued = f"submitted to Ray as {job['submission_id']}"
    print(f"{run_dir.name}: {queued}  (ftlaunch status {run_dir} | logs -f | cancel)", flush=True)
    if detach:
        return 0
    st = _follow(be, run_dir)
    print(f"{run_dir.name}: {st['state']}" + (f" (exit code {st['exit_code']})" if "exit_code" in st else ""))
    return 0 if st["state"] in _DONE else 1


def run_launch(args, run_dir: Path) -> int:
    return start(run_dir, args.detach, args.skip_preflight)


_SHOWN = ("step", "job_id", "slurm_state", "submission_id", "restarts", "exit_code", "pid", "reason")


def _follow(be, run_dir: Path, follow_: bool = True) -> dict:
    """The job's log as it grows; on a terminal the step lines are one progress line (progress.py)."""
    from launcher import progress

    out = progress.Follower(sys.stdout, progress.max_steps(run_dir), sys.stdout.isatty())
    try:
        return be.follow(run_dir, out, follow_=follow_)
    finally:
        out.close()


def run_status(args, run_dir: Path) -> int:
    from launcher import progress

    st = backend(run_dir).status(run_dir)
    more = progress.summary(run_dir)  # max_steps, loss, eta_s: what metrics.jsonl tells
    if st["state"] != "RUNNING":
        more.pop("eta_s", None)
    st.update({k: v for k, v in more.items() if k not in st})
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    shown = dict(st)
    if st["state"] == "RUNNING" and "step" in st:  # step N/M  loss X  eta T, then the backend's fields
        shown["step"] = f"{st['step']}/{st['max_steps']}" if "max_steps" in st else st["step"]
        shown["loss"] = st.get("loss", "-")
        shown["eta"] = progress.clock(st.get("eta_s"))
    keys = ("step", "loss", "eta") if st["state"] == "RUNNING" else ("step",)
    extra = "".join(f"  {k}={shown[k]}" for k in (*keys, *_SHOWN[1:]) if k in shown)
    print(f"{run_dir.name}: {st['state']}{extra}")
    return 0


def run_logs(args, run_dir: Path) -> int:
    _follow(backend(run_dir), run_dir, follow_=args.follow)
    return 0


def run_cancel(args, run_dir: Path) -> int:
    st = backend(run_dir).cancel(run_dir, args.grace)
    print(f"{run_dir.name}: {st['state']}")
    return 0


def _row(run_dir: Path) -> dict:
    """One run's status for `jobs`; a run whose files are broken is listed, not fatal to the list."""
    try:
        return backend(run_dir).status(run_dir)
    except FtlaunchError as exc:
        return {"run": str(run_dir), "state": "UNKNOWN", "reason": str(exc)}


def run_jobs(args) -> int:
    """Runs under --runs-dir that have a job, and ftlaunch jobs in the Slurm queue (and, with --address,
    on that Ray cluster) from elsewhere."""
    import shutil

    dirs = sorted(d.resolve() for d in args.runs_dir.glob("*/job.json")) if args.runs_dir.is_dir() else []
    dirs = [d.parent for d in dirs]
    if shutil.which("squeue"):
        from launcher.backends import slurm

        dirs += [Path(q["run"]) for q in slurm.queue() if Path(q["run"]) not in dirs]
    rows = [_row(d) for d in dirs]
    if args.address:
        from launcher.backends import ray

        known = {st.get("submission_id") for st in rows}
        rows += [r for r in ray.list_jobs(args.address) if r["submission_id"] not in known]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for st in rows:
        job = str(st.get("job_id") or st.get("submission_id") or st.get("pid") or "-")[:20]
        step = st.get("step", "-")
        print(
            f"{Path(st['run']).name:40} {str(st.get('backend', '-')):9} {st['state']:11} job {job:<8} step {step}"
        )
    if not rows:
        print(f"no jobs under {args.runs_dir}")
    return 0


def run_preflight(args, run_dir: Path) -> int:
    from launcher.preflight import allreduce, check_run_dir
    from launcher.rundir import read_run_dir

    notes = check_run_dir(run_dir)
    checked = "your program" if read_run_dir(run_dir).program is not None else "data, model"
    print(f"{run_dir.name}: run directory, {checked}, GPUs and DeepSpeed ops ok")
    for note in notes:
        print(f"{run_dir.name}: note: {note}")
    if not args.no_allreduce:
        reports = allreduce(run_dir, args.timeout)
        slowest = max(r["seconds"] for r in reports)
        hosts = sorted({r["host"] for r in reports})
        print(
            f"all-reduce over {len(reports)} ranks on {', '.join(hosts)} ok ({slowest:.1f} s); run dir shared"
        )
    return 0
