"""bench/other_estimators.py: DeepSpeed, accelerate and llm-analysis figures for one configuration."""

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("accelerate")
pytest.importorskip("llm_analysis")

from bench import other_estimators as oe  # noqa: E402
from launcher.hardware import parse_gpus  # noqa: E402
from launcher.models.catalog import resolve_model  # noqa: E402
from launcher.spec import TrainSpec  # noqa: E402

GIB = 2**30


@pytest.fixture(scope="module")
def arch():
    return resolve_model("llama-3.2-1b")


ONE = parse_gpus("1xA100-80GB")
EIGHT = parse_gpus("8xA100-80GB")
FULL = TrainSpec(method="full", precision="bf16", micro_batch=1, seq_len=2048)
ZERO3 = TrainSpec(method="full", precision="bf16", micro_batch=1, seq_len=2048, zero_stage=3)


@pytest.mark.parametrize("spec,cluster", [(FULL, ONE), (ZERO3, EIGHT)], ids=["zero0-1gpu", "zero3-8gpu"])
def test_each_tool_gives_a_positive_figure_with_a_note(arch, spec, cluster):
    for name, got in oe.compare(arch, spec, cluster).items():
        assert isinstance(got.gib, float) and got.gib > 0, (name, got)
        assert got.note and "\n" not in got.note and not got.note.startswith("failed"), (name, got)


def test_deepspeed_matches_its_documented_formulas(arch):
    n = arch.total_params
    # stage_1_and_2.py: gpu = 2N + int(18N / gpus) (fp16 params + fp16/fp32 grads, fp32 master, Adam m, v);
    # ZeRO-0 is taken as that over one GPU, i.e. 20N unsharded
    assert oe.deepspeed(arch, FULL, ONE).gib == pytest.approx((2 * n + 18 * n) / GIB, abs=1e-9)
    z2 = TrainSpec(zero_stage=2)
    assert oe.deepspeed(arch, z2, EIGHT).gib == pytest.approx((2 * n + int(18 * n / 8)) / GIB, abs=1e-9)
    off = TrainSpec(zero_stage=2, offload_optimizer="cpu")
    assert oe.deepspeed(arch, off, EIGHT).gib == pytest.approx(2 * n / GIB, abs=1e-9)
    # stage3.py: gpu = 4 * largest_layer + int(18N / gpus); largest = the embedding (vocab x hidden)
    largest = arch.vocab * arch.hidden
    assert oe.largest_module_params(arch) == largest
    got = oe.deepspeed(arch, ZERO3, EIGHT)
    assert got.gib == pytest.approx((4 * largest + int(18 * n / 8)) / GIB, abs=1e-9)
    assert "model states only" in got.note
    both = TrainSpec(zero_stage=3, offload_optimizer="cpu", offload_params="cpu")
    assert oe.deepspeed(arch, both, EIGHT).gib == pytest.approx(4 * largest / GIB, abs=1e-9)


def test_zero3_is_smaller_per_gpu_than_zero0(arch):
    assert oe.deepspeed(arch, ZERO3, EIGHT).gib < oe.deepspeed(arch, FULL, ONE).gib
    assert oe.llm_analysis(arch, ZERO3, EIGHT).gib < oe.llm_analysis(arch, FULL, ONE).gib


def test_accelerate_is_the_max_component_of_its_training_table(arch):
    # bf16 mixed: max(model 4N, grads 6N, Adam 8N, step 8N) = 8N; fp32: step 16N
    n = arch.total_params
    assert oe.accelerate(arch, FULL, ONE).gib == pytest.approx(8 * n / GIB)
    assert oe.accelerate(arch, TrainSpec(precision="fp32"), ONE).gib == pytest.approx(16 * n / GIB)
    assert oe.accelerate(arch, ZERO3, EIGHT).gib == oe.accelerate(arch, FULL, ONE).gib  # no sharding


def test_llm_analysis_model_states_and_activation_knobs(arch):
    full = oe.llm_analysis(arch, FULL, ONE)
    # its parameter count is exact for a tied SwiGLU model with hidden-sized heads
    assert "1.24B params" in full.note
    # activations grow with the sequence and shrink with recomputation
    assert oe.llm_analysis(arch, TrainSpec(seq_len=4096), ONE).gib > full.gib
    assert oe.llm_analysis(arch, TrainSpec(grad_ckpt="full"), ONE).gib < full.gib
    # the GPU only sets the capacity and timings: the same total on an unknown GPU (fallback)
    h200 = oe.llm_analysis(arch, FULL, parse_gpus("1xH200"))
    assert h200.gib == pytest.approx(full.gib) and "A100 timing" in h200.note


def test_not_applicable_cases(arch):
    lora = oe.llm_analysis(arch, TrainSpec(method="lora"), ONE)
    assert lora.gib is None and "full fine-tuning only" in lora.note
    tp = oe.deepspeed(arch, TrainSpec(tp=2), EIGHT)
    assert tp.gib is None and "TP/PP" in tp.note
    assert oe.llm_analysis(arch, TrainSpec(tp=2), EIGHT).gib > 0
    ds_lora = oe.deepspeed(arch, TrainSpec(method="lora"), ONE)
    assert ds_lora.gib > 0 and "every parameter as trainable" in ds_lora.note
    acc_lora = oe.accelerate(arch, TrainSpec(method="qlora"), ONE)
    assert acc_lora.gib > 0 and "full training" in acc_lora.note


def test_a_tool_error_becomes_a_failed_note(arch, monkeypatch):
    monkeypatch.setattr(oe, "_llma_model_config", lambda *a: 1 / 0)
    got = oe.llm_analysis(arch, FULL, ONE)
    assert got.gib is None and got.note.startswith("failed: ZeroDivisionError")
