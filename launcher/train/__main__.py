import sys

from launcher.backends import rank_exit
from launcher.train.loop import exit_process, main

code = main()
if len(sys.argv) == 2 and code == rank_exit.PREEMPTED:
    # 75 only: the worker also exits 2 when a peer rank died mid-run, which a restart must retry
    rank_exit.end(sys.argv[1], code)
exit_process(code)
