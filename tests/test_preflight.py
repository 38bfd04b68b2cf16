"""`ftlaunch preflight`: passes on a healthy run dir (real all-reduce over the job's ranks) and
names the problem in one line otherwise."""

from __future__ import annotations

import socket

import pytest

from launcher.cli import main
from launcher.spec import TrainSpec
from tests.runs import cpu_env, make_run

pytest.importorskip("torch")


@pytest.fixture
def cpu(monkeypatch):
    for k, v in cpu_env().items():
        monkeypatch.setenv(k, v)


def test_healthy_run_dir_passes_with_a_real_allreduce(tmp_path, capsys, cpu):
    run_dir, _ = make_run(tmp_path, "ok", TrainSpec(zero_stage=2, micro_batch=2, seq_len=64))
    assert main(["preflight", str(run_dir), "--timeout", "60"]) == 0
    out = capsys.readouterr().out
    assert "all-reduce over 2 ranks" in out and "ok" in out


def test_gpu_plan_on_a_cpu_machine_is_refused(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count():
        pytest.skip("this machine has GPUs")
    code = main(
        ["--model", "tiny-llama", "--gpus", "1x2xA100", "--init", "random", "--dry-run"]
        + ["--name", "gpu", "--runs-dir", str(tmp_path)]
    )
    assert code == 0
    capsys.readouterr()
    assert main(["preflight", str(tmp_path / "gpu"), "--no-allreduce"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "NVIDIA GPU" in err[0]


def test_busy_rendezvous_port_is_named(tmp_path, capsys, cpu):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(
            ["--model", "tiny-llama", "--gpus", "1x2xA100", "--cpu", "--init", "random", "--dry-run"]
            + ["--name", "rdzv", "--runs-dir", str(tmp_path), "--rdzv-endpoint", f"127.0.0.1:{port}"]
        )
        assert code == 0
        capsys.readouterr()
        assert main(["preflight", str(tmp_path / "rdzv"), "--timeout", "5"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(port) in err[0] and "in use" in err[0]


def test_a_run_dir_with_lora_under_autotp_is_refused_before_any_rank_starts(tmp_path, capsys, cpu):
    """Written before the planner refused it (make_run writes what it is given): the worker would
    crash in deepspeed.initialize on every rank; preflight (and the worker itself) say why."""
    run_dir, _ = make_run(tmp_path, "lora-tp", TrainSpec(method="lora", tp=2, zero_stage=1, seq_len=64))
    assert main(["preflight", str(run_dir), "--no-allreduce"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "LoRA's own adapter layers" in err[0] and "tp 1" in err[0]


def test_a_pipeline_run_dir_passes_and_unrunnable_ones_are_refused_before_any_rank_starts(tmp_path, capsys, cpu):
    """Llama pp 2 with ZeRO-1 runs on the pipeline engine; a family without a stage adapter and
    ZeRO-0 (whose pipeline checkpoints DeepSpeed 0.19.8 cannot load) are one line each."""
    run_dir, _ = make_run(tmp_path, "pp2", TrainSpec(pp=2, zero_stage=1, seq_len=64))
    assert main(["preflight", str(run_dir), "--no-allreduce"]) == 0
    capsys.readouterr()
    for name, model, spec, want in [
        ("qwen", "qwen-7b", TrainSpec(pp=2, zero_stage=1, seq_len=64), "no pipeline stage adapter"),
        ("zero0", "tiny-llama", TrainSpec(pp=2, zero_stage=0, seq_len=64), "cannot resume its own"),
    ]:
        run_dir, _ = make_run(tmp_path, name, spec, model=model)
        assert main(["preflight", str(run_dir), "--no-allreduce"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and want in err[0], err


def test_the_installed_worker_dependencies_meet_the_declared_bounds():
    from launcher.preflight import check_versions

    check_versions()  # this suite's own install: every train dependency within pyproject's range


def test_a_worker_dependency_older_than_its_bound_is_named_with_the_fix(tmp_path, capsys, cpu, monkeypatch):
    """As on a cluster with a preinstalled DeepSpeed 0.14 (its CPU ranks die on a missing IPEX)."""
    from importlib import metadata

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "0.14.0" if name == "deepspeed" else real(name))
    run_dir, _ = make_run(tmp_path, "old", TrainSpec(zero_stage=2, micro_batch=2, seq_len=64))
    assert main(["preflight", str(run_dir), "--no-allreduce"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "deepspeed 0.14.0 is installed" in err and "pip install 'deepspeed>=0.16.4'" in err


@pytest.mark.parametrize(
    "spec, what",
    [(TrainSpec(method="qlora", seq_len=64), "QLoRA"), (TrainSpec(optimizer="adamw-8bit", seq_len=64), "adamw-8bit")],
)
def test_qlora_and_8bit_adamw_without_bitsandbytes_are_one_line_with_the_install(tmp_path, capsys, cpu, monkeypatch, spec, what):
    """On a CPU they run (bitsandbytes' CPU backend, tests/test_train_e2e.py); where bitsandbytes
    is missing, preflight says what to install instead of every rank failing on an import."""
    import sys

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import raises ImportError
    run_dir, _ = make_run(tmp_path, "q", spec)
    assert main(["preflight", str(run_dir), "--no-allreduce"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and what in err[0] and "pip install 'bitsandbytes>=0.48'" in err[0], err


@pytest.mark.parametrize("has_kernels", [True, False])
def test_fp16_on_cpu_ranks_follows_whether_the_cpu_has_fp16_kernels(tmp_path, capsys, cpu, monkeypatch, has_kernels):
    """DeepSpeed's CPU accelerator trains fp16 only where oneDNN has fp16 kernels; CI's CPUs differ,
    so both answers are set here (the worker's own refusal: tests/test_train_pipeline.py)."""
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    monkeypatch.setattr(CPU_Accelerator, "is_fp16_supported", lambda self: has_kernels)
    run_dir, _ = make_run(tmp_path, "fp16", TrainSpec(precision="fp16", seq_len=64))
    code = main(["preflight", str(run_dir), "--no-allreduce"])
    err = capsys.readouterr().err.strip().splitlines()
    if has_kernels:
        assert code == 0, err
    else:
        assert code == 2 and len(err) == 1 and "--precision fp16 on CPU ranks" in err[0], err
