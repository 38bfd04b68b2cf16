"""`python -m launcher.backends.supervise RUN_DIR`: runs the run directory's launch.sh, in its own
session, and records how it ended in logs/exit_code (atomically), so that `ftlaunch status`
knows the outcome even when the ftlaunch process that started the job is gone.

SIGTERM / SIGINT to the supervisor are passed on to the job's process group; the supervisor
itself keeps waiting so the exit code is always written.

`submit` hands it the run directory's lock (an open file holding an exclusive flock) as an
inherited file descriptor; never closed, it is held for the supervisor's whole life and makes a
second launch of the same run directory fail while this one runs. launch.sh does not inherit it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from launcher.backends import rank_exit


def main(argv: list[str]) -> int:
    run_dir = Path(argv[0]).resolve()
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    # reserve the exit-code file now: if the disk fills up during the job, it can still be written
    pending = logs / ".exit_code.pending"
    pending.write_bytes(b" " * 32)
    with open(logs / "launcher.log", "ab", buffering=0) as log:
        proc = subprocess.Popen(
            ["bash", str(run_dir / "launch.sh")], stdout=log, stderr=subprocess.STDOUT, cwd=run_dir
        )

        def forward(signum, frame):
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        signal.signal(signal.SIGUSR1, forward)
        code = proc.wait()
    if code != 0:  # torchrun exits 1 whatever its ranks' codes: 75 / 2 come from their markers
        code = rank_exit.ended(run_dir) or code
    with open(pending, "r+b") as f:  # in place: needs no new space
        f.write(f"{code}\n".encode().ljust(32))
    os.replace(pending, logs / "exit_code")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
