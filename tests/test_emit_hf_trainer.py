"""ds_config_hf.json leaves the Trainer its own values. That the file with hf_args.txt runs a stock
Hugging Face Trainer (and TRL) script as written, its DeepSpeed engine running the plan, is tested
by launching such scripts through `--script ... -- {hf_args}` (tests/test_user_program.py)."""

from __future__ import annotations

import pytest

from launcher.emit.hf_trainer import trainer_ds_config

pytest.importorskip("transformers")
pytest.importorskip("deepspeed")


def test_the_trainer_form_leaves_the_trainers_values_to_it():
    ds = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
          "gradient_clipping": 1.0, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}}}
    cfg = trainer_ds_config(ds)
    assert "train_batch_size" not in cfg and cfg["bf16"] == {"enabled": "auto"}
    assert cfg["zero_optimization"] == {"stage": 2} and set(cfg["optimizer"]["params"].values()) == {"auto"}
    assert ds["bf16"] == {"enabled": True}  # the engine's file is left as it is
