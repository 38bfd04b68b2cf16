"""Process-group start-up that survives elastic restarts.

torchrun (torch 2.13) keeps one agent-hosted TCPStore across restarts, and gloo's connection
keys from the failed attempt are still in it: a restarted group can try to connect to the dead
ranks' addresses and hang. Each attempt therefore joins under its own key prefix
(ftlaunch/attempt-N). DeepSpeed then adopts the already-initialised group.
"""

from __future__ import annotations

import os
from datetime import timedelta

TIMEOUT = timedelta(minutes=30)


def init(backend: str) -> None:
    import deepspeed
    import torch.distributed as dist

    env = os.environ
    if not dist.is_initialized() and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        world, rank = int(env["WORLD_SIZE"]), int(env["RANK"])
        base = dist.TCPStore(
            env["MASTER_ADDR"], int(env["MASTER_PORT"]), world, is_master=False, timeout=TIMEOUT
        )
        store = dist.PrefixStore(f"ftlaunch/attempt-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", base)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    deepspeed.init_distributed(dist_backend=backend, verbose=False, timeout=TIMEOUT)
