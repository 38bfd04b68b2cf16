"""The Slurm batch script without a cluster: golden scripts for a few plans, every user value
inert (the script runs under bash with stub srun / scontrol / scancel that record what they were
given), the requeue logic, option validation, and the errors given before anything is queued.

Regenerate the golden scripts on purpose (then review the diff):
    FTLAUNCH_REGEN_GOLDEN=1 python -m pytest tests/test_slurm_script.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher import __version__
from launcher.backends import slurm, slurm_cluster
from launcher.backends.slurm_script import SlurmOptions, render
from launcher.cli import main
from launcher.train.checkpoint import write_manifest

GOLDEN = Path(__file__).parent / "golden" / "slurm"
TINY = ["--model", "tiny-llama", "--gpus", "2x2xA100", "--cpu", "--init", "random", "--zero-stage", "2"]
EVIL = 'x"; rm -rf / $(touch MARK) `touch MARK` #c'
CASES = {
    "tiny-llama-2x2-cpu": [*TINY, "--backend", "slurm"],
    "llama-3.1-8b-lora-2x8xH100-all-options": [
        *("--model", "llama-3.1-8b", "--gpus", "2x8xH100", "--method", "lora", "--backend", "slurm"),
        *("--partition", "gpu", "--account", "proj-1", "--qos", "high", "--time", "2-00:00:00"),
        *("--constraint", "h100&ib", "--cpus-per-node", "96", "--mem", "800G", "--job-name", 'x"; rm -rf /'),
        *("--sbatch-line=--mail-type=END", "--setup", "module load cuda/12.4"),
        *("--setup", "source /shared/venv/bin/activate", "--signal-lead", "300", "--max-requeues", "5"),
    ],
    "tiny-llama-1x2-container": [
        *("--model", "tiny-llama", "--gpus", "1x2xA100", "--init", "random", "--backend", "slurm"),
        *("--container-image", "nvcr.io#nvidia/pytorch:24.05-py3"),
    ],
}


def dry_run(tmp_path: Path, name: str, argv: list[str], capsys) -> tuple[Path, str]:
    code = main([*argv, "--dry-run", "--name", name, "--runs-dir", str(tmp_path)])
    out = capsys.readouterr()
    assert code == 0, out.err
    return tmp_path / name, out.out


@pytest.mark.parametrize("name", list(CASES))
def test_golden_sbatch_scripts(name, tmp_path, capsys):
    run_dir, out = dry_run(tmp_path, name, CASES[name], capsys)
    script = (run_dir / "job.sbatch").read_text()
    # the dry run prints the exact script and the exact submit command
    assert script in out
    assert f"submit command: sbatch --parsable --chdir={run_dir} {run_dir}/job.sbatch" in out
    # no path of the run directory is written into it: a copied or moved run dir submits itself
    assert str(run_dir) not in script
    text = script.replace(sys.executable, "<PYTHON>")
    text = text.replace(f"ftlaunch {__version__}", "ftlaunch <VERSION>")
    golden = GOLDEN / f"{name}.sbatch"
    if os.environ.get("FTLAUNCH_REGEN_GOLDEN") == "1":
        GOLDEN.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), f"{name} differs from tests/golden/slurm (regenerate on purpose)"
    assert subprocess.run(["bash", "-n", str(run_dir / "job.sbatch")]).returncode == 0


STUBS = {
    "srun": 'echo "srun $*" >>"$STUB_LOG"\nwhile [ "$1" != bash ]; do shift; done\nSLURM_NODEID=0 exec "$@"\n',
    "scontrol": 'echo "scontrol $*" >>"$STUB_LOG"\n[ "$1 $2" = "show hostnames" ] && printf "node1\\nnode2\\n"\n'
    "exit 0\n",
    # Slurm passes the signal on to the job steps: here, to the fake torchrun
    "scancel": 'echo "scancel $*" >>"$STUB_LOG"\nkill -USR1 "$(cat "$STUB_DIR/torchrun.pid")"\n',
    # the fake torchrun: records its words and environment; on SIGUSR1 exits like torchrun does
    "torchrun": 'echo $$ >"$STUB_DIR/torchrun.pid"\nprintf "%s\\n" "PET_RDZV_CONF=$PET_RDZV_CONF" "$@" '
    '>"$STUB_DIR/argv"\ntrap "exit 1" USR1\n[ -n "${STUB_WAIT:-}" ] && { touch "$STUB_DIR/waiting"; '
    "while :; do sleep 0.05; done; }\nexit ${STUB_RC:-0}\n",
}


def stubbed(tmp_path: Path, opts: SlurmOptions, nnodes: int = 2, runs: str = "runs") -> tuple[Path, Path]:
    stub_dir = tmp_path / "stubs"
    stub_dir.mkdir()
    for name, body in STUBS.items():
        (stub_dir / name).write_text("#!/usr/bin/env bash\n" + body)
        (stub_dir / name).chmod(0o755)
    run_dir = tmp_path / runs / "r"
    (run_dir / "logs").mkdir(parents=True)
    script = render(
        run_dir, "r", nnodes, 2, 1, {"DS_ACCELERATOR": "cpu"}, opts, python=str(stub_dir / "torchrun")
    )
    (run_dir / "job.sbatch").write_text(script)
    (run_dir / "plan.json").write_text("{}\n")  # the script checks it runs in a run directory
    return run_dir, stub_dir


def run_script(
    run_dir: Path, stub_dir: Path, restarts: int = 0, wait: bool = False, **env
) -> subprocess.Popen:
    full = dict(os.environ)
    full.update(
        PATH=f"{stub_dir}:{os.environ['PATH']}",
        STUB_LOG=str(stub_dir / "log"),
        STUB_DIR=str(stub_dir),
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="node[1-2]",
        SLURM_CPUS_ON_NODE="8",
        SLURM_RESTART_COUNT=str(restarts),
        **({"STUB_WAIT": "1"} if wait else {}),
        **env,
    )
    full.pop("SLURM_NODEID", None)
    return subprocess.Popen(
        ["bash", str(run_dir / "job.sbatch")], cwd=run_dir, env=full, stdout=subprocess.PIPE, text=True
    )


def test_submitted_from_elsewhere_the_script_refuses_to_run(tmp_path):
    run_dir, stubs = stubbed(tmp_path, SlurmOptions())
    full = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(stubs / "log")}
    proc = subprocess.run(["bash", str(run_dir / "job.sbatch")], cwd=tmp_path, env=full, capture_output=True, text=True)
    assert proc.returncode == 2 and "is not a run directory" in proc.stderr
    assert not (stubs / "log").exists()  # nothing started


def test_user_values_are_inert_and_reach_their_programs_verbatim(tmp_path):
    image = "img$(touch${IFS}MARK)`touch${IFS}MARK`"
    opts = SlurmOptions(job_name=EVIL, container_image=image, setup=["echo setup-ran >setup.txt"])
    run_dir, stubs = stubbed(tmp_path, opts, runs="we ird $(touch MARK) 'q\"")
    proc = run_script(run_dir, stubs)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert not list(tmp_path.rglob("MARK")), "a user value was executed"
    assert (run_dir / "setup.txt").read_text() == "setup-ran\n"  # setup lines run, as written
    script = (run_dir / "job.sbatch").read_text()
    assert '#SBATCH --job-name="x\\"; rm -rf / $(touch MARK) `touch MARK` \\#c"' in script
    srun = [line for line in (stubs / "log").read_text().splitlines() if line.startswith("srun")][0]
    assert f"--container-image={image}" in srun
    assert f"--container-mounts={run_dir}:{run_dir}" in srun
    words = (stubs / "argv").read_text().splitlines()
    assert words[0] == "PET_RDZV_CONF=is_host=1"  # node 0 hosts the rendezvous
    assert words[words.index("--rdzv-endpoint") + 1] == f"node1:{20000 + 4242}"
    assert words[words.index("--rdzv-id") + 1] == "4242"
    assert words[-1] == str(run_dir)
    assert (run_dir / "logs" / "exit_code").read_text() == "0\n"


@pytest.mark.parametrize(
    "rc,restarts,requeued,exit_code",
    [(0, 0, False, 0), (2, 0, False, 2), (75, 0, True, None), (75, 3, False, 75)],
)
def test_requeue_only_after_a_checkpoint_and_at_most_max_requeues(
    tmp_path, rc, restarts, requeued, exit_code
):
    run_dir, stubs = stubbed(tmp_path, SlurmOptions(max_requeues=3))
    proc = run_script(run_dir, stubs, restarts=restarts, STUB_RC=str(rc))
    out, _ = proc.communicate(timeout=30)
    assert ("scontrol requeue 4242" in (stubs / "log").read_text()) == requeued, out
    code_file = run_dir / "logs" / "exit_code"
    assert proc.returncode == (0 if requeued else rc)
    assert (code_file.read_text().strip() if code_file.exists() else None) == (
        None if exit_code is None else str(exit_code)
    )


def test_the_time_limit_signal_reaches_the_ranks_then_the_job_requeues(tmp_path):
    run_dir, stubs = stubbed(tmp_path, SlurmOptions())
    proc = run_script(run_dir, stubs, wait=True)
    deadline = time.time() + 30
    while not (stubs / "waiting").exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@N does
    out, _ = proc.communicate(timeout=30)
    log = (stubs / "log").read_text()
    assert "scancel --signal=USR1 4242" in log  # every job step, not the batch script again
    assert "scontrol requeue 4242" in log, out
    assert proc.returncode == 0 and not (run_dir / "logs" / "exit_code").exists()


def bad(argv: list[str], capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("ftlaunch: error:"), err
    return err[0]


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--partition", "gpu; reboot"], "--partition"),
        (["--account", "$(id)"], "--account"),
        (["--time", "forever"], "--time"),
        (["--mem", "lots"], "--mem"),
        (["--constraint", "a b"], "--constraint"),
        (["--job-name", "two\nlines"], "--job-name"),
        (["--setup", "echo a\nreboot"], "--setup"),
        (["--sbatch-line", "mail-type=END"], "sbatch option"),
        (["--sbatch-line=--nodes=3"], "--nodes"),
        (["--sbatch-line=-o /tmp/x"], "-o"),
        (["--sbatch-line=--node=3"], "--node"),  # sbatch takes prefixes of long options
        (["--sbatch-line=-N3"], "-N3"),
        (["--container-image", "a b"], "--container-image"),
        (["--signal-lead", "5"], "signal-lead"),
        (["--rdzv-endpoint", "h:1"], "--rdzv-endpoint"),
    ],
)
def test_bad_slurm_options_are_one_line(extra, needle, tmp_path, capsys):
    argv = [*TINY, "--backend", "slurm", "--dry-run", "--runs-dir", str(tmp_path), *extra]
    assert needle in bad(argv, capsys)
    assert not any(tmp_path.iterdir())


def test_slurm_flags_need_the_slurm_backend(tmp_path, capsys):
    msg = bad([*TINY, "--dry-run", "--runs-dir", str(tmp_path), "--partition", "gpu"], capsys)
    assert "--partition only apply to --backend slurm" in msg


def test_no_slurm_here_is_a_clear_error(tmp_path, capsys, monkeypatch):
    run_dir, _ = dry_run(tmp_path, "r", [*TINY, "--backend", "slurm"], capsys)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    msg = bad(["launch", str(run_dir), "--skip-preflight"], capsys)
    assert "Slurm is not installed here" in msg
    assert not (run_dir / "job.json").exists()
    assert slurm.status(run_dir)["state"] == "NOT_STARTED"


@pytest.mark.parametrize(
    "gres,count",
    [
        ("gpu:4", 4),
        ("gpu:a100:4(S:0-1)", 4),
        ("gpu:a100:2,gpu:v100:2(S:0,1)", 4),
        ("(null)", 0),
        ("mps:100", 0),
    ],
)
def test_gpus_in_a_nodes_gres(gres, count):
    assert slurm_cluster.gpus(gres) == count


@pytest.mark.parametrize(
    "limit,mins",
    [
        ("30", 30),
        ("30:30", 30.5),
        ("1:30:00", 90),
        ("2-12", 3600),
        ("2-12:30:30", 3630.5),
        ("UNLIMITED", None),
    ],
)
def test_slurm_time_limits_in_minutes(limit, mins):
    assert slurm_cluster.minutes(limit) == mins


def _fake_slurm(monkeypatch, job: str, nodes: dict[str, str]) -> None:
    """Slurm's commands answering from canned lines: squeue knows nothing, `scontrol show job`
    prints `job`, `scontrol show node` the lines of `nodes` named in its node list."""

    def run(argv, timeout=60):
        out = ""
        if argv[:3] == ["scontrol", "show", "job"]:
            out = job
        elif argv[:3] == ["scontrol", "show", "node"]:
            names = argv[-1].replace("node[1-2]", "node1,node2").split(",")
            out = "".join(nodes[n] + "\n" for n in names if n in nodes)
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(slurm_cluster, "run", run)


JOB = "JobId=7 JobName=r JobState={state} Reason=None Requeue={requeue} Restarts=0 ExitCode=0:0 NodeList=node[1-2] BatchHost=node1"
NODE = "NodeName={name} Arch=x86_64 State={state} Partitions=debug Reason={reason}"


@pytest.mark.parametrize(
    "job,node2,state,needle",
    [
        (
            JOB.format(state="RUNNING", requeue=1),
            NODE.format(name="node2", state="ALLOCATED+NOT_RESPONDING", reason="Not responding [slurm@2026]"),
            "RUNNING",
            "node down or not responding: node2 (ALLOCATED+NOT_RESPONDING: Not responding); if it stays "
            "so, Slurm requeues the job, which resumes from checkpoint step 10",
        ),
        (
            JOB.format(state="RUNNING", requeue=0),
            NODE.format(name="node2", state="DOWN+NOT_RESPONDING", reason="Not responding [slurm@2026]"),
            "RUNNING",
            "node down or not responding: node2 (DOWN+NOT_RESPONDING: Not responding); if it stays so, "
            "Slurm ends it (NODE_FAIL); launch again to resume from checkpoint step 10",
        ),
        (
            JOB.format(state="NODE_FAIL", requeue=0),
            NODE.format(name="node2", state="DOWN+NOT_RESPONDING", reason="Not responding [slurm@2026]"),
            "FAILED",
            "node failure (Slurm NODE_FAIL): node2 (DOWN+NOT_RESPONDING: Not responding); the job was not "
            "requeued: `ftlaunch launch {run_dir}` resumes from checkpoint step 10",
        ),
        (  # the node is back by the time one asks
            JOB.format(state="NODE_FAIL", requeue=0),
            NODE.format(name="node2", state="IDLE", reason="(null)"),
            "FAILED",
            "node failure (Slurm NODE_FAIL): a node of node[1-2]; the job was not requeued",
        ),
        (
            JOB.format(state="RUNNING", requeue=1),
            NODE.format(name="node2", state="MIXED", reason="(null)"),
            "RUNNING",
            None,
        ),
    ],
)
def test_a_node_failure_is_named_in_the_status(job, node2, state, needle, tmp_path, capsys, monkeypatch):
    """The live counterpart: test_slurm_cluster.py::test_slurmd_killed_on_a_node_...; these are
    the states it cannot reach (a job without --requeue, a node back before anyone asked)."""
    run_dir, _ = dry_run(tmp_path, "r", [*TINY, "--backend", "slurm"], capsys)
    (run_dir / "job.json").write_text('{"backend": "slurm", "job_id": "7"}\n')
    for step in (5, 10, 12):
        (run_dir / "checkpoints" / f"step-{step:08d}").mkdir(parents=True)
        (run_dir / "checkpoints" / f"step-{step:08d}" / "rank-00000.pt").write_bytes(b"state")
        write_manifest(run_dir / "checkpoints" / f"step-{step:08d}")
    (run_dir / "checkpoints" / ".tmp-step-00000015").mkdir()  # an unfinished save does not count
    (run_dir / "checkpoints" / "step-00000012" / "rank-00000.pt").unlink()  # nor a damaged one
    node1 = NODE.format(name="node1", state="MIXED", reason="(null)")
    _fake_slurm(monkeypatch, job, {"node1": node1, "node2": node2})
    st = slurm.status(run_dir)
    assert st["state"] == state and st["nodes"] == "node[1-2]"
    if needle is None:
        assert "reason" not in st
        return
    assert needle.format(run_dir=run_dir) in st["reason"]
    assert main(["status", str(run_dir)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"r: {state}  job_id=7") and line.endswith(st["reason"])


@pytest.mark.parametrize(
    "has_run_dir, python, message",
    [(False, "bash", "does not see"), (True, "/nope/python", "has no /nope/python"), (True, "bash", None)],
)
def test_each_node_checks_the_run_dir_and_the_interpreter_before_starting(has_run_dir, python, message, tmp_path):
    from launcher.backends.slurm_script import NODE_SHIM

    if has_run_dir:
        (tmp_path / "plan.json").write_text("{}")
    env = {**os.environ, "RUN_DIR": str(tmp_path if has_run_dir else tmp_path / "elsewhere"), "SLURM_NODEID": "0"}
    proc = subprocess.run(["bash", "-c", NODE_SHIM, "node", python, "-c", "exit 0"], env=env, capture_output=True, text=True)
    if message is None:
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_python_names_the_interpreter_on_the_nodes(tmp_path, capsys):
    argv = [*CASES["tiny-llama-2x2-cpu"], "--python", "python", "--setup", "source /shared/venv/bin/activate"]
    run_dir, _ = dry_run(tmp_path, "py", argv, capsys)
    script = (run_dir / "job.sbatch").read_text()
    assert "ftlaunch-node \\\n  python -m torch.distributed.run" in script and sys.executable not in script
