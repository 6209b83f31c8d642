"""An evaluation in MLflow: scores and files logged into the training run they score, and a
comparison of several trained models as a run of its own."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from transformer_lab.errors import TransformerLabError
from transformer_lab.tracking import runs as tracking


def mlflow_run_for(cfg: DictConfig, run_reference: dict | None, run_name: str = "evaluate"):
    """The training run's MLflow run if it still exists, else a new run (`run_name`) in the same experiment."""
    import mlflow
    from mlflow import MlflowClient

    uri = cfg.paths.mlflow_tracking_uri  # answering: every command checks it first (tracking.check_tracking)
    client = MlflowClient(uri)
    if run_reference:
        try:
            return client, client.get_run(run_reference["run_id"]).info.run_id
        except mlflow.exceptions.MlflowException as err:
            # Only a run that is gone gets a new one; a server that fails must not leave a duplicate.
            if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise TransformerLabError(f"MLflow {uri}: cannot read run {run_reference['run_id']} "
                                          f"({str(err).splitlines()[0][:200]})") from None
    experiment_id = tracking.experiment_id(client, cfg.task_name, cfg.paths.tracking_dir)
    return client, client.create_run(experiment_id, tags={"mlflow.runName": run_name}).info.run_id


def log_into_training_run(cfg: DictConfig, metrics: dict[str, float], files: list[str | Path],
                          artifact_path: str | None = "evaluation", run_reference: dict | None = None) -> str | None:
    """Scores and files of an evaluation, logged into the run that trained the model (the run
    reference its training stage wrote; `cfg.run_reference` unless given), so that one MLflow run
    holds a model's training and its evaluation. Nothing without a logger; returns the run id."""
    if not cfg.get("logger"):
        return None
    reference = run_reference if run_reference is not None else tracking.read_run_reference(cfg.run_reference)
    client, run_id = mlflow_run_for(cfg, reference)
    for name, value in metrics.items():
        client.log_metric(run_id, name, float(value))
    for path in files:
        client.log_artifact(run_id, str(path), artifact_path)
    return run_id


def log_comparison(cfg: DictConfig, metrics: dict[str, dict[str, float]], directories: dict[str, str | Path],
                   files: list[str | Path]) -> None:
    """A comparison of several trained models in MLflow: each model's scores (`eval/...`) into the run
    that trained it (the run reference in its training directory), and the whole comparison (every
    score as `<model>/<metric>`, and the files) into a `comparison` run of the experiment."""
    if not cfg.get("logger"):
        return
    for name, directory in directories.items():
        reference = tracking.read_run_reference(Path(directory, tracking.RUN_REFERENCE))
        if reference:
            log_into_training_run(cfg, {f"eval/{k}": v for k, v in metrics[name].items()}, [], run_reference=reference)
    client, run_id = mlflow_run_for(cfg, None, run_name="comparison")
    for name, scores in metrics.items():
        for key, value in scores.items():
            client.log_metric(run_id, f"{name}/{key}", float(value))
    for path in files:
        client.log_artifact(run_id, str(path))
    client.set_terminated(run_id)
