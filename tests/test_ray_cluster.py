"""The Ray backend against a real Ray cluster on this machine (cluster/ray_up.sh: a loopback head
with 4 CPUs and 8 fake GPUs). A tiny Llama trains under Ray Train with 2 CPU workers to the end,
its log followed; a SIGKILLed rank makes Ray restart the group, which resumes from the last
checkpoint with no step lost and the same loss curve; cancel stops the job; a cluster without the
requested GPUs is refused within seconds."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from launcher.backends import ray as ray_backend
from launcher.backends import ray_request
from launcher.cli import main
from launcher.rundir import read_run_dir, write_run_dir
from launcher.spec import TrainSpec
from tests.runs import (
    ROOT,
    assert_pipeline_export,
    assert_same_curve,
    assert_same_weights,
    make_run,
    run_torchrun,
)
from tests.test_train_faults import curve, events, started_steps, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.cluster]
pytest.importorskip("ray")
pytest.importorskip("deepspeed")

SPEC = TrainSpec(zero_stage=2, micro_batch=2, seq_len=64)
# enough that a rank killed once Ray has seen a checkpoint dies mid-run: a tiny step takes ~0.08 s and a
# save ~1 s here, and Ray reports a checkpoint a second or two after it is written
STEPS = 40


def _answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"{address}/api/version", timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def ray_cluster():
    """The dashboard address of the local Ray head; stopped at the end if this session started it."""
    env = dict(os.environ)
    ray_exe = Path(sys.executable).parent / "ray"
    if ray_exe.exists():
        env["RAY"] = str(ray_exe)
    address = f"http://127.0.0.1:{env.get('FTLAUNCH_RAY_DASHBOARD_PORT', '8265')}"
    started = not _answers(address)
    up = subprocess.run(
        ["bash", str(ROOT / "cluster" / "ray_up.sh")], env=env, capture_output=True, text=True, timeout=180
    )
    assert up.returncode == 0, up.stderr[-2000:]
    assert up.stdout.split()[-1] == address
    yield address
    if started:
        subprocess.run(["bash", str(ROOT / "cluster" / "ray_down.sh")], env=env, timeout=120, check=False)


def ray_run(root: Path, name: str, address: str, spec: TrainSpec = SPEC, **training) -> Path:
    """A tiny-model run directory (tests/runs.py) made a Ray run: plan.json's backend and ray_job.json."""
    run_dir, _ = make_run(root, name, spec, lr=1e-3, **training)
    run = read_run_dir(run_dir)
    backend = {**run.backend, "name": "ray", "ray": {"address": address, "storage": None, "cpu": True}}
    run = run.model_copy(update={"backend": backend})
    write_run_dir(root, run, ray_request.files(run_dir, run), replan=True)
    return run_dir


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def finished(ray_cluster, tmp_path_factory):
    """An uninterrupted run started with `ftlaunch launch`, its log followed to the end."""
    root = tmp_path_factory.mktemp("ray")
    run_dir = ray_run(root, "whole", ray_cluster, max_steps=STEPS, save_every=4)
    out = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "launch", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
    )
    return run_dir, out


