"""The project's own `${name:...}` config resolvers, registered before Hydra composes a config.
Nothing heavy is imported here: every entry point registers them before it parses its command line."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf


def default_artifact_location(tracking_dir: str, experiment: str) -> str | None:
    """Where a new MLflow experiment keeps artifacts: mlruns/<experiment>/ beside the local store
    by default, the server's choice when MLFLOW_TRACKING_URI points elsewhere."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return None
    return Path(tracking_dir, "mlruns", experiment).resolve().as_uri()


def register_resolver(name: str, resolver) -> None:
    if not OmegaConf.has_resolver(name):
        OmegaConf.register_new_resolver(name, resolver)


def register_resolvers() -> None:
    """What every entry point's configs use. `metric_mode` (conf/callbacks/) is registered by
    families.py, which training imports: data stages then do not depend on the family registry."""
    register_resolver("mlflow_artifact_location", default_artifact_location)  # conf/logger/mlflow.yaml
