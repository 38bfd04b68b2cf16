"""The plan for a Hugging Face Trainer (or TRL) script: ds_config_hf.json and the flags that go with it.

The engine's ds_config.json states every value, and the Trainer refuses a DeepSpeed file whose
batch, accumulation, learning rate, clipping or precision differ from its own arguments (it fills
only the values written "auto"). ds_config_hf.json keeps the engine settings of ds_config.json
(ZeRO stage, buckets, offload, tensor parallel) and writes "auto" wherever the Trainer fills a
value from its arguments; it has no train_batch_size (DeepSpeed derives micro x accumulation x
world) and a WarmupLR scheduler (linear warmup, then constant: the worker's schedule).
hf_args.txt holds the TrainingArguments flags that give the Trainer the plan's values:

    python -m torch.distributed.run ... train.py $(cat RUN/hf_args.txt) --output_dir OUT

Precision and gradient checkpointing are stated either way (TRL's defaults differ from the Trainer's);
--compile adds --torch_compile True.
Selective recomputation has no Trainer flag: such plans get full gradient checkpointing, which
needs less memory than the plan counted. Pipeline plans have no Trainer form (the Trainer does
not drive DeepSpeed's pipeline engine); the Trainer builds its own LoRA / QLoRA model.
"""

from __future__ import annotations

import copy
from pathlib import Path

from launcher.spec import TrainSpec

CONFIG = "ds_config_hf.json"
ARGS = "hf_args.txt"
OPTIM = {
    "adamw-8bit": "adamw_bnb_8bit",
    "paged-adamw": "paged_adamw_32bit",
    "paged-adamw-8bit": "paged_adamw_8bit",
    "adafactor": "adafactor",
    "sgd": "sgd",
}  # TrainingArguments.optim


def trainer_ds_config(ds: dict) -> dict:
    """ds_config.json in the Trainer's form."""
    cfg = copy.deepcopy(ds)
    cfg.pop("train_batch_size", None)
    cfg.update(train_micro_batch_size_per_gpu="auto", gradient_accumulation_steps="auto", gradient_clipping="auto")
    for precision in ("bf16", "fp16"):
        if cfg.get(precision, {}).get("enabled"):
            cfg[precision]["enabled"] = "auto"
    if "optimizer" in cfg:
        cfg["optimizer"]["params"].update(lr="auto", betas="auto", eps="auto", weight_decay="auto")
    cfg["scheduler"] = {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto", "warmup_type": "linear"},
    }
    return cfg


def trainer_args(
    spec: TrainSpec, ds: dict, run_dir: Path, lr: float, weight_decay: float, warmup: int
) -> list[str]:
    """The TrainingArguments flags that realise the plan with ds_config_hf.json."""
    args = [
        "--deepspeed", str(Path(run_dir) / CONFIG),
        "--per_device_train_batch_size", str(spec.micro_batch),
        "--gradient_accumulation_steps", str(spec.grad_accum),
        "--learning_rate", repr(lr),
        "--weight_decay", repr(weight_decay),
        "--warmup_steps", str(warmup),
        "--max_grad_norm", repr(float(ds.get("gradient_clipping", 1.0))),
    ]
    if "optimizer" in ds:
        beta1, beta2 = ds["optimizer"]["params"]["betas"]
        args += ["--adam_beta1", repr(beta1), "--adam_beta2", repr(beta2), "--adam_epsilon", repr(ds["optimizer"]["params"]["eps"])]
    else:
        args += ["--optim", OPTIM[spec.optimizer]]
    # stated either way: TRL's SFTConfig, for one, turns bf16 and gradient checkpointing on by default
    for precision in ("bf16", "fp16"):
        args += [f"--{precision}", str(bool(ds.get(precision, {}).get("enabled")))]
    args += ["--gradient_checkpointing", str(spec.grad_ckpt != "none")]
    if spec.compile:
        args += ["--torch_compile", "True"]  # the Trainer compiles the whole model (both default to off)
    return args
