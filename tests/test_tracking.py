"""--report-to (launcher/train/tracking.py): the option in plan.json, a bad name or a missing library as
one line before any rank, and the trackers' files read back with TensorBoard's and MLflow's own readers
across a relaunch (one run continued, not two). The worker's real run: tests/test_train_e2e.py (zero1)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from launcher.cli import main
from launcher.preflight import check_run_dir
from launcher.train import tracking

TINY = ["--model", "tiny-llama", "--gpus", "1x2xA100", "--cpu", "--init", "random"]


def _dry(tmp_path, capsys, *extra) -> tuple[int, str]:
    code = main([*TINY, "--dry-run", "--name", "r", "--runs-dir", str(tmp_path), *extra])
    return code, capsys.readouterr().err.strip()


def test_report_to_is_recorded_and_a_bad_name_is_one_line(tmp_path, capsys):
    assert _dry(tmp_path, capsys, "--report-to", "wandb, tensorboard,wandb")[0] == 0
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    assert plan["training"]["report_to"] == ["wandb", "tensorboard"]
    code, err = _dry(tmp_path, capsys, "--report-to", "tensorbored", "--replan")
    assert code == 2 and "'tensorbored': a comma-separated list of tensorboard, wandb, mlflow, or none" in err
    assert _dry(tmp_path, capsys, "--report-to", "none", "--replan")[0] == 0
    assert json.loads((tmp_path / "r" / "plan.json").read_text())["training"]["report_to"] == []
    code, err = _dry(tmp_path, capsys, "--report-to", "mlflow", "--script", __file__, "--name", "p")
    assert code == 2 and "--report-to configure ftlaunch's worker" in err


def test_a_missing_tracker_library_stops_the_launch_before_any_rank(tmp_path, capsys, monkeypatch):
    assert _dry(tmp_path, capsys, "--report-to", "tensorboard,mlflow")[0] == 0
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(tracking.FtlaunchError) as exc:
        check_run_dir(tmp_path / "r")
    assert str(exc.value).startswith("--report-to mlflow needs mlflow-skinny, not installed") and "\n" not in str(exc.value)


def _run(trackers, steps, finished: bool) -> None:
    for s in steps:
        trackers.record({"step": s, "loss": 1.0 / s, "lr": 1e-3, "tokens_per_s": 100.0 * s, "peak_allocated_gib": None})
        if s % 2 == 0:
            trackers.record({"event": "eval", "step": s, "eval_loss": 2.0 / s, "eval_tokens": 10})
    trackers.record({"event": "checkpoint", "step": steps[-1]})  # not a chart point
    trackers.close(finished)


def test_a_relaunch_continues_the_same_tracked_run(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # what the worker sets for its default store
    (tmp_path / "logs").mkdir()
    _run(tracking.Trackers(tmp_path, ["tensorboard", "mlflow"], "r", {"zero_stage": 1}), [1, 2], finished=False)
    first = json.loads((tmp_path / "logs" / "tracking.json").read_text())
    _run(tracking.Trackers(tmp_path, ["tensorboard", "mlflow"], "r", {"zero_stage": 1}), [3, 4], finished=True)
    assert json.loads((tmp_path / "logs" / "tracking.json").read_text()) == first
    board = EventAccumulator(str(tmp_path / "tensorboard"))
    board.Reload()
    assert {e.step: e.value for e in board.Scalars("train/loss")} == pytest.approx({s: 1.0 / s for s in range(1, 5)})
    assert [e.step for e in board.Scalars("eval/loss")] == [2, 4]
    assert "train/peak_allocated_gib" not in board.Tags()["scalars"]  # null on the CPU: not charted
    client = MlflowClient(tracking_uri=first["mlflow"]["uri"])
    (experiment,) = [e for e in client.search_experiments() if e.name == "ftlaunch"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == first["mlflow"]["run_id"] and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "train/tokens_per_s")
    assert [(m.step, m.value) for m in history] == [(s, 100.0 * s) for s in range(1, 5)]
