import sys

from launcher.backends import rank_exit
from launcher.train.loop import exit_process, main

run_dir = sys.argv[1] if len(sys.argv) == 2 else None
if run_dir is not None and not rank_exit.start(run_dir):
    exit_process(rank_exit.STARTUP)
code = main()
if run_dir is not None:
    rank_exit.end(run_dir, code)
exit_process(code)
