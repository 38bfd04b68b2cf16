"""A sweep of malformed and hostile inputs across every command and the files ftlaunch reads.

Every case must end with exit code 2 and ONE line starting `ftlaunch: error:` on stderr, no
traceback, and nothing written outside the directory the test gave it.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from pathlib import Path

import pytest

from launcher.cli import main

HOSTILE = [
    "",
    " ",
    "-1",
    "0",
    "1e999",
    "nan",
    "inf",
    "-inf",
    "0x10",
    "1.5",
    "99999999999999999999",
    "abc",
    "ünïcödé",
    "模型",
    "$(reboot)",
    "`id`",
    "; rm -rf /",
    "a|b",
    "a&&b",
    "../../etc/passwd",
    "/etc/passwd",
    "\x00",
    "a" * 5000,
    "💥",
    "{'a': 1}",
]

INT_FLAGS = [
    "--micro-batch",
    "--seq-len",
    "--grad-accum",
    "--global-batch",
    "--tp",
    "--pp",
    "--lora-r",
    "--lora-alpha",
]
FLOAT_FLAGS = ["--gpu-memory", "--cpu-memory", "--inter-node-bandwidth"]
CHOICE_FLAGS = ["--method", "--precision", "--optimizer", "--grad-ckpt", "--attention", "--offload-optimizer"]
BASE = ["--model", "llama-3.1-8b", "--gpus", "8xA100"]


def is_valid_int(v: str) -> bool:
    try:
        return int(v, 10) >= 1
    except ValueError:
        return False


def is_valid_float(v: str) -> bool:
    try:
        f = float(v)
    except ValueError:
        return False
    return f > 0 and f == f and f not in (float("inf"),)


def cases():
    out = []
    for command in ("estimate", "plan"):
        for flag, value in itertools.product(INT_FLAGS, HOSTILE):
            if not is_valid_int(value):
                out.append((command, [*BASE, flag, value]))
        for flag, value in itertools.product(FLOAT_FLAGS, HOSTILE):
            if not is_valid_float(value):
                out.append((command, [*BASE, flag, value]))
        for flag, value in itertools.product(CHOICE_FLAGS, HOSTILE[:12]):
            out.append((command, [*BASE, flag, value]))
        for value in HOSTILE:
            out.append((command, ["--model", value, "--gpus", "8xA100"]))
            out.append((command, ["--model", "llama-3.1-8b", "--gpus", value]))
    for value in HOSTILE:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$", value):  # others are fine run names
            out.append(("run", [*BASE, "--dry-run", "--name", value]))
    for command in ("status", "logs", "cancel", "launch"):
        for value in HOSTILE:
            out.append((command, [value]))
    return out


CASES = cases()


def test_the_sweep_is_big():
    assert len(CASES) >= 200


def _one_line_exit_2(argv, capsys, cwd: Path):
    before = set(os.listdir(cwd))
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, (argv, captured.err[-500:])
    assert len(lines) == 1, (argv, captured.err[-500:])
    assert lines[0].startswith("ftlaunch: error:")
    assert "Traceback" not in captured.err
    new = set(os.listdir(cwd)) - before
    assert new <= {"runs"}, new  # at most the (empty) runs dir of --runs-dir
    return lines[0]


@pytest.mark.parametrize("command,argv", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_hostile_input(command, argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    full = argv if command == "run" and argv[0] == "--model" else [command, *argv]
    if command == "run":
        full = [*argv, "--runs-dir", str(tmp_path / "runs")]
    _one_line_exit_2(full, capsys, tmp_path)
    # nothing escaped the directory the run was given
    assert not (tmp_path.parent / "passwd").exists()


def _run_dir(tmp_path, capsys) -> Path:
    code = main(
        ["--model", "tiny-llama", "--gpus", "1x2xA100", "--cpu", "--init", "random", "--dry-run"]
        + ["--name", "r", "--runs-dir", str(tmp_path)]
    )
    capsys.readouterr()
    assert code == 0
    return tmp_path / "r"


PLAN_EDITS = {
    "empty": lambda t: "",
    "truncated": lambda t: t[: len(t) // 3],
    "array": lambda t: "[]",
    "null": lambda t: "null",
    "version-2": lambda t: json.dumps({**json.loads(t), "schema_version": 2}),
    "version-string": lambda t: json.dumps({**json.loads(t), "schema_version": "1"}),
    "dp-zero": lambda t: json.dumps({**json.loads(t), "dp": 0}),
    "lr-negative": lambda t: json.dumps(
        {**json.loads(t), "training": {**json.loads(t)["training"], "lr": -1}}
    ),
    "unknown-key": lambda t: json.dumps({**json.loads(t), "surprise": True}),
    "binary": lambda t: "\x89PNG\r\n",
}


@pytest.mark.parametrize("edit", list(PLAN_EDITS))
def test_broken_plan_json_is_refused(edit, tmp_path, capsys):
    run_dir = _run_dir(tmp_path, capsys)
    path = run_dir / "plan.json"
    path.write_text(PLAN_EDITS[edit](path.read_text()))
    msg = _one_line_exit_2(["launch", str(run_dir), "--detach"], capsys, tmp_path)
    assert "plan" in msg
    assert not (run_dir / "job.json").exists()


def test_planted_secret_never_reaches_the_run_dir(tmp_path, capsys, monkeypatch):
    secret = "hf_PLANTED_SECRET_do_not_write_7f3a"
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("WANDB_API_KEY", secret + "_wandb")
    run_dir = _run_dir(tmp_path, capsys)
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert secret not in f.read_text(errors="replace"), f


def test_a_multi_node_torchrun_launch_needs_a_rendezvous_endpoint(tmp_path, capsys):
    argv = ["--model", "tiny-llama", "--gpus", "2x2xA100", "--init", "random", "--dry-run", "--name", "two"]
    runs = ["--runs-dir", str(tmp_path / "runs")]
    line = _one_line_exit_2([*argv, *runs], capsys, tmp_path)
    assert "--rdzv-endpoint" in line and not (tmp_path / "runs" / "two").exists()
    assert main([*argv, *runs, "--rdzv-endpoint", "10.0.0.1:29400"]) == 0, capsys.readouterr().err
    assert "10.0.0.1:29400" in (tmp_path / "runs" / "two" / "launch.sh").read_text()
