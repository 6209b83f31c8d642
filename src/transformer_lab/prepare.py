"""Data preparation: read a source, build vocabularies from train, write the prepared set."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from transformer_lab.data.atis import load_atis, prepare_atis


def prepare(cfg: DictConfig) -> dict:
    data = cfg.data
    builtin = OmegaConf.to_container(data.builtin, resolve=True) if data.get("builtin") else None
    splits = load_atis(data.source, local_dir=data.get("local_dir"), hub_id=data.get("hub_id"), builtin=builtin)
    return prepare_atis(splits, data.prepared_dir, lowercase=data.lowercase, min_word_count=data.min_word_count)
