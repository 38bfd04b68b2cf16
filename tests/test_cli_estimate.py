"""`ftlaunch estimate` end to end through the real entry point: output shape and bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launcher.cli import main

BASE = ["estimate", "--model", "llama-3.1-8b", "--gpus", "8xA100"]


def run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_has_the_documented_fields(capsys):
    code, out, _ = run(BASE + ["--zero-stage", "3", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    per_gpu = data["per_gpu"]
    for key in ("peak_allocated_gib", "peak_reserved_gib", "components"):
        assert key in per_gpu
    assert {"weights", "gradients", "optimizer_states", "activations", "logits_loss"} <= set(
        per_gpu["components"]
    )
    assert isinstance(data["fits"], bool)
    assert data["host_per_node_gib"] > 0
    assert data["nvme_gib"] == 0
    assert per_gpu["peak_reserved_gib"] > per_gpu["peak_allocated_gib"]
    # the allocated components add up to peak allocated
    comps = per_gpu["components"]
    allocated = sum(v for k, v in comps.items() if k not in ("allocator_margin", "cuda_context_nccl"))
    assert allocated == pytest.approx(per_gpu["peak_allocated_gib"], abs=0.01)


def test_human_output_has_table_chart_and_verdict(capsys):
    code, out, _ = run(BASE + ["--method", "lora", "--micro-batch", "2"], capsys)
    assert code == 0
    assert "activations" in out and "█" in out
    assert "peak allocated" in out and "peak reserved" in out
    assert "FITS" in out
    assert "A100 taken as A100-80GB" in out  # the ambiguous name says what it resolved to


def test_nvme_offload_reports_nvme_and_host(capsys):
    argv = [
        "estimate",
        "--model",
        "bloom-176b",
        "--gpus",
        "8xA100",
        "--zero-stage",
        "3",
        "--offload-optimizer",
        "nvme",
        "--offload-params",
        "nvme",
        "--grad-ckpt",
        "full",
        "--json",
    ]
    code, out, _ = run(argv, capsys)
    data = json.loads(out)
    assert code == 0 and data["fits"]
    # 176B params x 14 bytes (fp32 master + Adam) + 2 bytes (16-bit params) on NVMe
    assert data["nvme_gib"] == pytest.approx(176.25e9 * 14 / 2**30, rel=0.01)
    assert data["per_gpu"]["components"]["weights"] == 0


def test_global_batch_sets_accumulation(capsys):
    code, out, _ = run(BASE + ["--micro-batch", "2", "--global-batch", "64", "--json"], capsys)
    assert code == 0 and json.loads(out)["spec"]["grad_accum"] == 4


def test_bigger_gpu_fits_what_smaller_does_not(capsys):
    _, small, _ = run(["estimate", "--model", "llama-3.1-8b", "--gpus", "1xA100-40GB", "--json"], capsys)
    _, big, _ = run(
        ["estimate", "--model", "llama-3.1-8b", "--gpus", "1xH200", "--method", "lora", "--json"], capsys
    )
    assert json.loads(small)["fits"] is False
    assert json.loads(big)["fits"] is True


BAD = [
    (["--model", "lama-3.1-8b"], "did you mean"),
    (["--model", "no/such-model"], "config.json"),
    (["--gpus", "8xA1000"], "did you mean"),
    (["--gpus", "0xA100"], "at least 1"),
    (["--gpus", "-1xA100"], ""),
    (["--gpus", "axA100"], ""),
    (["--gpus", ""], ""),
    (["--gpus", "8xA100", "--micro-batch", "-1"], "positive"),
    (["--micro-batch", "0"], "positive"),
    (["--seq-len", "abc"], "positive"),
    (["--seq-len", "1e3"], "positive"),
    (["--seq-len", "99999999999"], "implausibly large"),
    (["--gpu-memory", "-5"], "positive"),
    (["--gpu-memory", "nan"], "positive"),
    (["--gpu-memory", "inf"], "positive"),
    (["--nvme", "-1"], ">= 0"),
    (["--tp", "3"], "does not divide"),
    (["--tp", "16"], "tensor parallelism stays inside a node"),
    (["--gpus", "2x8xA100", "--tp", "2", "--pp", "2", "--method", "qlora"], "4-bit weights cannot be cut"),
    (["--model", "falcon-40b", "--gpus", "2x8xA100", "--tp", "2", "--pp", "2"], "no tensor-parallel layers inside"),
    (["--method", "lora", "--tp", "2"], "LoRA's own adapter layers"),
    (["--zero-stage", "3", "--tp", "2"], "ZeRO-0/1/2 only"),
    (["--pp", "64"], "larger than the model"),
    (["--pp", "2", "--zero-stage", "3"], "ZeRO-0/1"),
    (["--lora-r", "8"], "--method lora"),
    (["--lora-targets", "q_proj"], "--method lora"),
    (["--quant", "nf4"], "--method lora or qlora"),
    (["--method", "lora", "--quant", "nf4"], "qlora"),
    (["--method", "lora", "--lora-targets", "nope"], "matches no linear"),
    (["--method", "lora", "--lora-targets", ","], "empty"),
    (["--method", "dpo"], "invalid choice"),
    (["--zero-stage", "5"], "0, 1, 2 or 3"),
    (["--offload-params", "cpu"], "ZeRO-3"),
    (["--offload-optimizer", "cpu"], "--zero-stage 1, 2 or 3"),
    (["--offload-optimizer", "nvme", "--zero-stage", "2"], "ZeRO-Infinity"),
    (["--global-batch", "7"], "multiple"),
    (["--global-batch", "64", "--grad-accum", "3"], "drop one"),
    (["--precision", "int4"], "invalid choice"),
    (["--model", "llama-3.1-8b; rm -rf /"], "unknown model"),
    (["--model", "../../../../etc/passwd"], ""),
    (["--gpus", "8xA100$(reboot)"], ""),
    (["--model", "ллама"], "unknown model"),
]


@pytest.mark.parametrize("extra,needle", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_input_is_one_line_exit_2(extra, needle, capsys):
    argv = list(BASE)
    for flag in ("--model", "--gpus"):
        if flag in extra:
            i = argv.index(flag)
            del argv[i : i + 2]
    code, _, err = run(argv + extra, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ftlaunch: error:")
    assert "Traceback" not in err
    assert needle in lines[0]


def test_argparse_errors_also_exit_2_in_one_line(capsys):
    assert main(["estimate", "--gpus", "8xA100"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_help_teaches_with_examples(capsys):
    assert main(["estimate", "--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "--offload-optimizer" in out


def test_debug_shows_the_traceback(capsys):
    from launcher.errors import FtlaunchError

    with pytest.raises(FtlaunchError):
        main(BASE + ["--tp", "3", "--debug"])


def test_console_script_and_no_heavy_imports():
    """The installed entry point runs, and planning imports neither torch nor transformers."""
    code = (
        "import sys, runpy; sys.argv = ['ftlaunch'] + sys.argv[1:];"
        "from launcher.cli import main; rc = main();"
        "heavy = [m for m in ('torch', 'transformers', 'deepspeed') if m in sys.modules];"
        "print('HEAVY', heavy); sys.exit(rc)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "estimate", "--model", "bloom-176b", "--gpus", "8xA100", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout
