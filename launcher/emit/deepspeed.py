"""The DeepSpeed config for a plan, filled from the reference templates in ds_configs/.

Each template (ds_configs/*.json, documented in ds_configs/README.md) fixes the structure of
one family; every value written "auto" there is filled here from the plan:
  batch            train_micro_batch_size_per_gpu, gradient_accumulation_steps and
                   train_batch_size = micro x accumulation x DeepSpeed's data world. DeepSpeed
                   counts AutoTP ranks in that world (each TP rank sees the same samples), so
                   under TP it is micro x accumulation x dp x tp; the samples per optimizer
                   step stay micro x accumulation x dp.
  buckets          reduce / all-gather bucket = hidden², stage-3 prefetch = 0.9·hidden²,
                   parameter persistence threshold = 10·hidden (the rule of the HF
                   integration's "auto"; the memory model counts the same sizes).
  offload          device, NVMe path, pinned memory.
  precision        bf16 / fp16 (dynamic loss scaling) / fp32; bf16-pure keeps master weights,
                   gradients and optimizer states in bf16 (needs ZeRO 1+); bf16-autocast runs
                   DeepSpeed's torch_autocast over a bf16 base with fp32 adapters.
  optimizer step   in-backward: the worker steps each parameter inside the backward
                   (launcher/train/in_backward.py), so gradient_clipping is 0 (a global norm needs
                   every gradient at once), the optimizer is the worker's, and bf16-pure runs
                   without DeepSpeed's bf16 engine (the model is bf16, nothing else is kept).
  optimizer        AdamW as DeepSpeed's (fused on GPU, CPU-Adam when offloaded); 8-bit AdamW,
                   Adafactor and SGD are created by the worker and passed to DeepSpeed.
  tensor_parallel  {"autotp_size": tp} when AutoTP splits the model (tp > 1 at pp 1: full
                   fine-tuning with ZeRO 0-2, launcher/spec.py tensor_parallel_conflict); inside
                   pipeline stages the worker's own layers split it on the engine's topology.
ZeRO-3 configs always set stage3_gather_16bit_weights_on_model_save, so the saved final
weights are the gathered model, not empty placeholders.
"""

from __future__ import annotations

import copy
import json
from functools import cache

from launcher import templates
from launcher.errors import InvalidSpecError
from launcher.models.arch import ModelArch
from launcher.spec import TrainSpec, deepspeed_conflict, uses_autotp

DEFAULT_NVME_PATH = "/local_nvme"
DEFAULT_LR = {"full": 2e-5, "lora": 2e-4, "qlora": 2e-4}


@cache
def _load(name: str) -> dict:
    return json.loads(templates.read(templates.DS_CONFIGS, f"{name}.json"))


def template_name(spec: TrainSpec) -> str:
    """The reference config a plan starts from."""
    if uses_autotp(spec) and spec.zero_stage < 3:
        return "autotp"
    if spec.zero_stage < 3:
        return f"zero{spec.zero_stage}"
    devices = {spec.offload_optimizer, spec.offload_params} - {"none"}
    if "nvme" in devices:
        return "zero3_offload_nvme"
    if "cpu" in devices:
        return "zero3_offload_cpu"
    return "zero3"


def _offload(device: str, nvme_path: str, template: dict | None, params: bool) -> dict:
    block = dict(template or {})
    block["device"] = device
    block["pin_memory"] = True
    if device == "nvme":
        block["nvme_path"] = nvme_path
        block.setdefault("buffer_count", 5 if params else 4)
        if params:
            block.setdefault("buffer_size", 100_000_000)
    else:
        for key in ("nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "fast_init"):
            block.pop(key, None)
    return block


def ds_config(
    arch: ModelArch,
    spec: TrainSpec,
    dp: int,
    *,
    lr: float | None = None,
    weight_decay: float = 0.0,
    nvme_path: str = DEFAULT_NVME_PATH,
) -> dict:
    """A complete DeepSpeed config for one plan (dp = data-parallel degree)."""
    in_backward = spec.optimizer_step == "in-backward"
    why = deepspeed_conflict(spec)
    if why is not None:
        raise InvalidSpecError(why)
    cfg = copy.deepcopy(_load(template_name(spec)))
    h = arch.hidden
    cfg["train_micro_batch_size_per_gpu"] = spec.micro_batch
    cfg["gradient_accumulation_steps"] = spec.grad_accum
    cfg["train_batch_size"] = spec.micro_batch * spec.grad_accum * dp * (spec.tp if uses_autotp(spec) else 1)

    z = cfg["zero_optimization"]
    z["stage"] = spec.zero_stage
    for key, value in (
        ("reduce_bucket_size", h * h),
        ("allgather_bucket_size", h * h),
        ("stage3_prefetch_bucket_size", int(0.9 * h * h)),
        ("stage3_param_persistence_threshold", 10 * h),
    ):
        if key in z:
            z[key] = value
    if spec.offload_optimizer != "none":
        z["offload_optimizer"] = _offload(
            spec.offload_optimizer, nvme_path, z.get("offload_optimizer"), False
        )
    else:
        z.pop("offload_optimizer", None)
    if spec.offload_params != "none":
        z["offload_param"] = _offload(spec.offload_params, nvme_path, z.get("offload_param"), True)
    else:
        z.pop("offload_param", None)
    if "nvme" not in (spec.offload_optimizer, spec.offload_params):
        cfg.pop("aio", None)
    if uses_autotp(spec):
        cfg["tensor_parallel"] = {"autotp_size": spec.tp}
    if spec.pp > 1 and spec.tp > 1:
        # each TP rank sends its stage's whole output to the next stage: DeepSpeed's partitioned
        # sends (1/tp each, all-gathered by the receiving group) lose track of the varying
        # sequence lengths of the worker's micro-batches (its all-gather meets two lengths)
        cfg["pipeline"] = {"pipe_partitioned": False, "grad_partitioned": False}
    if spec.hpz > 1:
        z["zero_hpz_partition_size"] = spec.hpz

    if spec.precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif spec.precision == "bf16-autocast":
        # no bf16 engine (its fp32 master copy): the parameters keep their dtypes (bf16 base, fp32
        # adapters) and the engine runs forward under torch.autocast(bfloat16)
        cfg["torch_autocast"] = {"enabled": True, "dtype": "bfloat16"}
    elif spec.precision == "bf16-pure" and not in_backward:
        cfg["bf16"] = {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    elif spec.precision == "fp16":
        cfg["fp16"] = {
            "enabled": True,
            "loss_scale": 0,
            "initial_scale_power": 16,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "min_loss_scale": 1,
        }

    rate = DEFAULT_LR[spec.method] if lr is None else lr
    if in_backward:
        cfg["gradient_clipping"] = 0.0
    if spec.optimizer == "adamw" and not in_backward:
        cfg["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": rate, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": weight_decay},
        }
    else:
        cfg["zero_allow_untested_optimizer"] = True  # the worker passes its own optimizer
    return cfg
