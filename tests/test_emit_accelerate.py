"""The accelerate config: read by accelerate's own config loader and matching the plan, and run as
written by `accelerate launch` (started from another directory) on 2 CPU ranks, on one node and
on two "nodes" of this machine."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from launcher.cli import main
from launcher.emit.accelerate_config import accelerate_config
from launcher.hardware import parse_gpus
from launcher.spec import TrainSpec
from tests.runs import cpu_env

config_args = pytest.importorskip("accelerate.commands.config.config_args")


@pytest.mark.parametrize(
    "spec,gpus,dp,endpoint",
    [
        (TrainSpec(zero_stage=3), "2x8xA100", 16, "10.1.2.3:29400"),
        (TrainSpec(zero_stage=2, tp=2, precision="fp16"), "8xA100", 4, None),
        (TrainSpec(zero_stage=1, pp=4), "8xH100", 2, None),
        (TrainSpec(precision="fp32"), "1xA10", 1, None),
    ],
)
def test_accelerate_reads_it(spec, gpus, dp, endpoint, tmp_path):
    cluster = parse_gpus(gpus)
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(accelerate_config(spec, cluster, dp, tmp_path, endpoint))
    cfg = config_args.ClusterConfig.from_yaml_file(str(path))
    assert cfg.num_machines == cluster.nodes
    assert cfg.num_processes == (dp * spec.tp if spec.pp == 1 else dp)
    if cluster.nodes > 1:
        assert (cfg.main_process_ip, cfg.main_process_port) == ("10.1.2.3", 29400)
    if spec.pp == 1:
        assert cfg.distributed_type.value == "DEEPSPEED"
        assert cfg.deepspeed_config["deepspeed_config_file"] == str(tmp_path / "ds_config.json")
        assert cfg.deepspeed_config["zero3_init_flag"] is (spec.zero_stage == 3)
        assert cfg.mixed_precision is None  # the DeepSpeed file says it; accelerate refuses both
    else:
        assert str(getattr(cfg.mixed_precision, "value", cfg.mixed_precision)) == "bf16"


# A user's accelerate script: the engine comes from the config's DeepSpeed file (DummyOptim
# because that file has an optimizer section); prints what the engine runs.
SCRIPT = textwrap.dedent(
    """
    import json, sys, torch, transformers
    from accelerate import Accelerator
    from accelerate.utils import DummyOptim

    acc = Accelerator()
    ds = acc.state.deepspeed_plugin.deepspeed_config
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    model, opt = acc.prepare(model, DummyOptim(model.parameters()))
    for _ in range(2):
        ids = torch.randint(0, 64, (ds["train_micro_batch_size_per_gpu"], 8))
        acc.backward(model(input_ids=ids, labels=ids).loss)
        opt.step()
    out = {"world": torch.distributed.get_world_size(), "dp": model.dp_world_size,
           "stage": model.zero_optimization_stage(), "micro_batch": model.train_micro_batch_size_per_gpu()}
    open(sys.argv[1] + f"-{torch.distributed.get_rank()}.json", "w").write(json.dumps(out))
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("gpus", ["1x2xA100", "2x1xA100"])
def test_accelerate_launch_runs_the_written_config_from_anywhere(gpus, tmp_path, capsys):
    endpoint = f"127.0.0.1:{_free_port()}"
    argv = ["--model", "tiny-llama", "--gpus", gpus, "--cpu", "--init", "random", "--zero-stage", "2"]
    argv += ["--micro-batch", "2", "--dry-run", "--name", "acc", "--runs-dir", str(tmp_path / "runs")]
    if gpus.startswith("2x"):
        argv += ["--rdzv-endpoint", endpoint]
    assert main(argv) == 0, capsys.readouterr().err
    run_dir = tmp_path / "runs" / "acc"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "train.py").write_text(SCRIPT)
    out = tmp_path / "out"
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(run_dir / "accelerate_config.yaml")]
    nodes = [[*launch, str(tmp_path / "train.py"), str(out)]]
    if gpus.startswith("2x"):  # two "nodes" of this machine, each told its rank as a user would
        nodes = [[*launch, "--machine_rank", str(n), str(tmp_path / "train.py"), str(out)] for n in (0, 1)]
    procs = [
        subprocess.Popen(a, cwd=tmp_path / "elsewhere", env=cpu_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for a in nodes
    ]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    plan = json.loads((run_dir / "plan.json").read_text())
    for rank in (0, 1):
        got = json.loads(Path(f"{out}-{rank}.json").read_text())
        assert got == {"world": 2, "dp": 2, "stage": 2, "micro_batch": plan["spec"]["micro_batch"]}
