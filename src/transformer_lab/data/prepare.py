"""Data preparation: whatever `data.prepare` names, with its arguments from the data config."""

from __future__ import annotations

from hydra.utils import instantiate
from omegaconf import DictConfig


def prepare(cfg: DictConfig) -> dict:
    return instantiate(cfg.data.prepare, _convert_="all")
