"""The accelerate config is read by accelerate's own config loader and matches the plan."""

from __future__ import annotations

import pytest

from launcher.emit.accelerate_config import accelerate_config
from launcher.hardware import parse_gpus
from launcher.spec import TrainSpec

config_args = pytest.importorskip("accelerate.commands.config.config_args")


@pytest.mark.parametrize(
    "spec,gpus,dp",
    [
        (TrainSpec(zero_stage=3), "2x8xA100", 16),
        (TrainSpec(zero_stage=2, tp=2, precision="fp16"), "8xA100", 4),
        (TrainSpec(zero_stage=1, pp=4), "8xH100", 2),
        (TrainSpec(precision="fp32"), "1xA10", 1),
    ],
)
def test_accelerate_reads_it(spec, gpus, dp, tmp_path):
    cluster = parse_gpus(gpus)
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(accelerate_config(spec, cluster, dp))
    cfg = config_args.ClusterConfig.from_yaml_file(str(path))
    assert cfg.num_machines == cluster.nodes
    assert cfg.num_processes == (dp * spec.tp if spec.pp == 1 else dp)
    if spec.pp == 1:
        assert cfg.distributed_type.value == "DEEPSPEED"
        assert cfg.deepspeed_config["deepspeed_config_file"] == "ds_config.json"
        assert cfg.deepspeed_config["zero3_init_flag"] is (spec.zero_stage == 3)
    expected = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[spec.precision]
    assert (
        str(cfg.mixed_precision.value if hasattr(cfg.mixed_precision, "value") else cfg.mixed_precision)
        == expected
    )
