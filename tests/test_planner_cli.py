"""`ftlaunch plan` end to end, in-process: output shape, the seed scenario, and user errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launcher.cli import main

SEED = ["plan", "--model", "bloom-176b", "--gpus", "8xA100"]


def run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def run_json(argv, capsys):
    code, out, err = run([*argv, "--json"], capsys)
    return code, json.loads(out), err


def test_json_shape(capsys):
    code, data, _ = run_json(
        ["plan", "--model", "llama-3.1-8b", "--gpus", "2x8xA100", "--method", "lora"], capsys
    )
    assert code == 0
    assert set(data) >= {
        "model",
        "cluster",
        "request",
        "search",
        "fits",
        "plans",
        "rejected",
        "suggestions",
        "why",
    }
    assert data["fits"] is True and data["request"]["global_batch"] == 16  # LoRA's default, one per GPU
    assert data["search"]["candidates"] >= len(data["plans"]) > 1
    speeds = [p["ranking_tokens_per_s"] for p in data["plans"]]
    assert speeds == sorted(speeds, reverse=True)
    first = data["plans"][0]
    assert set(first) >= {"family", "spec", "tp", "pp", "dp", "global_batch", "memory", "perf", "budget_gib"}
    assert set(first["perf"]) == {"tokens_per_s", "step_time_s", "mfu", "breakdown_s"}
    assert set(first["memory"]["per_gpu"]["components"]) >= {"weights", "activations", "optimizer_states"}
    assert first["memory"]["per_gpu"]["total_gib"] <= first["budget_gib"]
    assert first["dp"] * first["tp"] * first["pp"] == 16
    assert data["cost"]["cost_per_million_tokens_usd"] > 0


def test_seed_scenario_full_fine_tuning(capsys):
    code, data, _ = run_json(SEED, capsys)
    assert code == 0
    best = data["plans"][0]
    # 176B params of full fine-tuning need ~2.8 TB of states: only ZeRO-3 with NVMe offload fits one node
    assert best["spec"]["zero_stage"] == 3 and best["spec"]["offload_optimizer"] == "nvme"
    assert best["memory"]["host_fits"] and best["memory"]["nvme_fits"]
    assert best["memory"]["host_per_node_gib"] <= 1024 and best["memory"]["nvme_gib"] > 1024
    assert best["perf"]["breakdown_s"]["offload"] > 0.2 * best["perf"]["step_time_s"]
    for plan in data["plans"]:
        assert plan["dp"] * plan["tp"] * plan["pp"] == 8
        assert plan["memory"]["per_gpu"]["total_gib"] <= plan["budget_gib"]
    families = {r["family"] for r in data["rejected"]}
    assert {"ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3"} <= families
    # and what needs more nodes: the smallest cluster without offload
    scale = data["scale_out"]
    assert scale is not None and scale["plan"]["cluster"]["nodes"] > 1
    assert scale["plan"]["spec"]["offload_optimizer"] == scale["plan"]["spec"]["offload_params"] == "none"
    assert scale["plan"]["perf"]["tokens_per_s"] > 5 * best["perf"]["tokens_per_s"]
    assert {a["flags"]["--method"] for a in data["alternatives"]} == {"lora", "qlora"}


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_seed_scenario_adapters(method, capsys):
    code, data, _ = run_json([*SEED, "--method", method], capsys)
    assert code == 0 and data["plans"]
    best = data["plans"][0]
    assert best["spec"]["method"] == method
    assert best["memory"]["params"]["trainable"] < 0.01 * best["memory"]["params"]["total"]
    assert best["spec"]["tp"] == 1  # AutoTP splits neither 4-bit weights nor LoRA's adapters


def test_human_output_has_table_breakdown_why_and_rejections(capsys):
    code, out, _ = run([*SEED, "--top", "3"], capsys)
    assert code == 0
    for text in (
        "searched",
        "chosen:",
        "per GPU, peak at",
        "time per optimizer step",
        "why this plan",
        "rejected",
    ):
        assert text in out
    assert "ZeRO-0:" in out and "budget" in out
    assert "more GPUs" in out and "--method lora" in out
    table_rows = [line for line in out.splitlines() if line[:2] in ("1 ", "2 ", "3 ", "4 ")]
    assert [r[0] for r in table_rows] == ["1", "2", "3"]


def test_nothing_fits_prints_analysis_and_suggestions_and_exits_2(capsys):
    code, out, err = run(["plan", "--model", "bloom-176b", "--gpus", "1xA100"], capsys)
    assert code == 2
    assert "nothing fits" in out and "what would fit" in out and "--gpus" in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[-1].startswith("ftlaunch: error: no plan fits bloom-176b")


def test_nothing_fits_json_still_prints_and_exits_2(capsys):
    code, data, err = run_json(["plan", "--model", "bloom-176b", "--gpus", "1xA100"], capsys)
    assert code == 2 and data["fits"] is False and data["plans"] == []
    assert data["suggestions"] and data["rejected"]
    assert err.strip().startswith("ftlaunch: error:")


def test_ablation_rows(capsys):
    code, data, _ = run_json(["plan", "--model", "llama-3.1-8b", "--gpus", "8xA100", "--ablate"], capsys)
    assert code == 0 and len(data["ablation"]) == 12
    assert data["ablation"][0]["technique"].startswith("baseline")
    code, out, _ = run(["plan", "--model", "llama-3.1-8b", "--gpus", "8xA100", "--ablate"], capsys)
    assert "what each technique buys" in out and "+ QLoRA" in out and "+ chunked loss" in out


def test_price_and_tokens_give_the_run_cost(capsys):
    argv = ["plan", "--model", "llama-3.2-1b", "--gpus", "4xH100", "--tokens", "2B", "--price", "H100=2"]
    code, data, _ = run_json(argv, capsys)
    assert code == 0
    cost, tps = data["cost"], data["plans"][0]["perf"]["tokens_per_s"]
    assert cost["price_per_gpu_hour_usd"] == 2 and cost["run_tokens"] == 2e9
    assert cost["run_hours"] == pytest.approx(2e9 / tps / 3600, rel=1e-3)
    assert cost["run_cost_usd"] == pytest.approx(cost["run_hours"] * 4 * 2, rel=1e-3)


def test_pinned_flags_pin_the_search(capsys):
    argv = ["plan", "--model", "llama-3.1-8b", "--gpus", "8xA100", "--zero-stage", "1", "--tp", "2"]
    code, data, _ = run_json([*argv, "--global-batch", "64"], capsys)
    assert code == 0
    assert {(p["spec"]["zero_stage"], p["tp"], p["global_batch"]) for p in data["plans"]} == {(1, 2, 64)}
    assert data["request"]["pinned"] == {"zero_stage": 1, "tp": 2}


def test_the_chunked_loss_is_chosen_where_it_lets_a_faster_plan_fit_and_says_so(capsys):
    """Llama-3.1-8B LoRA on one RTX 4090 at 4096 tokens: the whole loss's 5.9 GiB working set
    leaves only parameter offload; chunked, ZeRO-0 fits, and the plan says why."""
    argv = ["plan", "--model", "llama-3.1-8b", "--gpus", "1xRTX4090", "--method", "lora", "--seq-len", "4096"]
    code, data, _ = run_json(argv, capsys)
    best = data["plans"][0]
    assert code == 0 and best["spec"]["loss"] == "chunked" and best["spec"]["offload_params"] == "none"
    assert data["why"][0].startswith("chunked loss (1024 tokens at a time)") and "with the whole loss" in data["why"][0]
    code, whole, _ = run_json([*argv, "--loss", "full"], capsys)
    assert code == 0 and whole["plans"][0]["spec"]["offload_params"] == "cpu"
    assert whole["plans"][0]["perf"]["tokens_per_s"] < best["perf"]["tokens_per_s"]
    assert whole["request"]["pinned"] == {"loss": "full"}
    # at 2048 tokens micro-batch 1 fits with the whole loss, and chunking would only add a head forward
    code, short, _ = run_json([*argv[:-2], "--seq-len", "2048"], capsys)
    assert code == 0 and short["plans"][0]["spec"]["loss"] == "full"


def test_the_optimizer_steps_in_backward_where_that_is_what_fits_and_says_so(capsys):
    """torchtune's Llama-3.1-8B full fine-tune on one RTX 4090 (bf16-pure, paged 8-bit AdamW, 2
    sequences per step): stepped after the backward its 15 GiB of gradients leave only parameter
    offload; stepped inside it, ZeRO-0 fits, faster, and the plan says why. With an fp32 master copy
    (bf16) it is not a choice, and nothing in backward is offered where accumulation is needed."""
    argv = ["plan", "--model", "llama-3.1-8b", "--gpus", "1xRTX4090", "--precision", "bf16-pure",
            "--optimizer", "paged-adamw-8bit", "--global-batch", "2"]
    code, data, _ = run_json(argv, capsys)
    best = data["plans"][0]
    assert code == 0 and best["spec"]["optimizer_step"] == "in-backward" and best["spec"]["zero_stage"] == 0
    assert best["spec"]["grad_accum"] == 1 and best["spec"]["offload_params"] == "none"
    line = next(w for w in data["why"] if w.startswith("optimizer in backward"))
    assert "stepped after the backward this plan needs" in line and "no gradient clipping" in line
    code, usual, _ = run_json([*argv, "--optimizer-step", "after-backward"], capsys)
    assert code == 0 and usual["plans"][0]["spec"]["offload_params"] == "cpu"
    assert usual["plans"][0]["perf"]["tokens_per_s"] < best["perf"]["tokens_per_s"]
    code, mixed, _ = run_json([*argv[:5], "--global-batch", "2"], capsys)
    assert code == 0 and all(p["spec"]["optimizer_step"] == "after-backward" for p in mixed["plans"])
    code, accum, _ = run_json([*argv[:-1], "64"], capsys)
    assert code == 0 and all(
        p["spec"]["optimizer_step"] == "after-backward" or p["spec"]["grad_accum"] == 1 for p in accum["plans"]
    )


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--margin", "1.5"], "--margin"),
        (["--tp", "3"], "--tp 3"),
        (["--tp", "16"], "--tp 16"),
        (["--pp", "71"], "--pp 71"),
        (["--zero-stage", "5"], "--zero-stage"),
        (["--tp", "1", "--pp", "1", "--grad-accum", "1", "--global-batch", "12"], "--global-batch 12"),
        (["--gpus", "2x8xA100", "--tp", "2", "--pp", "2", "--method", "qlora"], "4-bit weights cannot be cut"),
        (["--pp", "2", "--offload-params", "cpu"], "--pp 2"),
        (["--pp", "2", "--zero-stage", "0"], "pipeline plans with ZeRO-1"),
        (["--method", "qlora", "--tp", "2"], "4-bit"),
        (["--method", "lora", "--tp", "2"], "LoRA's own adapter layers"),
        (["--lora-r", "8"], "--lora-r"),
        (["--price", "FOO=1"], "unknown GPU"),
        (["--price", "H100"], "GPU=USD"),
        (["--tokens", "lots"], "token count"),
        (["--micro-batch", "0"], "positive"),
        (["--pp", "2", "--loss", "chunked"], "--loss chunked with --pp 2"),
        (["--loss", "sliced"], "--loss"),
        (["--optimizer-step", "in-backward"], "--precision bf16-pure"),
        (["--optimizer-step", "in-backward", "--precision", "fp32", "--zero-stage", "1"], "--zero-stage 0"),
        (["--method", "lora", "--lora-targets", "lm_head", "--pp", "2"], "trained at pp 1 only"),
        (["--method", "lora", "--lora-targets", "embed"], "plus embed_tokens and lm_head"),
    ],
)
def test_bad_input_is_one_line_exit_2(extra, says, capsys):
    try:
        code = main([*SEED, *extra])
    except SystemExit as exit_:  # argparse errors
        code = exit_.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("ftlaunch: error:") and says in err[0]


def test_selection_flags_that_need_gpus(capsys):
    for extra in (["--ablate"], ["--gpu-memory", "40"]):
        code, _, err = run(["plan", "--model", "gpt2", *extra], capsys)
        assert code == 2 and "needs --gpus" in err


def test_planning_imports_no_torch():
    code = (
        "import sys; from launcher.cli import main; "
        "rc = main(['plan', '--model', 'bloom-176b', '--gpus', '8xA100', '--json']); "
        "heavy = [m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules]; "
        "sys.exit(rc or (3 if heavy else 0))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_full_70b_across_slow_links_picks_pipeline_stages_and_says_why_against_zero3(capsys):
    # issue 17's example: at 3 GB/s between nodes ZeRO-3 moves every weight over the slow link
    # three times a step; 8 stages move only activations, and each stage's data-parallel group
    # stays inside its node (pipe-major ranks), so its gradient reduction runs on NVLink
    argv = ["plan", "--model", "llama-3.1-70b", "--gpus", "4x8xA100-80GB", "--inter-node-bandwidth", "3"]
    code, data, _ = run_json(argv, capsys)
    assert code == 0
    best = data["plans"][0]
    assert best["pp"] > 1 and best["spec"]["zero_stage"] == 1
    stages = best["pipeline_stages"]
    assert len(stages) == best["pp"] and all(len(s["nodes"]) == 1 for s in stages)
    # per-stage loading: no node materialises more than its own stages' weights
    assert best["memory"]["host_fits"]
    against = [w for w in data["why"] if "best ZeRO-3 (" in w or "best ZeRO-3 + hpZ 8 (" in w]
    assert against and "zero comm" in against[0]
    zero3 = [p for p in data["plans"] if p["spec"]["zero_stage"] == 3]
    assert all(p["perf"]["tokens_per_s"] < best["perf"]["tokens_per_s"] / 2 for p in zero3)
    code, text, _ = run(argv, capsys)
    assert "pipeline stages" in text and "over the best ZeRO-3" in text
