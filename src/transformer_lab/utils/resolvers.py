"""The project's own `${name:...}` config resolvers, registered before Hydra composes a config."""

from __future__ import annotations

from omegaconf import OmegaConf

from transformer_lab.families import metric_mode
from transformer_lab.tracking import default_artifact_location

RESOLVERS = {
    "mlflow_artifact_location": default_artifact_location,  # conf/logger/mlflow.yaml
    "metric_mode": metric_mode,  # conf/callbacks/default.yaml: the checkpoint keeps the best by the metric's own mode
}


def register_resolvers() -> None:
    for name, resolver in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
