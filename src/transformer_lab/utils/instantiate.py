"""Building objects from config groups that hold several named components."""

from __future__ import annotations

from hydra.utils import instantiate
from omegaconf import DictConfig


def instantiate_collection(group: DictConfig | None) -> list:
    """Each entry with a `_target_` becomes an object; other keys (settings, or null for a component
    switched off by an override) are skipped."""
    if not group:
        return []
    return [instantiate(entry) for entry in group.values() if isinstance(entry, DictConfig) and "_target_" in entry]
