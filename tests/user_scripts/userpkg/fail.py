"""A program that fails on every rank, after printing where: `python -m userpkg.fail`.

The ranks meet at a barrier between the print and the raise: without it the first rank to raise made
torchrun stop the others, once before one had printed (seen in CI)."""

import os

import torch.distributed as dist

print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} starting", flush=True)
dist.init_process_group("gloo")
dist.barrier()
raise RuntimeError("the user's training step failed: loss is nan")
