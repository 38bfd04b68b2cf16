"""What a rank's exit code tells the job, carried past torchrun (which exits 1 whatever code its
ranks ended with):

- 75 (EX_TEMPFAIL): the rank checkpointed and stopped; running the job again resumes it. A Slurm
  job requeues itself (bounded by --max-requeues), a local job is recorded PREEMPTED.
- 2: a start-up error only the user can fix (bad arguments, a bad config, a refused plan). Not
  worth --max-restarts: once a rank of this launch has exited 2, ranks that torchrun restarts exit
  2 at once, so the restarts end in seconds instead of repeating a start-up that fails the same way;
  the job is recorded as exit code 2.

A rank ending with one of these codes leaves a marker, RUN_DIR/logs/.rank_exit-CODE. launch.sh and
job.sbatch clear the markers when the job starts, the supervisor and job.sbatch read them when it
ends. ftlaunch's worker leaves only the 75 marker itself (it also exits 2 when a peer rank died
mid-run, which a restart must retry); a user's program runs under
`python -m launcher.backends.rank_exit RUN_DIR SCRIPT ARGS...` (or `RUN_DIR -m MODULE ARGS...`),
which runs it as `python SCRIPT ARGS` would (runpy: __main__, sys.argv, the script's directory first
on sys.path), records how it exited and ends the process without the interpreter's teardown (finish).
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import runpy
import sys
from pathlib import Path

PREEMPTED = 75
STARTUP = 2
CODES = (STARTUP, PREEMPTED)  # in the order ended() reports them
CLEAR_SHELL = 'rm -f "$RUN_DIR"/logs/.rank_exit-*'  # the line launch.sh / job.sbatch start with


def marker(run_dir: str | Path, code: int) -> Path:
    return Path(run_dir) / "logs" / f".rank_exit-{code}"


def clear(run_dir: str | Path) -> None:
    """Forget what ranks of an earlier launch left (the shell form: CLEAR_SHELL)."""
    for code in CODES:
        marker(run_dir, code).unlink(missing_ok=True)


def ended(run_dir: str | Path) -> int | None:
    """The code a rank of this launch left a marker for (a start-up error first), or None."""
    return next((code for code in CODES if marker(run_dir, code).exists()), None)


def start(run_dir: str | Path) -> bool:
    """False (and one line) if a rank of this launch already ended with a start-up error."""
    if marker(run_dir, STARTUP).exists():
        sys.stderr.write(
            "ftlaunch: not started again: a rank exited 2 (a start-up error) earlier in this launch; the first "
            "attempt's log says what to fix, then launch again\n"
        )
        return False
    return True


def end(run_dir: str | Path, code: int) -> None:
    if code in CODES:
        path = marker(run_dir, code)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{os.environ.get('RANK', '?')}\n")
        except OSError:  # a full or read-only disk must not hide the rank's own exit
            pass


def _code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1  # sys.exit("message") exits 1


def run(run_dir: str, program: list[str]) -> int:
    """Run SCRIPT ARGS or -m MODULE ARGS in this process as python would; its exit code (an uncaught
    exception: its traceback, then 1)."""
    if not start(run_dir):
        return STARTUP
    code = 0
    try:
        if program[0] == "-m":
            sys.argv = [program[1], *program[2:]]
            runpy.run_module(program[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(program)
            sys.path[0] = os.path.dirname(os.path.abspath(program[0]))
            runpy.run_path(program[0], run_name="__main__")
    except SystemExit as exc:
        code = _code(exc)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, exit 1
        sys.excepthook(*sys.exc_info())
        code = 1
    end(run_dir, code)
    return code


def finish(code: int) -> None:
    """End the process once the program has ended: its atexit handlers run and the files it left open
    are flushed, as the interpreter's teardown would, but the teardown itself is skipped. A rank whose
    training had finished has been seen to abort there ("terminate called without an active exception":
    a C++ thread of torch / DeepSpeed destroyed unjoined, exit -6; a TRL SFTTrainer rank in CI), which
    torchrun reports as a failed job and restarts."""
    atexit._run_exitfuncs()
    for obj in gc.get_objects():
        try:
            # a weakref.proxy whose referent is gone raises ReferenceError at isinstance (torch.compile
            # leaves such proxies behind)
            if isinstance(obj, io.IOBase) and not obj.closed:
                obj.flush()
        except Exception:  # noqa: BLE001 - a stream already broken stays so
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] == "-m" and len(sys.argv) < 4:
        sys.stderr.write("usage: python -m launcher.backends.rank_exit RUN_DIR (SCRIPT | -m MODULE) [ARGS...]\n")
        sys.exit(2)
    finish(run(sys.argv[1], sys.argv[2:]))
