"""A stock TRL SFTTrainer script: SFTConfig from the command line, a tiny offline tokenizer and data set.
It writes what its DeepSpeed engine ran to OUTPUT_DIR/engine-RANK.json."""

import json

import datasets
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import HfArgumentParser, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

args, = HfArgumentParser(SFTConfig).parse_args_into_dataclasses()
letters = "abcdefghijklmnopqrstuvwxyz"
vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", *letters])}
core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")
text = ["".join(letters[(i * 7 + j) % 26] for j in range(12)) for i in range(64)]
cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=len(vocab), pad_token_id=0, eos_token_id=1)
trainer = SFTTrainer(model=transformers.AutoModelForCausalLM.from_config(cfg), args=args,
                     train_dataset=datasets.Dataset.from_dict({"text": text}), processing_class=tokenizer)
trainer.train()
e = trainer.model_wrapped
out = {"world": torch.distributed.get_world_size(), "stage": e.zero_optimization_stage(),
       "micro_batch": e.train_micro_batch_size_per_gpu(), "accum": e.gradient_accumulation_steps(),
       "lr": e.get_lr()[0], "scheduler": type(e.lr_scheduler).__name__}
with open(f"{args.output_dir}/engine-{torch.distributed.get_rank()}.json", "w") as f:
    f.write(json.dumps(out))
