"""The project's own `${name:...}` config resolvers, registered before Hydra composes a config."""

from __future__ import annotations

from omegaconf import OmegaConf

from transformer_lab.tracking import default_artifact_location


def register_resolver(name: str, resolver) -> None:
    if not OmegaConf.has_resolver(name):
        OmegaConf.register_new_resolver(name, resolver)


def register_resolvers() -> None:
    """What every entry point's configs use. `metric_mode` (conf/callbacks/) is registered by
    families.py, which training imports: data stages then do not depend on the family registry."""
    register_resolver("mlflow_artifact_location", default_artifact_location)  # conf/logger/mlflow.yaml
