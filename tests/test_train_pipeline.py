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
from tests.runs import assert_same_curve, assert_same_weights, make_run, run_torchrun
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


def trained(root, name, spec, gpus):
    run_dir, argv = make_run(root, name, spec, gpus=gpus, **RUN)
    proc = run_torchrun(argv)
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
    assert (final / "model.safetensors").is_file()  # one model gathered from both stages
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
    pp2dp2 = trained(tmp_path / "a", "pp2dp2", SPEC, "1x4xA100")
    dp2 = trained(tmp_path / "b", "dp2", SPEC.with_(pp=1), "1x2xA100")
    got = curve(pp2dp2)
    assert sorted(got) == STEPS
    assert_same_curve(got, curve(dp2))
    assert final_eval(pp2dp2) == final_eval(dp2)


def test_lora_inside_two_stages_trains_and_exports_one_peft_adapter(tmp_path):
    spec = SPEC.with_(method="lora", lora_r=8)
    run_dir, argv = make_run(tmp_path, "lora", spec, gpus="1x2xA100", **{**RUN, "lr": 5e-3})
    proc = run_torchrun(argv)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = curve(run_dir)
    assert sorted(got) == STEPS and got[12] < got[1]
    final = run_dir / "output" / "final"
    assert (final / "adapter_model.safetensors").is_file() and not (final / "model.safetensors").exists()
    assert reload_loss(run_dir, spec) == pytest.approx(final_eval(run_dir), rel=1e-3, abs=1e-3)


def test_sigkill_of_the_last_stage_restarts_and_resumes_with_the_same_curve(tmp_path, monkeypatch, two_stages):
    run_dir, _ = make_run(tmp_path, "killed", SPEC, gpus="1x2xA100", max_restarts=1, **RUN)
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
        run_dir, argv = make_run(tmp_path, name, spec, model=str(config), gpus=gpus, **RUN)
        proc = run_torchrun(argv)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[name] = run_dir
    plan = json.loads((runs["pp4"] / "plan.json").read_text())["plan"]
    assert [s["blocks"] for s in plan["pipeline_stages"]] == [[0, 0], [1, 1], [2, 2], [3, 3]]
    got = curve(runs["pp4"])
    assert sorted(got) == STEPS
    assert_same_curve(got, curve(runs["pp1"]))
    assert final_eval(runs["pp4"]) == final_eval(runs["pp1"])
