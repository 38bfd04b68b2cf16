"""Every DeepSpeed config the emitter writes is accepted by DeepSpeed's own parser, with the
batch arithmetic consistent, over a grid of stages, offloads, precisions and TP degrees."""

from __future__ import annotations

import itertools
import json
import os
import socket

import pytest

from launcher import templates
from launcher.emit.deepspeed import ds_config, template_name
from launcher.errors import InvalidSpecError
from launcher.models.catalog import resolve_model
from launcher.spec import TrainSpec
from tests.runs import ROOT

deepspeed = pytest.importorskip("deepspeed")


class DataParallelGroup:
    """The one method DeepSpeedConfig asks of an mpu: the data-parallel world size."""

    def __init__(self, size: int) -> None:
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


@pytest.fixture(scope="module")
def ds_parser():
    """DeepSpeedConfig reads the rank from deepspeed.comm: start a 1-process gloo group."""
    import deepspeed.comm as dist
    from deepspeed.runtime.config import DeepSpeedConfig

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    return DeepSpeedConfig


def grid():
    for stage, opt_off, param_off, precision, tp, optimizer in itertools.product(
        (0, 1, 2, 3),
        ("none", "cpu", "nvme"),
        ("none", "cpu", "nvme"),
        ("bf16", "fp16", "fp32", "bf16-pure"),
        (1, 2, 4),
        ("adamw", "adamw-8bit"),
    ):
        try:
            spec = TrainSpec(
                zero_stage=stage,
                offload_optimizer=opt_off,
                offload_params=param_off,
                precision=precision,
                tp=tp,
                optimizer=optimizer,
                micro_batch=2,
                grad_accum=4,
            )
        except InvalidSpecError:
            continue  # combinations DeepSpeed cannot run are refused at the spec already
        if precision == "bf16-pure" and stage == 0:
            continue
        yield spec


# ZeRO++ hpZ on ZeRO-3 (8-GPU nodes), with and without optimizer offload
GRID = list(grid()) + [
    TrainSpec(zero_stage=3, hpz=8, offload_optimizer=off, micro_batch=2, grad_accum=4) for off in ("none", "cpu")
]


def test_grid_is_broad():
    assert len(GRID) >= 150
    assert {s.zero_stage for s in GRID} == {0, 1, 2, 3}
    assert {template_name(s) for s in GRID} == {n.removesuffix(".json") for n in templates.names(templates.DS_CONFIGS, ".json")}


@pytest.mark.parametrize(
    "spec",
    GRID,
    ids=lambda s: (
        f"z{s.zero_stage}-{s.offload_optimizer}-{s.offload_params}-{s.precision}-tp{s.tp}-{s.optimizer}"
        + (f"-hpz{s.hpz}" if s.hpz > 1 else "")
    ),
)
def test_deepspeed_accepts_config(spec, ds_parser):
    arch = resolve_model("llama-3.1-8b")
    dp = 8 // spec.tp
    cfg = ds_config(arch, spec, dp)
    json.dumps(cfg)  # serialisable as written to ds_config.json
    parsed = ds_parser(cfg, mpu=DataParallelGroup(dp * spec.tp))
    assert parsed.zero_optimization_stage == spec.zero_stage
    assert parsed.train_micro_batch_size_per_gpu == spec.micro_batch
    assert parsed.gradient_accumulation_steps == spec.grad_accum
    # samples per optimizer step = micro x accumulation x data-parallel replicas
    assert parsed.train_batch_size // spec.tp == spec.micro_batch * spec.grad_accum * dp
    assert parsed.bfloat16_config.enabled == spec.precision.startswith("bf16")
    assert parsed.float16_config.enabled == (spec.precision == "fp16")
    z = parsed.zero_config
    if spec.offload_optimizer != "none":
        assert z.offload_optimizer.device == spec.offload_optimizer
    if spec.offload_params != "none":
        assert z.offload_param.device == spec.offload_params
    if spec.zero_stage == 3:
        assert z.gather_16bit_weights_on_model_save is True
    if spec.tp > 1:
        assert cfg["tensor_parallel"]["autotp_size"] == spec.tp
    assert z.zero_hpz_partition_size == spec.hpz


def test_buckets_follow_hidden_size():
    small, big = resolve_model("llama-3.2-1b"), resolve_model("llama-3.1-70b")
    spec = TrainSpec(zero_stage=3)
    a, b = ds_config(small, spec, 8)["zero_optimization"], ds_config(big, spec, 8)["zero_optimization"]
    assert a["reduce_bucket_size"] == 2048**2 and b["reduce_bucket_size"] == 8192**2
    assert b["stage3_prefetch_bucket_size"] == int(0.9 * 8192**2)
    assert b["stage3_param_persistence_threshold"] == 81920


def test_no_auto_left_anywhere():
    arch = resolve_model("mistral-7b")
    for spec in GRID:
        assert '"auto"' not in json.dumps(ds_config(arch, spec, 8 // spec.tp))


def test_reference_templates_are_valid_json_with_documented_families():
    readme = templates.read(templates.DS_CONFIGS, "README.md")
    for name in templates.names(templates.DS_CONFIGS, ".json"):
        json.loads(templates.read(templates.DS_CONFIGS, name))
        assert name in readme


def test_a_missing_template_is_one_line_naming_the_fix():
    with pytest.raises(templates.MissingTemplateError, match=r"ds_configs/zero9\.json is missing .*reinstall"):
        templates.read(templates.DS_CONFIGS, "zero9.json")


def test_the_package_templates_are_the_top_level_folders():
    """One copy: launcher/templates/ links to ds_configs/ and slurm/ (what the wheel ships)."""
    for folder in (templates.DS_CONFIGS, templates.SLURM):
        link = ROOT / "launcher" / "templates" / folder
        assert link.is_symlink() and link.resolve() == (ROOT / folder).resolve()
