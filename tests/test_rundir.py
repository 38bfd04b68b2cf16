"""The run directory: golden files for a few plans, and every way a run directory or its inputs
can be wrong gets one line and exit 2 before any rank starts.

Regenerate the golden files on purpose (then review the diff):
    FTLAUNCH_REGEN_GOLDEN=1 python -m pytest tests/test_rundir.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from launcher.cli import main
from launcher.rundir import read_run_dir

GOLDEN = Path(__file__).parent / "golden"
CASES = {
    "bloom-176b-8xA100": ["--model", "bloom-176b", "--gpus", "8xA100"],
    "llama-3.1-8b-lora-8xH100": [
        "--model",
        "llama-3.1-8b",
        "--gpus",
        "8xH100",
        "--method",
        "lora",
        "--seq-len",
        "4096",
    ],
    "llama-3.1-8b-pp2": ["--model", "llama-3.1-8b", "--gpus", "8xH100", "--pp", "2", "--zero-stage", "1"],
    "tiny-llama-cpu": [
        "--model",
        "tiny-llama",
        "--gpus",
        "1x2xA100",
        "--cpu",
        "--init",
        "random",
        "--zero-stage",
        "3",
    ],
}
FILES = (
    "plan.json",
    "ds_config.json",
    "accelerate_config.yaml",
    "launch.sh",
    "explain.txt",
    "device_map.json",
    "device_map_stages.json",
    "ds_config_hf.json",
    "hf_args.txt",
)


def normalise(text: str, run_dir: Path) -> str:
    return text.replace(str(run_dir), "<RUN_DIR>").replace(sys.executable, "<PYTHON>")


def write(tmp_path: Path, name: str, argv: list[str], capsys) -> Path:
    code = main([*argv, "--dry-run", "--name", name, "--runs-dir", str(tmp_path)])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "launch command: bash" in out.out
    return tmp_path / name


@pytest.mark.parametrize("name", list(CASES))
def test_golden_run_dirs(name, tmp_path, capsys):
    run_dir = write(tmp_path, name, CASES[name], capsys)
    golden = GOLDEN / name
    regen = os.environ.get("FTLAUNCH_REGEN_GOLDEN") == "1"
    produced = {f: normalise((run_dir / f).read_text(), run_dir) for f in FILES if (run_dir / f).exists()}
    if regen:
        golden.mkdir(parents=True, exist_ok=True)
        for f in FILES:
            (golden / f).unlink(missing_ok=True)
        for f, text in produced.items():
            (golden / f).write_text(text)
    expected = {f.name: f.read_text() for f in golden.iterdir()}
    assert sorted(produced) == sorted(expected)
    for f, text in produced.items():
        assert text == expected[f], (
            f"{name}/{f} differs from tests/golden (regenerate on purpose if intended)"
        )


def test_run_dir_is_consistent(tmp_path, capsys):
    run_dir = write(tmp_path, "consistent", CASES["llama-3.1-8b-lora-8xH100"], capsys)
    run = read_run_dir(run_dir)
    ds = json.loads((run_dir / "ds_config.json").read_text())
    spec = run.spec
    assert (
        ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * run.dp == run.global_batch
    )
    assert ds["zero_optimization"]["stage"] == spec["zero_stage"]
    assert run.plan["memory"]["fits"] is True
    assert os.access(run_dir / "launch.sh", os.X_OK)
    assert "launcher.train" in (run_dir / "launch.sh").read_text()


def bad(argv: list[str], capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("ftlaunch: error:"), err
    return err[0]


TINY = ["--model", "tiny-llama", "--gpus", "1x2xA100", "--cpu", "--init", "random", "--zero-stage", "2"]


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--name", "../escape"], "run name"),
        (["--name", "a b"], "run name"),
        (["--name", "$(reboot)"], "run name"),
        (["--data", "/nonexistent/train.jsonl"], "does not exist"),
        (["--init", "pretrained"], "offline"),
        (["--merge-adapter"], "--merge-adapter merges a LoRA / QLoRA adapter"),
    ],
)
def test_bad_launches_fail_before_any_rank_starts(extra, needle, tmp_path, capsys):
    msg = bad([*TINY, "--runs-dir", str(tmp_path), "--detach", *extra], capsys)
    assert needle in msg
    for run_dir in tmp_path.iterdir():
        assert not (run_dir / "job.json").exists()  # nothing was started
    assert not (tmp_path.parent / "escape").exists()


def test_data_with_no_usable_field(tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"question": "q", "answer": "a"}\n')
    msg = bad([*TINY, "--runs-dir", str(tmp_path), "--detach", "--data", str(data)], capsys)
    assert "bad.jsonl line 1: a record with ['answer', 'question'], which fits no format" in msg
    assert "--skip-bad-records" in msg
    extra = ["--name", "skipping", "--skip-bad-records"]
    msg = bad([*TINY, "--runs-dir", str(tmp_path), "--detach", "--data", str(data), *extra], capsys)
    assert "no usable records" in msg and "1 skipped" in msg


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda d: d.update(schema_version=0), "schema version"),
        (lambda d: d.update(extra_key=1), "extra_key"),
        (lambda d: d.pop("training"), "training"),
        (lambda d: d["training"].update(max_steps=-3), "max_steps"),
    ],
)
def test_run_dirs_of_other_versions_or_edited_badly(mutate, needle, tmp_path, capsys):
    run_dir = write(tmp_path, "edited", TINY, capsys)
    data = json.loads((run_dir / "plan.json").read_text())
    mutate(data)
    (run_dir / "plan.json").write_text(json.dumps(data))
    assert needle in bad(["launch", str(run_dir), "--detach"], capsys)


def test_truncated_plan_json(tmp_path, capsys):
    run_dir = write(tmp_path, "truncated", TINY, capsys)
    text = (run_dir / "plan.json").read_text()
    (run_dir / "plan.json").write_text(text[: len(text) // 2])
    assert "not valid JSON" in bad(["launch", str(run_dir), "--detach"], capsys)


def test_no_gpu_without_cpu_flag_is_a_clear_error(tmp_path, capsys):
    pytest.importorskip("torch")
    argv = ["--model", "tiny-llama", "--gpus", "1x2xA100", "--init", "random", "--runs-dir", str(tmp_path)]
    if __import__("torch").cuda.device_count() >= 2:
        pytest.skip("this machine has GPUs")
    assert "--cpu" in bad(argv, capsys)


def test_bad_shard_size_is_one_line(tmp_path, capsys):
    msg = bad([*TINY, "--dry-run", "--runs-dir", str(tmp_path), "--max-shard-size", "5 GB"], capsys)
    assert "--max-shard-size" in msg and "5GB" in msg
    assert not any(tmp_path.iterdir())
