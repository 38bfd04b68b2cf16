"""A program that fails on every rank, after printing where: `python -m userpkg.fail`."""

import os

print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} starting", flush=True)
raise RuntimeError("the user's training step failed: loss is nan")
