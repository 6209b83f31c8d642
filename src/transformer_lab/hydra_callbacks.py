"""Hydra callbacks: what happens around a whole multirun sweep (configured in conf/hydra/default.yaml)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from transformer_lab.utils.io import atomic_write_json

SWEEP_PARENT = "mlflow_sweep_parent.json"
SWEEP_PARENT_CLAIM = "mlflow_sweep_parent.claim"


def sweep_parent_run_id(sweep_dir: str | Path) -> str | None:
    """The MLflow parent run of the sweep writing into sweep_dir, if one was created."""
    path = Path(sweep_dir, SWEEP_PARENT)
    return json.loads(path.read_text())["run_id"] if path.is_file() else None


class MLflowSweepParent(Callback):
    """A multirun sweep becomes one MLflow parent run; every job's run is tagged as its child
    (`mlflow.parentRunId`, set in train.py), so the MLflow UI nests the trials under the sweep and
    its compare view lines them up. Created once, in the launching process, before any job starts
    (also when a launcher sends the jobs elsewhere, e.g. SLURM: they read the id from the sweep folder)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not (config.get("logger") and "mlflow" in config.logger and config.get("paths")):
            return
        if int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", 0))):
            return  # every process of a torchrun-started sweep runs this; one parent, from rank 0
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        # Several workers of one sweep (parallel Optuna workers sharing a study, each started on
        # its own) share the sweep folder and so one parent run: the first to claim the folder
        # creates it, the others wait for its id.
        try:
            os.close(os.open(sweep_dir / SWEEP_PARENT_CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            self._wait_for_parent(sweep_dir)
            return
        from mlflow import MlflowClient

        from transformer_lab import tracking

        client = MlflowClient(config.paths.mlflow_tracking_uri)
        experiment_id = tracking.experiment_id(client, config.task_name, config.paths.tracking_dir)
        overrides = " ".join(config.hydra.overrides.task)
        run = client.create_run(experiment_id, run_name=f"sweep {sweep_dir.name}",
                                tags={"sweep_dir": str(sweep_dir), "hydra_overrides": overrides or "(none)",
                                      "sweeper": config.hydra.sweeper._target_.rsplit(".", 1)[-1]})
        atomic_write_json(sweep_dir / SWEEP_PARENT, {"run_id": run.info.run_id,
                                                    "tracking_uri": config.paths.mlflow_tracking_uri})

    @staticmethod
    def _wait_for_parent(sweep_dir: Path, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not (sweep_dir / SWEEP_PARENT).is_file():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{sweep_dir / SWEEP_PARENT_CLAIM} exists but no parent run was recorded in "
                                   f"{timeout_s:.0f} s: the worker that claimed the sweep folder failed; remove "
                                   "the claim file or use a new hydra.sweep.dir")
            time.sleep(0.2)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        path = Path(config.hydra.sweep.dir, SWEEP_PARENT)
        if path.is_file():
            from mlflow import MlflowClient

            reference = json.loads(path.read_text())
            # with parallel workers the first to finish marks it; the others' children still log
            MlflowClient(reference["tracking_uri"]).set_terminated(reference["run_id"])


class DistributedJobReset(Callback):
    """Multirun + DDP: Lightning's launcher leaves its variables (LOCAL_RANK, WORLD_SIZE,
    MASTER_PORT, ...) and the process group behind in a job's main process; the sweep's next job
    would then believe its processes were started externally and wait for peers that never come.
    Every job starts from the environment it found."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._environment = dict(os.environ)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(self._environment)
