"""--compile: the worker compiles every transformer block (launcher/train/model.py compile_blocks) and
trains the eager curve; the speed model counts the fused element-wise work (perf.py,
COMPILE_ELEMENTWISE_RATIO, fitted on the torchtune rows of bench/data/published_speed.jsonl); the memory
plan stays the eager one, which compiled blocks do not exceed (inductor's partitioner recomputes the
element-wise ops in backward instead of saving their outputs); the planner searches only the
layouts the worker compiles (data-parallel engine, tp = pp = 1)."""

from __future__ import annotations

import json
import shlex

import pytest

from launcher.cli import main
from launcher.hardware import parse_gpus
from launcher.memory.estimate import estimate
from launcher.models.catalog import resolve_model
from launcher.planner import constants as C
from launcher.planner.perf import performance
from launcher.spec import TrainSpec


def test_compile_fuses_the_elementwise_term_and_nothing_else():
    arch, cluster = resolve_model("llama-3.2-3b"), parse_gpus("1xA100-80GB")
    spec = TrainSpec(precision="bf16-pure", micro_batch=2, seq_len=4096, zero_stage=1)
    eager, compiled = (performance(arch, s, cluster, 1) for s in (spec, spec.with_(compile=True)))
    for term, seconds in eager.breakdown.items():
        want = seconds * C.COMPILE_ELEMENTWISE_RATIO if term == "elementwise" else seconds
        assert compiled.breakdown[term] == pytest.approx(want, rel=1e-9), term
    assert eager.breakdown["elementwise"] > 0 and compiled.tokens_per_s > eager.tokens_per_s
    assert estimate(arch, spec.with_(compile=True), cluster) == estimate(arch, spec, cluster)


def test_compile_refuses_tensor_and_pipeline_layouts_and_the_search_drops_them(capsys):
    base = ["plan", "--model", "tiny-llama", "--gpus", "1x4xA100", "--compile", "--json"]
    for flag, layout in (("--tp", "--tp 2 --pp 1"), ("--pp", "--tp 1 --pp 2")):
        assert main([*base, flag, "2"]) == 2
        err = capsys.readouterr().err
        assert f"--compile with {layout}" in err and "drop --compile" in err and len(err.strip().splitlines()) == 1
    layouts = {}
    for flags in ([], ["--compile"]):
        args = ["plan", "--model", "llama-3.1-70b", "--gpus", "2x8xA100", "--seq-len", "512", "--top", "200", "--json"]
        assert main(args + flags) == 0
        plans = json.loads(capsys.readouterr().out)["plans"]
        layouts[bool(flags)] = {(p["tp"], p["pp"]) for p in plans}
    assert layouts[False] - {(1, 1)} and layouts[True] == {(1, 1)}


def test_the_trainer_flags_compile_the_model_only_when_asked(tmp_path):
    from launcher.emit.hf_trainer import trainer_args

    ds = {"optimizer": {"params": {"betas": [0.9, 0.999], "eps": 1e-8}}}
    for on in (False, True):
        flags = trainer_args(TrainSpec(compile=on), ds, tmp_path, 1e-4, 0.0, 0)
        assert ("--torch_compile" in flags) is on
        if on:
            assert flags[flags.index("--torch_compile") + 1] == "True"
    transformers = pytest.importorskip("transformers")
    args = shlex.split(" ".join(trainer_args(TrainSpec(compile=True), ds, tmp_path, 1e-4, 0.0, 0)))
    args = [a for a in args if a not in ("--deepspeed", str(tmp_path / "ds_config_hf.json"))]
    parsed, = transformers.HfArgumentParser(transformers.TrainingArguments).parse_args_into_dataclasses(
        [*args, "--output_dir", str(tmp_path), "--use_cpu", "True"]
    )
    assert parsed.torch_compile is True


