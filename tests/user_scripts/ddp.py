"""A plain torch DDP script (no Hugging Face, no DeepSpeed): `ddp.py OUTPUT_DIR STEPS`. Each rank trains a
linear layer a few steps and writes what it saw (its rank, world size, ftlaunch's variables, its working
directory, the final loss, which all ranks share) to OUTPUT_DIR/rank-RANK.json."""

import json
import os
import sys

import torch
import torch.distributed as dist

out_dir, steps = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 8, generator=torch.Generator().manual_seed(rank))
y = x.sum(dim=1, keepdim=True)
losses = []
for _ in range(steps):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
weights = model.module.weight.detach().clone()
dist.all_reduce(weights)
seen = {k: v for k, v in os.environ.items() if k.startswith("FTLAUNCH_")}
report = {"rank": rank, "world": dist.get_world_size(), "env": seen, "cwd": os.getcwd(), "losses": losses,
          "weights_sum": weights.sum().item(), "argv": sys.argv[1:]}
with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
    json.dump(report, f)
dist.destroy_process_group()
