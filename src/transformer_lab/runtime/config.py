"""Composing the project's Hydra configs outside `@hydra.main` (benchmarks, notebooks, tests)."""

from __future__ import annotations

import os
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from transformer_lab.utils.resolvers import register_resolvers

PROJECT_ROOT = Path(__file__).resolve().parents[3]


def compose_config(config_name: str, overrides: list[str], output_dir: str | Path,
                   config_dir: str | Path | None = None) -> DictConfig:
    """The same config `python pipelines/<config_name>.py overrides...` would build, writing into output_dir."""
    register_resolvers()
    import transformer_lab.families  # noqa: F401  (registers metric_mode for the training configs)

    os.environ.setdefault("PROJECT_ROOT", str(PROJECT_ROOT))
    config_dir = Path(config_dir or Path(os.environ["PROJECT_ROOT"]) / "conf").resolve()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        cfg = compose(config_name, overrides=[*overrides, f"++paths.output_dir={Path(output_dir).resolve()}"],
                      return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # so that ${hydra:...} interpolations resolve
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg
