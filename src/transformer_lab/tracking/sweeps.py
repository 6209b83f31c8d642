"""Hydra callbacks: what happens around a whole multirun sweep (configured in conf/hydra/default.yaml)."""

from __future__ import annotations

import atexit
import json
import logging
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from transformer_lab.utils.cli import user_error
from transformer_lab.utils.io import atomic_write_json, write_csv

SWEEP_PARENT = "mlflow_sweep_parent.json"
SWEEP_PARENT_CLAIM = "mlflow_sweep_parent.claim"
JOB_OUTCOME = "job_outcome.json"  # in each job's folder: its overrides and, if it failed, why

log = logging.getLogger(__name__)


def sweep_parent_run_id(sweep_dir: str | Path) -> str | None:
    """The MLflow parent run of the sweep writing into sweep_dir, if one was created."""
    path = Path(sweep_dir, SWEEP_PARENT)
    return json.loads(path.read_text())["run_id"] if path.is_file() else None


def job_error(job_return: JobReturn) -> BaseException | None:
    """What a failed job raised (None if it did not fail)."""
    # not the public return_value: it raises the error, after a line of its own on stderr
    return job_return._return_value if job_return.status == JobStatus.FAILED else None


def one_line_reason(error: BaseException) -> tuple[str, bool]:
    """Why a job failed, in one line, and whether the user caused it (a TransformerLabError, also
    behind an error that wraps it, as Hydra's instantiate does)."""
    cause = user_error(error)
    if cause is not None:
        return str(cause).strip().split("\n")[0], True
    first = str(error).strip().split("\n")[0]
    return f"{type(error).__name__}: {first}" if first else type(error).__name__, False


def job_outcomes(sweep_dir: str | Path) -> list[dict]:
    """The outcome of every job of the sweep in sweep_dir that has ended, in job order."""
    outcomes = [json.loads(path.read_text()) for path in Path(sweep_dir).rglob(JOB_OUTCOME)]
    return sorted(outcomes, key=lambda outcome: outcome["job"])


def failures_line(outcomes: list[dict]) -> str:
    """'2 of 5 jobs failed: #1 (model.n_heads=3) <reason>; ...', each job named by the overrides that
    set it apart from the sweep's other jobs."""
    failed = [o for o in outcomes if o["failure"]]
    shared = set.intersection(*(set(o["overrides"]) for o in outcomes)) if len(outcomes) > 1 else set()
    named = [f"#{o['job']} ({' '.join(x for x in o['overrides'] if x not in shared)}) {o['failure']}" for o in failed]
    return f"{len(failed)} of {len(outcomes)} jobs failed: " + "; ".join(named)


def _rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", 0)))


class SweepRecord(Callback):
    """A multirun, recorded whole. It becomes one MLflow parent run; every job's run is tagged as its
    child (`mlflow.parentRunId`, set in train.py), so the MLflow UI nests the trials under the sweep
    and its compare view lines them up. Created once, in the launching process, before any job starts
    (also when a launcher sends the jobs elsewhere, e.g. SLURM: they read the id from the sweep folder).

    Every job runs, whatever the others did. Hydra's sweepers stop at a failed job (the basic one
    after its batch, Optuna's at once) and then skip on_multirun_end, which would leave the parent
    RUNNING and end the command in Hydra's traceback. So a failed job is recorded here (JOB_OUTCOME
    in its folder; its MLflow run FAILED, made now if the job failed before it had one, with the
    one-line reason in the tag `failure`) and handed back to the sweeper as a finished job that
    returned None: Optuna's sweeper records that trial FAILED (its log says the value is no number)
    and, the job not raising, goes on (NaN would not do: Optuna refuses it and the sweeper then
    fails telling it so). At the sweep's end the parent run ends FINISHED,
    or FAILED with the failures counted (metrics jobs_total and jobs_failed, tag failed_jobs), and the
    command exits 2 if a job failed by the user's error, 1 if one raised anything else."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not (config.get("logger") and "mlflow" in config.logger and config.get("paths")):
            return
        if _rank():
            return  # every process of a torchrun-started sweep runs this; one parent, from rank 0
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        # should the sweep stop before on_multirun_end (a sweeper's own error, Ctrl-C), the parent
        # still ends, FAILED, with the jobs counted so far
        atexit.register(self._end_parent, sweep_dir, ended_early=True)
        # Several workers of one sweep (parallel Optuna workers sharing a study, each started on
        # its own) share the sweep folder and so one parent run: the first to claim the folder
        # creates it, the others wait for its id.
        try:
            os.close(os.open(sweep_dir / SWEEP_PARENT_CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            self._wait_for_parent(sweep_dir)
            return
        from mlflow import MlflowClient

        from transformer_lab.tracking import runs as tracking

        client = MlflowClient(config.paths.mlflow_tracking_uri)
        experiment_id = tracking.experiment_id(client, config.task_name, config.paths.tracking_dir)
        overrides = " ".join(config.hydra.overrides.task)
        run = client.create_run(experiment_id, run_name=f"sweep {sweep_dir.name}",
                                tags={"sweep_dir": str(sweep_dir), "hydra_overrides": overrides or "(none)",
                                      "sweeper": config.hydra.sweeper._target_.rsplit(".", 1)[-1]})
        metric = config.get("optimized_metric")
        atomic_write_json(sweep_dir / SWEEP_PARENT, {
            "run_id": run.info.run_id, "experiment_id": experiment_id, "tracking_uri": config.paths.mlflow_tracking_uri,
            # what the sweep is scored by: the parent names its best trial by it
            "metric": metric, "mode": OmegaConf.select(config, "callbacks.model_checkpoint.mode", default=None)})

    @staticmethod
    def _wait_for_parent(sweep_dir: Path, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not (sweep_dir / SWEEP_PARENT).is_file():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{sweep_dir / SWEEP_PARENT_CLAIM} exists but no parent run was recorded in "
                                   f"{timeout_s:.0f} s: the worker that claimed the sweep folder failed; remove "
                                   "the claim file or use a new hydra.sweep.dir")
            time.sleep(0.2)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return  # a single run's failure is the command's own
        error = job_error(job_return)
        reason, by_user = one_line_reason(error) if error else (None, True)
        if error is not None:
            if not by_user:  # Hydra kept the exception quietly; a bug's traceback is for the console and the job's log
                log.error("job %s failed", config.hydra.job.num, exc_info=error)
            job_return.status, job_return.return_value = JobStatus.COMPLETED, None
        if _rank():
            return  # the processes of a torchrun-started sweep run every job together; rank 0 records it
        output_dir = Path(config.hydra.runtime.output_dir)
        atomic_write_json(output_dir / JOB_OUTCOME, {"job": int(config.hydra.job.num), "failure": reason,
                                                     "user_error": by_user, "overrides": list(job_return.overrides)})
        if error is not None and config.get("logger") and "mlflow" in config.logger:
            from transformer_lab.tracking import runs as tracking

            tracking.record_failed_job(config, output_dir, list(job_return.overrides),
                                       sweep_parent_run_id(config.hydra.sweep.dir), reason)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        atexit.unregister(self._end_parent)
        outcomes = job_outcomes(sweep_dir)
        self._end_parent(sweep_dir)
        failed = [outcome for outcome in outcomes if outcome["failure"]]
        if failed:
            print(f"error: {failures_line(outcomes)}", file=sys.stderr, flush=True)
            sys.exit(2 if all(outcome["user_error"] for outcome in failed) else 1)

    @staticmethod
    def _end_parent(sweep_dir: Path, ended_early: bool = False) -> None:
        """The parent run ends with its jobs counted; with parallel workers each worker that ends
        counts again, the last with every job."""
        path = sweep_dir / SWEEP_PARENT
        if _rank() or not path.is_file():
            return
        from mlflow import MlflowClient

        reference = json.loads(path.read_text())
        client, run_id = MlflowClient(reference["tracking_uri"]), reference["run_id"]
        outcomes = job_outcomes(sweep_dir)
        failed = [outcome for outcome in outcomes if outcome["failure"]]
        client.log_metric(run_id, "jobs_total", len(outcomes))
        client.log_metric(run_id, "jobs_failed", len(failed))
        if failed:
            client.set_tag(run_id, "failed_jobs", failures_line(outcomes)[:5000])
        if ended_early:
            client.set_tag(run_id, "ended_early", "the sweep stopped before its last job (see the command's output)")
        try:
            summarise_sweep(client, reference)
        except Exception:  # the summary is a view of the trials; it must not leave the parent RUNNING
            log.warning("the sweep's summary was not recorded in its parent run %s", run_id, exc_info=True)
        client.set_terminated(run_id, "FAILED" if failed or ended_early else "FINISHED")


def parsed_overrides(line: str) -> dict[str, str]:
    """`a=1 b='x y'` (a run's hydra_overrides tag) as {"a": "1", "b": "x y"}."""
    try:
        words = shlex.split(line)
    except ValueError:  # an unbalanced quote: as typed
        words = line.split()
    return {key.lstrip("+"): value for key, equals, value in (w.partition("=") for w in words) if equals}


def trial_rows(runs, metric: str | None) -> tuple[list[dict], list[str]]:
    """One row per trial (run, run_id, status, the swept settings, the metric), and the settings swept:
    those whose values differ between trials."""
    overrides = [parsed_overrides(run.data.tags.get("hydra_overrides", "")) for run in runs]
    keys = list(dict.fromkeys(key for trial in overrides for key in trial))
    swept = [key for key in keys if len({trial.get(key) for trial in overrides}) > 1]
    rows = []
    for run, trial in zip(runs, overrides):
        row = {"run": run.info.run_name, "run_id": run.info.run_id, "status": run.info.status}
        row.update({key: trial.get(key) for key in swept})
        if metric:
            row[metric] = run.data.metrics.get(metric)
        rows.append(row)
    return rows, swept


def best_trial(rows: list[dict], metric: str | None, mode: str | None) -> dict | None:
    scored = [row for row in rows if metric and row.get(metric) is not None and row["status"] == "FINISHED"]
    if not scored or mode not in ("min", "max"):
        return None
    return (max if mode == "max" else min)(scored, key=lambda row: row[metric])


def summarise_sweep(client, reference: dict) -> dict | None:
    """The parent run says what the sweep found: its best trial (params `best_run_id` and
    `best_overrides`, the swept settings that made it; metric `best/<metric>`), and every trial
    as artifacts, `trials.csv` and `trials.png` (the metric against each swept setting). Returns
    the best trial's row."""
    from mlflow.exceptions import MlflowException

    from transformer_lab.utils import plots

    run_id, metric, mode = reference["run_id"], reference.get("metric"), reference.get("mode")
    experiment = reference.get("experiment_id") or client.get_run(run_id).info.experiment_id
    runs = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{run_id}'", max_results=10000,
                              order_by=["attributes.start_time ASC"])
    if not runs:
        return None
    rows, swept = trial_rows(runs, metric)
    best = best_trial(rows, metric, mode)
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp, "trials.csv")
        write_csv(table, rows)
        client.log_artifact(run_id, str(table))
        if any(row.get(metric) is not None for row in rows):
            client.log_artifact(run_id, str(plots.sweep_trials(rows, swept, metric, Path(tmp, "trials.png"), best)))
    if best is not None:
        client.log_metric(run_id, f"best/{metric}", best[metric])
        chosen = {"best_run_id": best["run_id"],
                  "best_overrides": " ".join(f"{key}={best[key]}" for key in swept) or "(one trial)"}
        for key, value in chosen.items():
            try:
                client.log_param(run_id, key, value)
            except MlflowException:  # parallel workers: an earlier worker's best, now beaten; params do not change
                client.set_tag(run_id, key, value)
    return best


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
