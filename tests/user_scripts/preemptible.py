"""A user's script that stops the way ftlaunch documents: `preemptible.py OUT_DIR MODE`. On its first
start it checkpoints (here: writes OUT_DIR/checkpoint-RANK) and exits 75, either when SIGUSR1 arrives
(MODE signal: Slurm's time-limit warning, passed on by torchrun) or at once (MODE self: the program's own
decision); started again (a requeued job), it finds its checkpoint and finishes with 0."""

import os
import signal
import sys
import time

out, mode = sys.argv[1], sys.argv[2]
rank = os.environ["RANK"]
os.makedirs(out, exist_ok=True)
checkpoint = os.path.join(out, f"checkpoint-{rank}")
if os.path.exists(checkpoint):
    with open(os.path.join(out, f"resumed-{rank}"), "w") as f:
        f.write(os.environ.get("SLURM_RESTART_COUNT", "0"))
    sys.exit(0)

stop = []
signal.signal(signal.SIGUSR1, lambda *_: stop.append(1))
open(os.path.join(out, f"started-{rank}"), "w").close()
deadline = time.time() + 300
while mode == "signal" and not stop and time.time() < deadline:
    time.sleep(0.1)
with open(checkpoint, "w") as f:
    f.write("signal" if stop else mode)
sys.exit(75)
