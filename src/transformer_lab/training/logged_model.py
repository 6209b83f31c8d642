"""A training run's model logged into its MLflow run and registered: called by the stage that trained
it, so that the inference stack is imported where a model is logged and nowhere else."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lightning.pytorch.loggers import MLFlowLogger

from transformer_lab.tracking import registry


@dataclass(frozen=True)
class RegisterAs:
    """A run's model as a version of registered model `name`, champion by `metric` (mode: max or min)
    over a champion scored on the same data (data_fingerprint), or whatever it scored with force_champion."""
    name: str
    metric: str
    mode: str
    data_fingerprint: str | None
    force_champion: bool = False


def log_pipeline_model(logger: MLFlowLogger, checkpoint: str | Path, register_as: RegisterAs | None = None) -> str | None:
    """The pipeline of the checkpoint (or of a baseline's folder) as the run's MLflow model
    (inference/served.py) and, with register_as, a registered version of it; prints whether it took the alias
    `champion` and why. Returns the model's URI (None for a model no pipeline reads)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    # here, once training is done: the pyfunc's module (and MLflow's pyfunc with it) is needed only now
    from transformer_lab.inference import served

    mlflow.set_tracking_uri(logger._tracking_uri)
    uri = served.log_pipeline_model(logger.run_id, checkpoint)
    if uri and register_as:
        name = register_as.name
        try:
            registered = registry.register(uri, name, logger.run_id, register_as.metric, register_as.mode,
                                          register_as.data_fingerprint, force=register_as.force_champion)
        except MlflowException as err:  # e.g. a file store, which has no registry
            print(f"model registry: not registered ({str(err).splitlines()[0][:160]})")
        else:
            print(f"model registry: {name} version {registered.version} "
                  f"{'is' if registered.champion else 'is not'} {registry.CHAMPION}: {registered.reason} "
                  f"(models:/{name}@{registry.CHAMPION})")
    return uri
