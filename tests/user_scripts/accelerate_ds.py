"""A user's accelerate script: `accelerate_ds.py OUTPUT_DIR`. Nothing about the plan in it: the DeepSpeed
engine comes from the accelerate config it is launched with (DummyOptim because that config's DeepSpeed
file has an optimizer section). Writes what the engine ran to OUTPUT_DIR/engine-RANK.json."""

import json
import os
import sys

import torch
import transformers
from accelerate import Accelerator
from accelerate.utils import DummyOptim

acc = Accelerator()
ds = acc.state.deepspeed_plugin.deepspeed_config
cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(cfg)
model, opt = acc.prepare(model, DummyOptim(model.parameters()))
ids = torch.randint(0, 64, (ds["train_micro_batch_size_per_gpu"], 16), generator=torch.Generator().manual_seed(1))
losses = []
for _ in range(4 * model.gradient_accumulation_steps()):
    loss = model(input_ids=ids, labels=ids).loss
    acc.backward(loss)
    opt.step()
    losses.append(loss.item())
rank = torch.distributed.get_rank()
report = {
    "world": torch.distributed.get_world_size(),
    "dp": model.dp_world_size,
    "stage": model.zero_optimization_stage(),
    "micro_batch": model.train_micro_batch_size_per_gpu(),
    "grad_accum": model.gradient_accumulation_steps(),
    "machine_rank": os.environ.get("GROUP_RANK"),
    "cwd": os.getcwd(),
    "losses": losses,
}
os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], f"engine-{rank}.json"), "w") as f:
    json.dump(report, f)
