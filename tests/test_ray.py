"""The Ray backend without a cluster: the exact job request a dry run writes and prints, the
scaling config from the plan, what is uploaded (and the error before a too-big upload), the
example `ray up` config, and one-line errors within seconds for a cluster that is not there.
(tests/test_ray_cluster.py runs jobs on a real local Ray cluster.)"""

from __future__ import annotations

import inspect
import json
import time
from pathlib import Path

import pytest
import yaml

from launcher.backends import ray as ray_backend
from launcher.backends import ray_request
from launcher.backends.ray_cluster import cluster_yaml
from launcher.backends.ray_request import train_settings
from launcher.cli import main
from launcher.rundir import read_run_dir

JobSubmissionClient = pytest.importorskip("ray.job_submission").JobSubmissionClient
ROOT = Path(__file__).resolve().parents[1]
CLOSED = "http://127.0.0.1:9"  # discard port: nothing listens there
TINY = ["--model", "tiny-llama", "--gpus", "1x2xA100", "--cpu", "--init", "random", "--zero-stage", "2"]


def dry_run(tmp_path: Path, capsys, *extra: str) -> tuple[Path, dict]:
    code = main(
        [*TINY, "--backend", "ray", "--name", "r", "--runs-dir", str(tmp_path), "--dry-run", "--json", *extra]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    return tmp_path / "r", json.loads(out.out)


def one_line_error(argv: list[str], capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("ftlaunch: error:"), err
    return err[0]


def test_a_moved_run_directory_uploads_itself(tmp_path, capsys):
    """ray_job.json names the run directory it uploads; launched from elsewhere, it is written
    again for where the run is now (never uploading the original)."""
    run_dir, _ = dry_run(tmp_path, capsys, "--address", CLOSED)
    moved = tmp_path / "moved" / "r"
    moved.parent.mkdir()
    run_dir.rename(moved)
    one_line_error(["launch", str(moved), "--skip-preflight"], capsys)  # nothing answers at CLOSED
    request = json.loads((moved / "ray_job.json").read_text())
    assert request["runtime_env"]["working_dir"] == str(moved)
    assert train_settings(request)["storage"] == str(moved.parent)


def test_dry_run_writes_and_prints_the_exact_request(tmp_path, capsys):
    run_dir, out = dry_run(tmp_path, capsys, "--address", "http://head:8265")
    request = json.loads((run_dir / "ray_job.json").read_text())
    assert out["ray_job"] == request
    assert out["launch"] == f"ftlaunch launch {run_dir}"
    # a Ray Jobs request and nothing else: the fields of Ray's own submit_job
    assert set(request) == {"entrypoint", "runtime_env", "metadata"}
    assert set(request) <= set(inspect.signature(JobSubmissionClient.submit_job).parameters)
    assert all(isinstance(v, str) for v in request["metadata"].values())  # as the Jobs API wants
    assert read_run_dir(run_dir).backend["ray"]["address"] == "http://head:8265"
    submit = out["ray_job_submit"]
    assert submit[:5] == ["ray", "job", "submit", "--address", "http://head:8265"]
    assert json.loads(submit[submit.index("--runtime-env-json") + 1]) == request["runtime_env"]
    assert json.loads(submit[submit.index("--metadata-json") + 1]) == request["metadata"]
    assert submit[submit.index("--") + 1 :] == request["entrypoint"].split()
    assert request["entrypoint"] == "python -m launcher.backends.ray_entry"
    env = request["runtime_env"]
    assert env["working_dir"] == str(run_dir)
    assert env["py_modules"] == [str(ROOT / "launcher")]
    for pattern in (".git", ".venv", "/logs", "/checkpoints", "/output", "*.safetensors"):
        assert pattern in env["excludes"]
    assert env["env_vars"]["DS_ACCELERATOR"] == "cpu"
    assert {k: v for k, v in request["metadata"].items() if k != "ftlaunch_train"} == {
        "ftlaunch_run": "r",
        "ftlaunch_version": read_run_dir(run_dir).ftlaunch_version,
    }
    assert train_settings(request) == {
        "num_workers": 2,
        "use_gpu": False,
        "resources_per_worker": {"CPU": 1},
        "placement_strategy": "PACK",
        "max_failures": 2,
        "storage": str(tmp_path.resolve()),
    }
    assert read_run_dir(run_dir).backend["name"] == "ray"
    assert (run_dir / "ray_cluster.yaml").is_file()
    assert not (run_dir / "job.json").exists()  # a dry run starts nothing


def test_human_dry_run_shows_the_request(tmp_path, capsys):
    code = main([*TINY, "--backend", "ray", "--name", "h", "--runs-dir", str(tmp_path), "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Ray job request (ray_job.json):" in out and '"entrypoint"' in out


def test_storage_and_gpu_workers(tmp_path, capsys):
    shared = tmp_path / "shared"
    _, out = dry_run(tmp_path, capsys, "--ray-storage", str(shared))
    assert train_settings(out["ray_job"])["storage"] == str(shared.resolve())
    code = main(
        ["--model", "tiny-llama", "--gpus", "2x8xA100", "--backend", "ray", "--name", "g"]
        + ["--runs-dir", str(tmp_path), "--dry-run", "--json"]
    )
    request = json.loads(capsys.readouterr().out)["ray_job"]
    assert code == 0
    assert request["runtime_env"]["env_vars"] == {}
    train = train_settings(request)
    assert train["num_workers"] == 16
    assert train["use_gpu"] is True
    assert train["resources_per_worker"] == {"CPU": 1, "GPU": 1}
    assert train["placement_strategy"] == "SPREAD"


@pytest.mark.parametrize(
    "gpus,strategy", [("8xA100", "PACK"), ("2x8xA100", "SPREAD"), ("4x1xA100", "STRICT_SPREAD")]
)
def test_placement_strategy_follows_the_node_shape(gpus, strategy, tmp_path, capsys):
    code = main(
        ["--model", "tiny-llama", "--gpus", gpus, "--backend", "ray", "--name", "p"]
        + ["--runs-dir", str(tmp_path), "--dry-run", "--json"]
    )
    assert code == 0
    assert train_settings(json.loads(capsys.readouterr().out)["ray_job"])["placement_strategy"] == strategy


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--address", "http://h:8265"], "only for --backend ray"),
        (["--ray-storage", "/shared"], "only for --backend ray"),
        (["--backend", "ray", "--rdzv-endpoint", "h:29500"], "--rdzv-endpoint is for --backend torchrun"),
    ],
)
def test_ray_flags_belong_to_the_ray_backend(extra, needle, tmp_path, capsys):
    assert needle in one_line_error([*TINY, "--runs-dir", str(tmp_path), "--dry-run", *extra], capsys)


def test_upload_leaves_out_outputs_weights_and_caches(tmp_path, capsys):
    run_dir, out = dry_run(tmp_path, capsys)
    before, _, _ = ray_request.upload_size(out["ray_job"])
    for rel in ("checkpoints/step-00000004/model.pt", "logs/launcher.log", "output/final/model.safetensors"):
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / rel).write_bytes(b"x" * 2**20)
    (run_dir / ".git").mkdir()
    (run_dir / ".git" / "pack").write_bytes(b"x" * 2**20)
    (run_dir / "notes.txt").write_bytes(b"x" * 1000)
    after, biggest, _ = ray_request.upload_size(out["ray_job"])
    assert after == before + 1000
    assert biggest.stat().st_size < 2**20  # none of the 1 MiB files left out was counted


def test_exclusion_agrees_with_rays_own_matcher():
    pathspec = pytest.importorskip("ray._private.thirdparty.pathspec")
    spec = pathspec.PathSpec.from_lines("gitwildmatch", ray_request.EXCLUDES)
    paths = [
        "plan.json",
        "logs/metrics.jsonl",
        "sub/logs/x",
        "checkpoints/step-00000004/a.pt",
        "data/train.jsonl",
        "output",
        "x/output/y.txt",
        "train/__pycache__/m.pyc",
        ".git/HEAD",
        "weights/model.safetensors",
        "backends/ray.py",
        "job.json",
        "sub/job.json",
    ]
    for p in paths:
        assert ray_request._excluded(Path(p), ray_request.EXCLUDES) == spec.match_file(p), p


def test_too_big_a_working_dir_is_refused_before_any_upload(tmp_path, capsys):
    run_dir, _ = dry_run(tmp_path, capsys, "--address", CLOSED)
    with open(run_dir / "train.jsonl", "wb") as f:  # sparse: no disk used
        f.truncate((ray_request.MAX_UPLOAD_MIB + 1) * 2**20)
    msg = one_line_error(["launch", str(run_dir), "--skip-preflight", "--detach"], capsys)
    assert f"limit {ray_request.MAX_UPLOAD_MIB} MiB" in msg and "train.jsonl" in msg
    assert not (run_dir / "job.json").exists()


def test_unreachable_address_is_a_clear_error_within_seconds(tmp_path, capsys):
    run_dir, _ = dry_run(tmp_path, capsys, "--address", CLOSED)
    t0 = time.time()
    msg = one_line_error(["launch", str(run_dir), "--skip-preflight", "--detach"], capsys)
    assert time.time() - t0 < ray_backend.TIMEOUT_S + 2
    assert f"no Ray dashboard answers at {CLOSED}" in msg
    assert not (run_dir / "job.json").exists()


def test_no_address_at_all(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    run_dir, _ = dry_run(tmp_path, capsys)
    assert "--address http://HEAD:8265" in one_line_error(
        ["launch", str(run_dir), "--skip-preflight"], capsys
    )


def test_status_of_a_job_on_a_cluster_that_is_gone(tmp_path, capsys):
    run_dir, _ = dry_run(tmp_path, capsys)
    (run_dir / "job.json").write_text(
        json.dumps(
            {"backend": "ray", "address": CLOSED, "submission_id": "r-1", "cluster_run_dir": str(run_dir)}
        )
    )
    st = ray_backend.status(run_dir)
    assert st["state"] == "UNKNOWN" and "no Ray dashboard answers" in st["reason"]
    assert "no Ray dashboard answers" in one_line_error(["cancel", str(run_dir)], capsys)


@pytest.mark.parametrize("gpu,nodes,per_node", [("A100-80GB", 2, 8), ("L4", 4, 1), ("RTX4090", 1, 2)])
def test_cluster_config_is_sized_from_the_plan_and_valid_for_ray_up(gpu, nodes, per_node):
    config = yaml.safe_load(cluster_yaml("c", gpu, nodes, per_node))
    worker = config["available_node_types"]["gpu.worker"]
    assert worker["min_workers"] == worker["max_workers"] == config["max_workers"] == nodes - 1
    for node in config["available_node_types"].values():
        assert node["resources"] == {"GPU": per_node}
    util = pytest.importorskip("ray.autoscaler._private.util")
    util.validate_config(util.prepare_config(config))


def test_checked_in_example_cluster_config_is_the_generators():
    example = (ROOT / "cluster" / "ray-cluster.example.yaml").read_text()
    assert example == cluster_yaml("ftlaunch-example", "A100-80GB", 2, 8)
