"""`ftlaunch ... --script FILE | --module NAME [-- ARGS]`: the user's own program runs on every rank in
place of ftlaunch's worker, with the plan handed to it (placeholders, FTLAUNCH_* variables), started
and watched as the worker is (status, logs, preflight). Stock Hugging Face Trainer and TRL scripts run
the plan through {hf_args}; a plain torch DDP script and a failing module run as written."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli import main
from launcher.program import PLACEHOLDERS, ProgramError, expand

SCRIPTS = Path(__file__).parent / "user_scripts"
CPU_ACCELERATE = Path(__file__).parent / "cpu_accelerate"
TINY = ["--model", "tiny-llama", "--gpus", "1x2xA100", "--cpu", "--init", "random", "--max-restarts", "0"]


def ftlaunch(tmp_path, name, *argv, dry_run=True):
    runs = tmp_path / "runs"
    return main([*TINY, *(["--dry-run"] if dry_run else []), "--name", name, "--runs-dir", str(runs), *argv])


@pytest.fixture
def in_scripts(monkeypatch):
    """Plan from the scripts' directory, as a user does from their project."""
    monkeypatch.chdir(SCRIPTS)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_placeholders_expand_and_braces_stay_literal():
    vals = {**{k: f"<{k}>" for k in PLACEHOLDERS}, "hf_args": ["--a", "1"]}
    got = expand(["{hf_args}", "--out={output_dir}/x", "{{not_one}}", "{micro_batch}"], vals)
    assert got == ["--a", "1", "--out=<output_dir>/x", "{not_one}", "<micro_batch>"]
    with pytest.raises(ProgramError, match="unknown placeholder {nope}"):
        expand(["{nope}"], vals)
    with pytest.raises(ProgramError, match="argument of its own"):
        expand(["x{hf_args}"], vals)
    with pytest.raises(ProgramError, match="pipeline plan"):
        expand(["{hf_args}"], {**vals, "hf_args": None})


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--script", "missing.py"], "no such file"),
        (["--script", "userpkg"], "not a file"),
        (["--script", "{broken}"], "line 1"),
        (["--module", "no_such_module_here"], "no such module"),
        (["--script", "ddp.py", "--", "{out_dir}"], "unknown placeholder {out_dir}"),
        (["--script", "ddp.py", "--", "a{"], "literal brace"),
        (["--", "x"], "add --script FILE or --module NAME"),
        (["--script", "ddp.py", "--backend", "ray", "--launcher", "accelerate"], "Ray Train starts the ranks"),
        (["--script", str(SCRIPTS / "ddp.py"), "--backend", "ray"], "the directory a Ray job ships"),
        (["--script", "ddp.py", "--data", "d.jsonl"], "--data configure ftlaunch's worker"),
        (["--script", "ddp.py", "--pp", "2", "--", "{hf_args}"], "pipeline plan has no Hugging Face Trainer form"),
        (["--script", "ddp.py", "--precision", "bf16", "--", "{hf_args}"], "add --precision fp32"),
        (["--script", "ddp.py", "--precision", "fp32", "--loss", "chunked", "--", "{hf_args}"], "computes the whole loss"),
        (["--script", "ddp.py", "--packing"], "your program builds its own batches"),
    ],
)
def test_bad_programs_are_one_line_and_nothing_is_written(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(SCRIPTS, tmp_path, dirs_exist_ok=True)
    (tmp_path / "{broken}").write_text("def f(:\n")
    argv = [a.replace("{broken}", str(tmp_path / "{broken}")) for a in argv]
    assert ftlaunch(tmp_path, "bad", *argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists()


def test_arguments_after_double_dash_are_only_for_the_run_command(capsys):
    assert main(["plan", "--model", "tiny-llama", "--gpus", "1xA100", "--", "x"]) == 2
    assert "only the run command" in capsys.readouterr().err


def test_the_written_command_runs_the_program_from_where_it_was_planned(tmp_path, in_scripts, capsys):
    args = ["--lr", "1e-3", "--script", "ddp.py", "--zero-stage", "2", "--micro-batch", "4"]
    assert ftlaunch(tmp_path, "w", *args, "--", "{output_dir}", "{micro_batch}", "--lr={lr}") == 0
    out = capsys.readouterr().out
    assert "Your program (ddp.py) runs on every rank" in out and "micro-batch 4" in out
    run_dir = tmp_path / "runs" / "w"
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["program"] == {
        "script": str(SCRIPTS / "ddp.py"), "module": None, "workdir": str(SCRIPTS),
        "args": ["{output_dir}", "{micro_batch}", "--lr={lr}"], "launcher": "torchrun",
    }
    launch = (run_dir / "launch.sh").read_text()
    assert f"\ncd {SCRIPTS} || " in launch and 'export FTLAUNCH_DS_CONFIG="$RUN_DIR"/ds_config.json' in launch
    assert shlex.split(launch.splitlines()[-1])[-7:] == [
        "-m", "launcher.backends.rank_exit", "$RUN_DIR", str(SCRIPTS / "ddp.py"), "$RUN_DIR/output", "4", "--lr=0.001"
    ]
    assert "Your program (ddp.py)" in (run_dir / "explain.txt").read_text()


@pytest.mark.slow
def test_a_plain_ddp_script_and_a_module_run_on_every_rank(tmp_path, in_scripts, capsys):
    """Started, watched and preflighted as the worker is; the module's failure ends FAILED with its traceback."""
    assert ftlaunch(tmp_path, "ddp", "--script", "ddp.py", "--", "{output_dir}", "5", dry_run=False) == 0
    run_dir = tmp_path / "runs" / "ddp"
    reports = [json.loads((run_dir / "output" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    for rank, got in enumerate(reports):
        assert got["rank"] == rank and got["world"] == 2 and got["cwd"] == str(SCRIPTS)
        assert got["env"]["FTLAUNCH_RUN_DIR"] == str(run_dir) and got["env"]["FTLAUNCH_PLAN"] == str(run_dir / "plan.json")
        assert got["losses"][-1] < got["losses"][0]
    assert reports[0]["weights_sum"] == reports[1]["weights_sum"]  # DDP kept the replicas equal
    capsys.readouterr()
    assert main(["status", str(run_dir)]) == 0 and "SUCCEEDED" in capsys.readouterr().out
    assert main(["preflight", str(run_dir), "--timeout", "60"]) == 0
    assert "your program, GPUs" in capsys.readouterr().out

    assert ftlaunch(tmp_path, "fail", "--module", "userpkg.fail", dry_run=False) != 0
    capsys.readouterr()
    main(["status", str(tmp_path / "runs" / "fail")])
    assert "FAILED" in capsys.readouterr().out
    main(["logs", str(tmp_path / "runs" / "fail")])
    log = capsys.readouterr().out
    assert "RuntimeError: the user's training step failed: loss is nan" in log and "rank 1 of 2 starting" in log


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, stage, extra",
    [
        ("hf_trainer.py", 2, []),
        ("hf_trainer.py", 2, ["--compile"]),
        ("hf_trainer.py", 3, []),
        ("trl_sft.py", 3, ["--max_length", "16"]),
    ],
)
def test_stock_trainer_scripts_run_the_plan(script, stage, extra, tmp_path, in_scripts, monkeypatch):
    """`--script train.py -- {hf_args} --output_dir {output_dir}`: the Trainer's DeepSpeed engine runs the
    plan's ZeRO stage, micro-batch, accumulation, learning rate and scheduler, no value copied by hand."""
    if script == "trl_sft.py":
        pytest.importorskip("trl")
        # accelerate on a machine without an accelerator (see the file): what a GPU node gives it
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(CPU_ACCELERATE), os.environ.get("PYTHONPATH", "")]))
    compiled = "--compile" in extra
    plan = ["--zero-stage", str(stage), "--precision", "fp32", "--micro-batch", "2", "--grad-accum", "2"]
    plan += ["--lr", "3e-4", "--warmup-steps", "1", *(["--compile"] if compiled else [])]
    program = ["--script", script, "--", "{hf_args}", "--output_dir", "{output_dir}", "--max_steps", "3"]
    program += ["--report_to", "none", "--save_strategy", "no", *(e for e in extra if e != "--compile")]
    assert ftlaunch(tmp_path, "t", *plan, *program, dry_run=False) == 0
    out = tmp_path / "runs" / "t" / "output"
    for rank in (0, 1):
        got = json.loads((out / f"engine-{rank}.json").read_text())
        want = {"world": 2, "stage": stage, "micro_batch": 2, "accum": 2, "lr": 3e-4, "scheduler": "WarmupLR"}
        assert got == {**want, **({"compiled": True} if compiled else {})}


def test_the_trainer_flags_state_precision_and_checkpointing_either_way(tmp_path, in_scripts):
    assert ftlaunch(tmp_path, "f", "--precision", "fp32", "--grad-ckpt", "none") == 0
    flags = shlex.split((tmp_path / "runs" / "f" / "hf_args.txt").read_text())
    pairs = dict(zip(flags[::2], flags[1::2], strict=True))
    assert pairs["--bf16"] == "False" and pairs["--fp16"] == "False" and pairs["--gradient_checkpointing"] == "False"


def test_a_hand_edited_launch_sh_is_a_preflight_line_not_a_traceback(tmp_path, in_scripts, capsys):
    assert ftlaunch(tmp_path, "e", "--script", "ddp.py", "--", "{output_dir}", "1") == 0
    launch = tmp_path / "runs" / "e" / "launch.sh"
    launch.write_text(launch.read_text().replace(str(SCRIPTS / "ddp.py"), "other.py"))
    capsys.readouterr()
    assert main(["preflight", str(tmp_path / "runs" / "e")]) == 2
    assert "does not start the program plan.json names" in capsys.readouterr().err


def test_a_program_that_is_gone_by_launch_time_stops_the_launch(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    assert ftlaunch(tmp_path, "g", "--script", "train.py") == 0
    (tmp_path / "train.py").write_text("print('hi'\n")
    capsys.readouterr()
    assert main(["launch", str(tmp_path / "runs" / "g")]) == 2
    err = capsys.readouterr().err
    assert "train.py: line 1" in err and not (tmp_path / "runs" / "g" / "job.json").exists()


def test_the_worker_run_is_unchanged(tmp_path, in_scripts):
    assert ftlaunch(tmp_path, "plain") == 0
    run_dir = tmp_path / "runs" / "plain"
    assert "program" in json.loads((run_dir / "plan.json").read_text())
    assert json.loads((run_dir / "plan.json").read_text())["program"] is None
    words = shlex.split((run_dir / "launch.sh").read_text().splitlines()[-1])
    assert words[-3:] == ["-m", "launcher.train", "$RUN_DIR"] and "\ncd " not in (run_dir / "launch.sh").read_text()


def test_slurm_runs_the_program_from_where_it_was_planned(tmp_path, in_scripts):
    assert ftlaunch(tmp_path, "s", "--backend", "slurm", "--script", "ddp.py", "--", "{output_dir}", "2") == 0
    sbatch = (tmp_path / "runs" / "s" / "job.sbatch").read_text()
    assert f"--chdir={SCRIPTS}" in sbatch and f'{SCRIPTS / "ddp.py"} "$RUN_DIR"/output 2' in sbatch
    assert 'export FTLAUNCH_RUN_DIR="$RUN_DIR"' in sbatch
    subprocess.run(["bash", "-n", str(tmp_path / "runs" / "s" / "job.sbatch")], check=True)


def test_accelerate_launcher_starts_the_program_with_the_runs_accelerate_config(tmp_path, in_scripts):
    assert ftlaunch(tmp_path, "a", "--launcher", "accelerate", "--script", "accelerate_ds.py", "--", "{output_dir}") == 0
    run_dir = tmp_path / "runs" / "a"
    assert json.loads((run_dir / "plan.json").read_text())["program"]["launcher"] == "accelerate"
    assert json.loads((run_dir / "plan.json").read_text())["spec"]["pp"] == 1  # searched without pipelines
    words = shlex.split((run_dir / "launch.sh").read_text().splitlines()[-1])
    assert words[2:6] == ["-m", "accelerate.commands.launch", "--config_file", "$RUN_DIR/accelerate_config.yaml"]
    assert words[words.index("--num_processes") + 1] == "2" and words[words.index("--log_dir") + 1] == "$RUN_DIR/logs/ranks"
    assert words[-4:] == ["launcher.backends.rank_exit", "$RUN_DIR", str(SCRIPTS / "accelerate_ds.py"), "$RUN_DIR/output"]
    assert words[words.index("launcher.backends.rank_exit") - 1] == "--module"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--launcher", "accelerate"], "add --script FILE or --module NAME"),
        (["--launcher", "accelerate", "--script", "ddp.py", "--pp", "2"], "no pipeline form"),
    ],
)
def test_accelerate_launcher_refusals(argv, message, tmp_path, in_scripts, capsys):
    assert ftlaunch(tmp_path, "r", *argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_slurm_accelerate_nodes_pass_their_own_rank_and_the_head_address(tmp_path, in_scripts):
    from launcher.backends.slurm_script import ACCELERATE_NODE_SHIM

    argv = ["--gpus", "2x2xA100", "--backend", "slurm", "--launcher", "accelerate", "--script", "accelerate_ds.py"]
    assert ftlaunch(tmp_path, "sa", *argv, "--", "{output_dir}") == 0
    sbatch = (tmp_path / "runs" / "sa" / "job.sbatch").read_text()
    assert '--main_process_ip "$HEAD_ADDR" --main_process_port "$RDZV_PORT"' in sbatch
    assert "--rdzv_backend c10d" in sbatch and "--machine_rank @FTLAUNCH_NODE@ --rdzv_conf @FTLAUNCH_IS_HOST@" in sbatch
    assert shlex.quote(ACCELERATE_NODE_SHIM) in sbatch
    subprocess.run(["bash", "-n", str(tmp_path / "runs" / "sa" / "job.sbatch")], check=True)
    # what the shim makes of those words on node 1
    shim = ACCELERATE_NODE_SHIM.replace('exec "$@"', 'printf "%s\\n" "$@"')
    out = subprocess.run(
        ["bash", "-c", shim, "node", "bash", "--machine_rank", "@FTLAUNCH_NODE@", "--rdzv_conf", "@FTLAUNCH_IS_HOST@", "a b"],
        env={**os.environ, "SLURM_NODEID": "1", "RUN_DIR": str(tmp_path / "runs" / "sa")},
        capture_output=True, text=True, check=True,
    ).stdout
    assert out.splitlines() == ["bash", "--machine_rank", "1", "--rdzv_conf", "is_host=0", "a b"]


@pytest.mark.slow
def test_an_accelerate_script_runs_the_plan_under_accelerate_launch(tmp_path, in_scripts, capsys):
    """`--launcher accelerate`: the user's Accelerator() script gets the plan's DeepSpeed engine from the
    run's accelerate config, started and preflighted as any run."""
    plan = ["--zero-stage", "2", "--micro-batch", "2", "--grad-accum", "2"]
    program = ["--launcher", "accelerate", "--script", "accelerate_ds.py", "--", "{output_dir}"]
    assert ftlaunch(tmp_path, "acc", *plan, *program, dry_run=False) == 0
    run_dir = tmp_path / "runs" / "acc"
    for rank in (0, 1):
        got = json.loads((run_dir / "output" / f"engine-{rank}.json").read_text())
        assert (got["world"], got["dp"], got["stage"], got["micro_batch"], got["grad_accum"]) == (2, 2, 2, 2, 2)
        assert got["cwd"] == str(SCRIPTS) and got["losses"][-1] < got["losses"][0]
    assert list((run_dir / "logs" / "ranks").glob("*/attempt_0/1/stdout.log"))  # per-rank logs as torchrun's
    capsys.readouterr()
    assert main(["preflight", str(run_dir), "--timeout", "60"]) == 0, capsys.readouterr().err


RANK_EXIT = """
import os, sys
open(os.environ["COUNT"], "a").write(f"{__name__} {sys.argv[1:]} {sys.path[0]}\\n")
sys.exit(int(sys.argv[1]))
"""


def _rank_exit(run_dir, *program, count):
    cmd = [sys.executable, "-m", "launcher.backends.rank_exit", str(run_dir), *program]
    return subprocess.run(cmd, env={**os.environ, "COUNT": str(count)}, capture_output=True, text=True)


def test_rank_exit_runs_a_script_as_python_does_and_keeps_codes_75_and_2(tmp_path):
    from launcher.backends import rank_exit

    (tmp_path / "prog").mkdir()
    script, count = tmp_path / "prog" / "s.py", tmp_path / "count"
    script.write_text(RANK_EXIT)
    assert _rank_exit(tmp_path, str(script), "0", count=count).returncode == 0
    assert count.read_text() == f"__main__ ['0'] {tmp_path / 'prog'}\n" and rank_exit.ended(tmp_path) is None
    assert _rank_exit(tmp_path, str(script), "75", count=count).returncode == 75
    assert rank_exit.ended(tmp_path) == 75
    assert _rank_exit(tmp_path, str(script), "2", count=count).returncode == 2
    assert rank_exit.ended(tmp_path) == 2  # a start-up error outranks a checkpoint
    again = _rank_exit(tmp_path, str(script), "0", count=count)  # a restart in the same launch
    assert again.returncode == 2 and "not started again" in again.stderr
    assert len(count.read_text().splitlines()) == 3  # the program did not run again


@pytest.mark.slow
@pytest.mark.parametrize("code, state", [(75, "PREEMPTED"), (2, "FAILED")])
def test_exit_codes_reach_the_job_past_torchrun(code, state, tmp_path, monkeypatch, capsys):
    """75: the job is PREEMPTED (checkpointed; launch again resumes). 2: not restarted (--max-restarts 2),
    recorded as exit code 2."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COUNT", str(tmp_path / "count"))
    (tmp_path / "s.py").write_text(RANK_EXIT)
    argv = ["--script", "s.py", "--max-restarts", "2", "--", str(code)]
    assert ftlaunch(tmp_path, "x", *argv, dry_run=False) != 0
    capsys.readouterr()
    main(["status", str(tmp_path / "runs" / "x"), "--json"])
    st = json.loads(capsys.readouterr().out)
    assert (st["state"], st["exit_code"]) == (state, code), st
    # the first rank to exit makes torchrun stop the other, which may not have reached its write
    runs = len((tmp_path / "count").read_text().splitlines())
    if code == 2:
        assert 1 <= runs <= 2  # one attempt: the 2 restarts ended at once
    else:
        assert runs >= 3  # torchrun restarts any failure: three attempts (75 is for the job, not the agent)


def test_a_ray_job_ships_the_programs_directory_without_its_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    ray = ["--backend", "ray", "--address", "http://127.0.0.1:1"]
    assert ftlaunch(tmp_path, "r", *ray, "--script", "train.py", "--", "{output_dir}") == 0
    env = json.loads((tmp_path / "runs" / "r" / "ray_job.json").read_text())["runtime_env"]
    assert env["py_modules"][-1] == str(tmp_path) and "/runs" in env["excludes"]
    assert env["working_dir"] == str(tmp_path / "runs" / "r")


def test_rank_exit_ends_a_program_as_the_interpreter_would_without_its_teardown(tmp_path):
    """atexit handlers run and files left open are flushed; an uncaught exception is its traceback and 1."""
    script = tmp_path / "s.py"
    script.write_text(
        "import atexit, sys\n"
        f"log = open({str(tmp_path / 'left-open')!r}, 'w')\n"
        "log.write('unflushed')\n"
        f"atexit.register(lambda: open({str(tmp_path / 'atexit')!r}, 'w').write('ran'))\n"
        "if sys.argv[1] == 'raise':\n"
        "    raise ValueError('boom')\n"
    )
    done = _rank_exit(tmp_path, str(script), "ok", count=tmp_path / "count")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "left-open").read_text() == "unflushed" and (tmp_path / "atexit").read_text() == "ran"
    failed = _rank_exit(tmp_path, str(script), "raise", count=tmp_path / "count")
    assert failed.returncode == 1 and "ValueError: boom" in failed.stderr and "Traceback" in failed.stderr
