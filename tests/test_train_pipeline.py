"""Pipeline plans trained for real: DeepSpeed's pipeline engine under torchrun on CPU ranks (gloo),
the tiny Llama split into 2 stages. Pipelining must not change the training (the same curve as
one rank with the same global batch), the final weights come out as ONE Hugging Face model.
A relaunch from a pipeline checkpoint is bitwise (tests/test_resume_exact.py[pp2]); the 6.3e-5 a
killed stage once resumed off was DeepSpeed's CPU Adam (launcher/train/cpu_adam.py)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from launcher.spec import TrainSpec
from tests.runs import (
    assert_pipeline_export,
    assert_same_curve,
    assert_same_weights,
    cpu_fp16_env,
    make_run,
    run_torchrun,
)
from tests.test_train_e2e import reload_loss
from tests.test_train_faults import curve, events, started_steps, submit_with_cpu_env, wait_done, wait_for

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("deepspeed")

pytestmark = pytest.mark.slow

# global batch 8 = micro-batch 2 x 4 micro-batches per step (the pipeline's 1F1B depth) x dp 1
SPEC = TrainSpec(pp=2, zero_stage=1, micro_batch=2, grad_accum=4, seq_len=64)
RUN = {"max_steps": 12, "save_every": 4, "lr": 1e-3}
STEPS = list(range(1, 13))


def planned(root, name, spec, gpus="1x2xA100", **training):
    """make_run with gradient clipping off. DeepSpeed sums the squares for the clipping norm per
    partition and stage, so a pipeline and a data-parallel layout round the norm apart (1 ulp) and,
    once it clips, the weights: measured 1.03e-4 in the loss by step 10 for pp 2 x dp 2 against
    dp 2 at clipping 1.0, bitwise equal at 0. Without it every layout must train the same bits."""
    run_dir, argv = make_run(root, name, spec, gpus=gpus, **{**RUN, **training})
    ds = json.loads((run_dir / "ds_config.json").read_text())
    (run_dir / "ds_config.json").write_text(json.dumps({**ds, "gradient_clipping": 0.0}, indent=2))
    return run_dir, argv


def trained(root, name, spec, gpus, **training):
    run_dir, argv = planned(root, name, spec, gpus, **training)
    # fp16 on CPU ranks needs oneDNN fp16 kernels, which some CI CPUs lack: they are declared present
    proc = run_torchrun(argv, env=cpu_fp16_env(True) if spec.precision == "fp16" else None)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("pp1"), "pp1", SPEC.with_(pp=1), "1x1xA100")


@pytest.fixture(scope="module")
def two_stages(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("pp2"), "pp2", SPEC, "1x2xA100")


def final_eval(run_dir) -> float:
    return json.loads((run_dir / "output" / "final.json").read_text())["eval_loss"]


def test_two_stages_train_the_curve_of_one_rank_and_export_one_hf_model(two_stages, one_rank):
    # measured bitwise on the CPU: the stages run the model's own modules in the same order
    got = curve(two_stages)
    assert sorted(got) == STEPS
    assert_same_curve(got, curve(one_rank))
    assert got[12] < got[1]
    final = two_stages / "output" / "final"
    assert_pipeline_export(final, 2)  # one model, a shard from each stage
    pp2 = transformers.AutoModelForCausalLM.from_pretrained(str(final), dtype=torch.bfloat16).state_dict()
    pp1 = transformers.AutoModelForCausalLM.from_pretrained(
        str(one_rank / "output" / "final"), dtype=torch.bfloat16
    ).state_dict()
    assert pp2.keys() == pp1.keys()
    assert all(torch.equal(pp2[k], pp1[k]) for k in pp1), [k for k in pp1 if not torch.equal(pp2[k], pp1[k])]
    assert reload_loss(two_stages, SPEC) == pytest.approx(final_eval(two_stages), rel=1e-3, abs=1e-3)
    assert final_eval(two_stages) == final_eval(one_rank)


def test_two_stages_times_two_data_parallel_ranks_train_the_curve_of_two_data_parallel_ranks(tmp_path):
    # 4 ranks pipe-major: stage 0 on ranks 0-1, stage 1 on ranks 2-3; global batch 16 on both sides
    # both hold out the same records and evaluate them: the pipeline's last stage and the data-parallel
    # engine must give the same loss per labelled token over the whole evaluation set
    held = {"eval_split": 0.1, "eval_every": 6}
    pp2dp2 = trained(tmp_path / "a", "pp2dp2", SPEC, "1x4xA100", **held)
    dp2 = trained(tmp_path / "b", "dp2", SPEC.with_(pp=1), "1x2xA100", **held)
    got = curve(pp2dp2)
    assert sorted(got) == STEPS
    assert_same_curve(got, curve(dp2))
    assert final_eval(pp2dp2) == final_eval(dp2)
    evals = [[(e["step"], e["eval_loss"], e["eval_tokens"]) for e in events(r) if e["event"] == "eval"] for r in (pp2dp2, dp2)]
    assert [(s, t) for s, _, t in evals[0]] == [(s, t) for s, _, t in evals[1]] and [s for s, _, _ in evals[0]] == [6, 12]
    assert [x for _, x, _ in evals[0]] == pytest.approx([x for _, x, _ in evals[1]], rel=1e-5)


def test_two_stages_with_the_optimizer_offloaded_to_the_cpu_train_the_same_curve(tmp_path, two_stages):
    # ZeRO-1 + optimizer offload under the pipeline engine (DeepSpeedCPUAdam steps each stage's
    # partition on the host): the planner's choice for llama-3.1-70b on 4x8xA100-80GB at 3 GB/s
    offloaded = trained(tmp_path, "offload", SPEC.with_(offload_optimizer="cpu"), "1x2xA100")
    assert_same_curve(curve(offloaded), curve(two_stages))
    assert_same_weights(offloaded, two_stages)


def test_lora_inside_two_stages_trains_and_exports_one_peft_adapter(tmp_path):
    spec = SPEC.with_(method="lora", lora_r=8)
    run_dir = trained(tmp_path, "lora", spec, "1x2xA100", lr=5e-3)
    got = curve(run_dir)
    assert sorted(got) == STEPS and got[12] < got[1]
    final = run_dir / "output" / "final"
    assert (final / "adapter_model.safetensors").is_file()
    assert not list(final.glob("model*.safetensors*"))  # the adapter alone
    assert reload_loss(run_dir, spec) == pytest.approx(final_eval(run_dir), rel=1e-3, abs=1e-3)


def test_qlora_inside_two_stages_trains_the_curve_of_one_rank_and_exports_one_peft_adapter(tmp_path):
    # each stage quantises only its own blocks' linears, from the same bf16 values a whole model
    # quantises: the 4-bit weights, and so the curve, are those of one rank
    spec = SPEC.with_(method="qlora", lora_r=8)
    run_dir = trained(tmp_path / "a", "qlora-pp2", spec, "1x2xA100", lr=5e-3)
    one = trained(tmp_path / "b", "qlora-pp1", spec.with_(pp=1), "1x1xA100", lr=5e-3)
    got = curve(run_dir)
    assert sorted(got) == STEPS and got[12] < got[1]
    assert_same_curve(got, curve(one))
    assert {"event": "quantized", "format": "nf4", "layers": 7} in events(run_dir)  # stage 0: 1 block
    final = run_dir / "output" / "final"
    assert (final / "adapter_model.safetensors").is_file()
    assert not list(final.glob("model*.safetensors*"))  # the adapter alone
    assert reload_loss(run_dir, spec) == pytest.approx(final_eval(run_dir), rel=1e-3, abs=1e-3)


def test_sigkill_of_the_last_stage_restarts_and_resumes_with_the_same_curve(
    tmp_path, monkeypatch, two_stages
):
    run_dir, _ = planned(tmp_path, "killed", SPEC, max_restarts=1)
    submit_with_cpu_env(run_dir, monkeypatch)
    wait_for(lambda: started_steps(run_dir) >= 6, 240, "step 6")
    os.kill(int((run_dir / "logs" / "pids" / "rank-1").read_text()), signal.SIGKILL)
    st = wait_done(run_dir)
    assert st["state"] == "SUCCEEDED", (run_dir / "logs" / "launcher.log").read_text()[-3000:]
    assert [e["step"] for e in events(run_dir) if e["event"] == "resumed"] in ([4], [8])
    got = curve(run_dir)
    assert sorted(got) == STEPS
    assert_same_curve(got, curve(two_stages))  # bitwise, as without pipelining
    assert_same_weights(run_dir, two_stages)


def test_four_stages_of_a_four_layer_llama_train_the_curve_of_one_rank(tmp_path):
    from launcher.models.catalog import CATALOG

    config = tmp_path / "config.json"
    config.write_text(json.dumps({**CATALOG["tiny-llama"], "num_hidden_layers": 4}))
    runs = {}
    for name, spec, gpus in (("pp4", SPEC.with_(pp=4), "1x4xA100"), ("pp1", SPEC.with_(pp=1), "1x1xA100")):
        runs[name] = trained(tmp_path, name, spec, gpus, model=str(config))
    plan = json.loads((runs["pp4"] / "plan.json").read_text())["plan"]
    assert [s["blocks"] for s in plan["pipeline_stages"]] == [[0, 0], [1, 1], [2, 2], [3, 3]]
    got = curve(runs["pp4"])
    assert sorted(got) == STEPS
    assert_same_curve(got, curve(runs["pp1"]))
    assert final_eval(runs["pp4"]) == final_eval(runs["pp1"])


def test_two_stages_read_only_their_own_tensors_of_a_pretrained_checkpoint_and_train_its_curve(tmp_path):
    # each rank reads its stage's tensors by name from the safetensors (launcher/train/weights.py):
    # the same weights, so the same curve as one rank that loads the whole checkpoint
    from launcher.models.catalog import CATALOG
    from launcher.train.model import build_model

    ckpt = tmp_path / "pretrained"
    hf = {**CATALOG["tiny-llama"], "num_hidden_layers": 4}
    build_model(hf, "", SPEC.with_(pp=1), "random", 11, 0.0).save_pretrained(str(ckpt))
    runs = {}
    for name, spec, gpus in (("pp2", SPEC, "1x2xA100"), ("pp1", SPEC.with_(pp=1), "1x1xA100")):
        runs[name] = trained(tmp_path, name, spec, gpus, model=str(ckpt), init="pretrained")
    got = curve(runs["pp2"])
    assert sorted(got) == STEPS
    assert_same_curve(got, curve(runs["pp1"]))
    assert_pipeline_export(runs["pp2"] / "output" / "final", 2)
    assert final_eval(runs["pp2"]) == final_eval(runs["pp1"])


def tiny_family(tmp_path, family: str):
    """A 4-block model of the family as a config.json (tests/test_pipeline_stages.py's tiny
    configs, dropout off, the demo tokenizer's 512-token vocabulary)."""
    from tests.test_pipeline_stages import tiny_config

    layers = {"n_layer": 4} if family in ("gpt2", "bloom") else {"num_hidden_layers": 4}
    config = tmp_path / f"{family}.json"
    config.write_text(json.dumps(tiny_config(family, **layers, vocab_size=512)))
    return str(config)


@pytest.mark.parametrize("family", ["gpt2", "bloom"])
def test_tied_head_families_train_on_two_stages_and_export_one_model(tmp_path, family):
    # GPT-2 (learned positions) and BLOOM (ALiBi, embedding LayerNorm), both with the LM head tied
    # to the embeddings: DeepSpeed holds the matrix on the first and the last stage and sums its two
    # gradients, where one rank accumulates them in one tensor, so the curves agree to rounding
    model = tiny_family(tmp_path, family)
    runs = {
        name: trained(tmp_path, name, spec, gpus, model=model)
        for name, spec, gpus in (("pp2", SPEC, "1x2xA100"), ("pp1", SPEC.with_(pp=1), "1x1xA100"))
    }
    got, want = curve(runs["pp2"]), curve(runs["pp1"])
    assert sorted(got) == STEPS and got[12] < got[1] - 0.1
    assert [got[s] for s in STEPS] == pytest.approx([want[s] for s in STEPS], rel=2e-3)
    final = runs["pp2"] / "output" / "final"
    assert_pipeline_export(final, 2)
    index = json.loads((final / "model.safetensors.index.json").read_text())["weight_map"]
    embedding = {"gpt2": "transformer.wte.weight", "bloom": "transformer.word_embeddings.weight"}[family]
    assert index[embedding] == "model-00001-of-00002.safetensors" and "lm_head.weight" not in index
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(final), dtype=torch.bfloat16)
    assert reloaded.lm_head.weight is reloaded.get_input_embeddings().weight  # tied again
    assert reload_loss(runs["pp2"], SPEC) == pytest.approx(final_eval(runs["pp2"]), rel=1e-3, abs=1e-3)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_two_stages_train_the_curve_of_one_rank_in_fp32_and_fp16(tmp_path, precision):
    # bf16 is the rest of this file; fp16 runs DeepSpeed's loss-scaled optimizer under the
    # pipeline engine as under the data-parallel one
    spec = SPEC.with_(precision=precision)
    runs = {
        name: trained(tmp_path, name, s, gpus)
        for name, s, gpus in (("pp2", spec, "1x2xA100"), ("pp1", spec.with_(pp=1), "1x1xA100"))
    }
    got = curve(runs["pp2"])
    assert sorted(got) == STEPS and got[12] < got[1]
    assert_same_curve(got, curve(runs["pp1"]))
    assert final_eval(runs["pp2"]) == final_eval(runs["pp1"])


def test_fp16_on_a_cpu_without_fp16_kernels_is_one_line_before_any_step(tmp_path):
    # DeepSpeed's engine raises in every rank with a traceback; the worker says it once, exit 2
    _, argv = planned(tmp_path, "fp16", SPEC.with_(precision="fp16"))
    proc = run_torchrun(argv, env=cpu_fp16_env(False))
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if "ftlaunch worker: error:" in line]
    assert (
        lines and "--precision fp16 on CPU ranks" in lines[0] and "use --precision bf16 or fp32" in lines[0]
    )
    assert "Type fp16 is not supported" not in proc.stderr  # DeepSpeed's engine never started
    assert "exitcode  : 2" in proc.stderr