def test_trains_to_the_end_and_succeeds(finished, ray_cluster, capsys):
    run_dir, out = finished
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert "submitted to Ray as whole-" in out.stdout
    assert "[ftlaunch] step 1 " in out.stdout and "[ftlaunch] event finished" in out.stdout  # followed
    assert out.stdout.rstrip().endswith("whole: SUCCEEDED")
    st = ray_backend.status(run_dir)
    assert st["state"] == "SUCCEEDED" and st["ray_status"] == "SUCCEEDED" and st["step"] == STEPS
    assert sorted(curve(run_dir)) == list(range(1, STEPS + 1))
    assert json.loads((run_dir / "output" / "final.json").read_text())["steps"] == STEPS
    # Ray Train saw every checkpoint, keeps as many as the run does, and the last one is the last step
    pointers = sorted((run_dir / "ray").glob("*/step-*/ftlaunch_checkpoint.json"))
    assert len(pointers) == read_run_dir(run_dir).training.keep_last
    last = json.loads(pointers[-1].read_text())
    assert last["step"] == STEPS and last["loss"] == curve(run_dir)[STEPS]
    assert Path(last["path"]) == run_dir / "checkpoints" / f"step-{STEPS:08d}"
    # and it is watchable like the other backends
    assert main(["status", str(run_dir)]) == 0
    assert f"whole: SUCCEEDED  step={STEPS}  submission_id=whole-" in capsys.readouterr().out
    assert main(["logs", str(run_dir)]) == 0
    assert "[ftlaunch] event finished" in capsys.readouterr().out
    assert main(["jobs", "--runs-dir", str(run_dir.parent), "--address", ray_cluster, "--json"]) == 0
    jobs = json.loads(capsys.readouterr().out)
    assert [j["state"] for j in jobs if j.get("submission_id") == st["submission_id"]] == ["SUCCEEDED"]


def test_sigkill_of_a_rank_restarts_the_group_and_resumes_with_the_same_curve(
    finished, ray_cluster, tmp_path
):
    reference = curve(finished[0])
    run_dir = ray_run(tmp_path, "killed", ray_cluster, max_restarts=1, max_steps=STEPS, save_every=4)
    ray_backend.submit(run_dir)
    reported = run_dir / "ray"
    wait_for(  # (Ray keeps the last two reported: step 4's folder may be gone by the time we look)
        lambda: started_steps(run_dir) >= 6 and any(reported.glob("*/step-*")),
        300,
        "step 6, with a checkpoint reported to Ray Train",
    )
    os.kill(int((run_dir / "logs" / "pids" / "rank-1").read_text()), signal.SIGKILL)
    killed_at = started_steps(run_dir)
    log: list[str] = []
    st = ray_backend.follow(run_dir, log.append)
    assert st["state"] == "SUCCEEDED", "".join(log)[-4000:]
    assert killed_at < STEPS, f"the kill came after the last step ({killed_at}); raise STEPS"
    restarted = re.findall(
        r"Ray Train restarted the ranks \(last checkpoint reported: step (\d+)\)", "".join(log)
    )
    resumed = [e for e in events(run_dir) if e["event"] == "resumed"]
    assert len(resumed) == 1 and resumed[0]["step"] % 4 == 0 and resumed[0]["step"] < STEPS
    assert restarted and 4 <= int(restarted[0]) <= resumed[0]["step"]  # at or after the last reported
    got = curve(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))  # every step, none lost
    assert_same_curve(got, reference)  # bitwise, as on torchrun
    assert_same_weights(run_dir, finished[0])


