"""Experiment tracking (--report-to): the worker's metrics, as rank 0 logs them to metrics.jsonl,
also sent through each project's own library.

- tensorboard: event files in RUN/tensorboard (torch's SummaryWriter; `tensorboard --logdir RUN`).
- wandb: offline by default, into RUN/wandb (`wandb sync RUN/wandb/offline-run-*` uploads it);
  WANDB_MODE=online with WANDB_API_KEY in the job's environment logs live. WANDB_PROJECT names the
  project (default "ftlaunch").
- mlflow: the tracking server MLFLOW_TRACKING_URI names, else a local file store in RUN/mlruns
  (`MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri RUN/mlruns`; MLflow 3 keeps its file
  store in maintenance mode and needs that opt-in; the skinny package has no SQLite store).

Keys only ever come from the environment. A relaunch continues the same W&B and MLflow run (their
ids are kept in RUN/logs/tracking.json); TensorBoard adds an event file to the same folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
from pathlib import Path

from launcher.errors import FtlaunchError

TRACKERS = ("tensorboard", "wandb", "mlflow")
# what pip installs for each (the module imported is the tracker's own name)
INSTALL = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny"}


def check_installed(report_to: list[str]) -> None:
    """Before any rank: every tracker asked for can be imported here."""
    missing = [t for t in report_to if importlib.util.find_spec(t) is None]
    if missing:
        raise FtlaunchError(
            f"--report-to {','.join(missing)} needs {' and '.join(INSTALL[t] for t in missing)}, not installed in "
            f"this environment: pip install {' '.join(INSTALL[t] for t in missing)} (or 'ftlaunch[tracking]'), "
            "or leave it out of --report-to"
        )


def _metrics(record: dict) -> tuple[int, dict[str, float]] | None:
    """(step, scalars) of a metrics.jsonl record worth a chart point, or None."""
    if "step" in record and "loss" in record:
        keep = ("loss", "lr", "tokens_per_s", "step_s", "peak_allocated_gib", "peak_reserved_gib", "host_rss_gib")
        return record["step"], {f"train/{k}": float(record[k]) for k in keep if isinstance(record.get(k), int | float)}
    if record.get("event") == "eval":
        return record["step"], {"eval/loss": float(record["eval_loss"])}
    return None


class Trackers:
    """The trackers rank 0 reports to; record() takes each metrics.jsonl record."""

    def __init__(self, run_dir: Path, report_to: list[str], name: str, params: dict) -> None:
        self.run_dir, self.sinks = run_dir, []
        ids_file = run_dir / "logs" / "tracking.json"
        try:
            ids = json.loads(ids_file.read_text())
        except (OSError, ValueError):
            ids = {}
        for kind in report_to:
            self.sinks.append(getattr(self, f"_{kind}")(name, params, ids))
        ids_file.write_text(json.dumps(ids, indent=1) + "\n")

    def _tensorboard(self, name: str, params: dict, ids: dict):
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        writer.add_text("plan", f"```\n{json.dumps(params, indent=1)}\n```")

        def log(step, scalars):
            for key, value in scalars.items():
                writer.add_scalar(key, value, step)
            writer.flush()

        return log, lambda finished: writer.close()

    def _wandb(self, name: str, params: dict, ids: dict):
        import wandb

        ids.setdefault("wandb", secrets.token_hex(4))  # the id a relaunch resumes
        run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "ftlaunch"),
            name=name,
            id=ids["wandb"],
            resume="allow",
            dir=str(self.run_dir),
            mode=os.environ.get("WANDB_MODE", "offline"),
            config=params,
        )
        return (lambda step, scalars: run.log(scalars, step=step)), lambda finished: run.finish(exit_code=0 if finished else 1)

    def _mlflow(self, name: str, params: dict, ids: dict):
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # MLflow 3 keeps its file store in maintenance and asks for this opt-in to use it
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (self.run_dir / "mlruns").resolve().as_uri()
        client = MlflowClient(tracking_uri=uri)
        if "mlflow" not in ids:
            experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", "ftlaunch")
            found = client.get_experiment_by_name(experiment)
            exp_id = found.experiment_id if found else client.create_experiment(experiment)
            run = client.create_run(exp_id, run_name=name)
            ids["mlflow"] = {"uri": uri, "run_id": run.info.run_id}
            for key, value in params.items():
                client.log_param(run.info.run_id, key, str(value)[:500])
        run_id = ids["mlflow"]["run_id"]

        def log(step, scalars):
            for key, value in scalars.items():
                client.log_metric(run_id, key, value, step=step)

        return log, lambda finished: client.set_terminated(run_id, "FINISHED" if finished else "KILLED")

    def record(self, record: dict) -> None:
        point = _metrics(record)
        if point is not None:
            for log, _ in self.sinks:
                log(*point)

    def close(self, finished: bool) -> None:
        """finished: the run's last step is done (False: preempted, to be resumed)."""
        for _, close in self.sinks:
            close(finished)
