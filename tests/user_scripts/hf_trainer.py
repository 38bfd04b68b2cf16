"""A stock Hugging Face Trainer script: TrainingArguments from the command line, nothing about the plan.
It writes what its DeepSpeed engine ran to OUTPUT_DIR/engine-RANK.json (the tests compare it with the plan)."""

import json

import torch
import transformers
from transformers import HfArgumentParser, Trainer, TrainingArguments

args, = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=64)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


trainer = Trainer(model=transformers.AutoModelForCausalLM.from_config(cfg), args=args, train_dataset=Data())
trainer.train()
e = trainer.model_wrapped
out = {"world": torch.distributed.get_world_size(), "stage": e.zero_optimization_stage(),
       "micro_batch": e.train_micro_batch_size_per_gpu(), "accum": e.gradient_accumulation_steps(),
       "lr": e.get_lr()[0], "scheduler": type(e.lr_scheduler).__name__}
if args.torch_compile:  # the Trainer's --torch_compile reaches DeepSpeed's engine
    out["compiled"] = e.is_compiled
with open(f"{args.output_dir}/engine-{torch.distributed.get_rank()}.json", "w") as f:
    f.write(json.dumps(out))