def test_a_pipeline_job_succeeds_with_the_curve_it_trains_under_torchrun(ray_cluster, tmp_path):
    spec = TrainSpec(pp=2, zero_stage=1, micro_batch=2, grad_accum=4, seq_len=64)
    run_dir = ray_run(tmp_path / "ray", "pipe", ray_cluster, spec, max_steps=6, save_every=3)
    out = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "launch", str(run_dir)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert out.returncode == 0 and out.stdout.rstrip().endswith("pipe: SUCCEEDED"), (out.stdout + out.stderr)[-4000:]
    local, argv = make_run(tmp_path / "local", "pipe", spec, lr=1e-3, max_steps=6, save_every=3)
    proc = run_torchrun(argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(curve(run_dir)) == list(range(1, 7))
    assert_same_curve(curve(run_dir), curve(local))  # the same two stages, under Ray Train's ranks
    assert_same_weights(run_dir, local)
    assert_pipeline_export(run_dir / "output" / "final", 2)


def test_cancel_stops_the_job_and_its_ranks(ray_cluster, tmp_path, capsys):
    run_dir = ray_run(tmp_path, "cancelled", ray_cluster, max_steps=2000, save_every=1000)
    ray_backend.submit(run_dir)
    wait_for(lambda: started_steps(run_dir) >= 2, 300, "step 2")
    pids = [int(p.read_text()) for p in (run_dir / "logs" / "pids").iterdir()]
    assert main(["cancel", str(run_dir)]) == 0
    assert capsys.readouterr().out.strip() == "cancelled: CANCELLED"
    assert ray_backend.status(run_dir)["ray_status"] == "STOPPED"
    wait_for(lambda: not any(_alive(p) for p in pids), 60, "the ranks to exit")
    assert started_steps(run_dir) < 2000


def test_a_cluster_without_the_gpus_is_refused_within_seconds(ray_cluster, tmp_path, capsys):
    t0 = time.time()
    code = main(
        ["--model", "tiny-llama", "--gpus", "2x8xA100", "--init", "random", "--backend", "ray"]
        + ["--address", ray_cluster, "--runs-dir", str(tmp_path), "--name", "big", "--skip-preflight"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert time.time() - t0 < 10
    assert "has 8 GPU(s)" in err[0] and "16 GPU" in err[0]
    assert not (tmp_path / "big" / "job.json").exists()


def test_rays_own_cli_runs_the_written_request(ray_cluster, tmp_path):
    """ray_job.json is a Ray Jobs request as written: `ray job submit` with it (the command line a
    dry run prints) trains the run to the end, without ftlaunch in between."""
    from ray.job_submission import JobSubmissionClient

    run_dir = ray_run(tmp_path, "by-hand", ray_cluster, max_steps=4, save_every=2)
    request = json.loads((run_dir / "ray_job.json").read_text())
    argv = ray_request.submit_command(request, ray_cluster)
    argv[0] = str(Path(sys.executable).parent / "ray")
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    client = JobSubmissionClient(ray_cluster)
    job = next(j for j in client.list_jobs() if (j.metadata or {}).get("ftlaunch_run") == "by-hand")
    deadline = time.time() + 300
    while str(client.get_job_status(job.submission_id)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        assert time.time() < deadline, "the job did not end in 300 s"
        time.sleep(1)
    assert str(client.get_job_status(job.submission_id)) == "SUCCEEDED", client.get_job_logs(job.submission_id)[-3000:]
    assert sorted(curve(run_dir)) == [1, 2, 3, 4]


def test_a_users_script_runs_under_ray_train_from_its_shipped_directory(ray_cluster, tmp_path, monkeypatch, capsys):
    """`--script` with `--backend ray`: the directory it was planned from ships with the job (py_modules),
    each Ray Train worker starts the script there as a rank, with the cluster's run directory."""
    scripts = ROOT / "tests" / "user_scripts"
    monkeypatch.chdir(scripts)
    plan = ["--model", "tiny-llama", "--gpus", "1x2xA100", "--cpu", "--init", "random", "--max-restarts", "0"]
    ray = ["--backend", "ray", "--address", ray_cluster, "--name", "prog", "--runs-dir", str(tmp_path)]
    assert main([*plan, *ray, "--script", "ddp.py", "--", "{output_dir}", "3"]) == 0, capsys.readouterr().err
    run_dir = tmp_path / "prog"
    request = json.loads((run_dir / "ray_job.json").read_text())
    assert request["runtime_env"]["py_modules"][-1] == str(scripts)
    reports = [json.loads((run_dir / "output" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    for rank, got in enumerate(reports):
        assert got["rank"] == rank and got["world"] == 2 and got["env"]["FTLAUNCH_RUN_DIR"] == str(run_dir)
        assert Path(got["cwd"]).name == "user_scripts" and got["cwd"] != str(scripts)  # the shipped copy
        assert got["losses"][-1] < got["losses"][0]
    assert ray_backend.status(run_dir)["state"] == "SUCCEEDED"
