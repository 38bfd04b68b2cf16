"""ds_config_hf.json and hf_args.txt run a stock Hugging Face Trainer script as written: started
from another directory under torchrun on 2 CPU ranks, the Trainer accepts the file with the flags
(no value copied by hand) and its DeepSpeed engine runs the plan's ZeRO stage, micro-batch,
accumulation, learning rate and scheduler."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap

import pytest

from launcher.cli import main
from launcher.emit.hf_trainer import trainer_ds_config
from tests.runs import cpu_env

pytest.importorskip("transformers")
pytest.importorskip("deepspeed")

# a user's script: TrainingArguments from the command line, nothing else about the plan
SCRIPT = textwrap.dedent(
    """
    import json, sys, torch, transformers
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
    open(args.output_dir + f"/engine-{torch.distributed.get_rank()}.json", "w").write(json.dumps(out))
    """
)


def test_the_trainer_form_leaves_the_trainers_values_to_it():
    ds = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
          "gradient_clipping": 1.0, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}}}
    cfg = trainer_ds_config(ds)
    assert "train_batch_size" not in cfg and cfg["bf16"] == {"enabled": "auto"}
    assert cfg["zero_optimization"] == {"stage": 2} and set(cfg["optimizer"]["params"].values()) == {"auto"}
    assert ds["bf16"] == {"enabled": True}  # the engine's file is left as it is


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_a_stock_trainer_script_runs_the_plan(stage, tmp_path, capsys):
    argv = ["--model", "tiny-llama", "--gpus", "1x2xA100", "--cpu", "--init", "random", "--zero-stage", str(stage)]
    argv += ["--precision", "fp32", "--micro-batch", "2", "--grad-accum", "2", "--lr", "3e-4", "--warmup-steps", "1"]
    assert main([*argv, "--dry-run", "--name", "t", "--runs-dir", str(tmp_path / "runs")]) == 0, capsys.readouterr().err
    run_dir = tmp_path / "runs" / "t"
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "elsewhere").mkdir()
    out = tmp_path / "out"
    flags = shlex.split((run_dir / "hf_args.txt").read_text())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(tmp_path / "train.py")]
    cmd += [*flags, "--output_dir", str(out), "--max_steps", "3", "--report_to", "none", "--save_strategy", "no"]
    proc = subprocess.run(cmd, cwd=tmp_path / "elsewhere", env=cpu_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    for rank in (0, 1):
        got = json.loads((out / f"engine-{rank}.json").read_text())
        assert got == {"world": 2, "stage": stage, "micro_batch": 2, "accum": 2, "lr": 3e-4, "scheduler": "WarmupLR"}
