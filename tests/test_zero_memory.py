"""A data-parallel step's transient memory measured in DeepSpeed's own engine on 2 CPU ranks, against
the memory model: what rank 0 allocates during its second optimizer step and frees by its end (live
bytes of new storages: tests/stage_memory_probe.py measure_step), against the estimate's peak less
what it counts as kept from step to step. ZeRO-2, ZeRO-3 and ZeRO-3 with the optimizer and the
parameters offloaded, at 2 x 256 tokens of a 2.8M-parameter Llama, where activations and the logits
set the peak: within 5 % (measured 0.1 %).

Where the model states set the peak (1 x 32 tokens) the engine holds more at the optimizer step than
the model counts (measured, DeepSpeed 0.19.8): ZeRO-1/2 with bf16 flatten the bf16 gradient partition
before casting it to fp32 (a third copy, 2 bytes per partition element, for a moment); ZeRO-0 with bf16
runs DeepSpeed's FP16_Optimizer (DDP_BFLOAT16, not BF16_Optimizer), which makes an fp32 copy of every
gradient and then flattens them (8 bytes per parameter for a moment, with no fp32 buffer during the
backward); ZeRO-0 flattens each all-reduce bucket after the backward (up to allreduce_bucket_size
elements), even on one rank. Issue 20 item 3 keeps them open: the model and the trace change together."""

from __future__ import annotations

import pytest

from launcher.spec import TrainSpec
from tests.test_memory_activations import CFG

pytest.importorskip("deepspeed")
from tests.stage_memory_probe import measure_step  # noqa: E402

pytestmark = pytest.mark.slow

LLAMA = {**CFG, "architectures": ["LlamaForCausalLM"]}
STEP = dict(micro_batch=2, seq_len=256)
CASES = {
    "zero2": TrainSpec(zero_stage=2, **STEP),
    "zero3": TrainSpec(zero_stage=3, **STEP),
    "zero3-offload-optimizer": TrainSpec(zero_stage=3, offload_optimizer="cpu", **STEP),
    "zero3-offload-all": TrainSpec(zero_stage=3, offload_optimizer="cpu", offload_params="cpu", **STEP),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_steps_transient_memory_in_deepspeed_is_what_the_model_counts(name, tmp_path):
    modelled, measured = measure_step(tmp_path, CASES[name], "1x2xA100", LLAMA)
    assert modelled == pytest.approx(measured, rel=0.05), (modelled / 2**20, measured / 2**20)