@pytest.mark.slow
def test_compiled_blocks_save_no_more_than_the_eager_count():
    """Saved-for-backward bytes of a tiny Llama whose blocks are compiled (inductor's own saved
    tensors, through autograd's saved-tensor hooks) against the estimator's eager count."""
    torch = pytest.importorskip("torch")
    from launcher.train.model import compile_blocks
    from tests.memtrack import SavedBytes
    from tests.test_memory_activations import BATCH, CFG, SEQ, analytic_activations, build

    for method in ("full", "lora"):
        model, spec = build("bf16", "sdpa", method, "none")
        ids = torch.randint(0, CFG["vocab_size"], (BATCH, SEQ))
        assert compile_blocks(model) == CFG["num_hidden_layers"]
        model(input_ids=ids)  # compiles
        with SavedBytes(model) as saved:
            model(input_ids=ids)
        predicted = analytic_activations(spec)
        assert saved.total <= predicted, (method, saved.total, predicted)


@pytest.mark.slow
def test_the_worker_trains_compiled_blocks_on_the_eager_curve(tmp_path):
    """ZeRO-3 with LoRA and full recompute on 2 ranks (fp32): the compiled blocks run inside
    DeepSpeed's parameter gathers and the checkpoint's recompute, and the curve is the eager one."""
    from tests.runs import events, make_run, run_torchrun
    from tests.test_train_e2e import metrics

    curves = {}
    for on in (False, True):
        spec = TrainSpec(method="lora", zero_stage=3, precision="fp32", micro_batch=2, seq_len=128,
                         grad_ckpt="full", compile=on)
        run_dir, argv = make_run(tmp_path / str(on), f"c{int(on)}", spec, max_steps=3, save_every=3, lr=1e-3)
        proc = run_torchrun(argv)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        curves[on] = [r["loss"] for r in metrics(run_dir)]
        logged = [e for e in events(run_dir) if e["event"] == "compiled"]
        assert logged == ([{"event": "compiled", "blocks": 2}] if on else [])
    assert len(curves[True]) == 3 and curves[True][-1] < curves[True][0], curves
    assert curves[True] == pytest.approx(curves[False], rel=1e-5), curves


def test_preflight_wants_the_compiler_inductor_builds_with(monkeypatch, tmp_path):
    """A container without a compiler would fail in every rank at the first step: one line before."""
    from launcher.preflight import PreflightError, check_compile

    check_compile(TrainSpec(compile=False), cpu=True)  # nothing asked, nothing checked
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    check_compile(TrainSpec(compile=False), cpu=True)
    with pytest.raises(PreflightError, match="no g\\+\\+ / clang\\+\\+ / c\\+\\+ is on the PATH"):
        check_compile(TrainSpec(compile=True), cpu=True)
    with pytest.raises(PreflightError, match="C compiler and no cc / gcc / clang"):
        check_compile(TrainSpec(compile=True), cpu=False)
    (tmp_path / "my-cxx").write_text("#!/bin/sh\n")
    (tmp_path / "my-cxx").chmod(0o755)
    monkeypatch.setenv("CXX", "my-cxx")
    check_compile(TrainSpec(compile=True), cpu=True)
    monkeypatch.setenv("CXX", "gone-cxx")
    with pytest.raises(PreflightError, match="CXX='gone-cxx' is not on the PATH"):
        check_compile(TrainSpec(compile=True), cpu=True)


def test_compile_blocks_finds_the_families_block_or_says_it_cannot():
    """The blocks are the class transformers will not split (every catalog family names one); a model
    that names none is one clear line, not a run that silently trains uncompiled."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from launcher.train.model import ModelLoadError, compile_blocks

    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    assert compile_blocks(model) == 3  # compiled lazily: nothing is traced until a forward
    assert all(layer._compiled_call_impl is not None for layer in model.model.layers)
    with pytest.raises(ModelLoadError, match="names no transformer block class"):
        compile_blocks(torch.nn.Sequential(torch.nn.Linear(4, 4)))
