"""Transfer, side by side: one fine-tuning task trained from several starts (from scratch, from this
project's pre-trained BERT, from published weights such as MiniLM) with the same data and recipe,
compared on the scores each run wrote (its metrics.json: the best checkpoint on validation and test)."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from transformer_lab.errors import TransformerLabError
from transformer_lab.tracking import runs as tracking
from transformer_lab.tracking.evaluations import log_comparison
from transformer_lab.utils import plots
from transformer_lab.utils.io import atomic_write_json, write_csv


def compare(cfg: DictConfig) -> dict[str, dict[str, float]]:
    """A table (comparison.json, comparison.csv) and a bar chart (comparison.png) of cfg.metrics for
    every start in cfg.starts ({name: {dir, stage}}), logged into each training run and into a
    `comparison` run of the experiment."""
    tracking.check_tracking(cfg)
    output_dir = Path(cfg.paths.output_dir)
    rows = []
    for name, start in cfg.starts.items():
        path = Path(start.dir, "metrics.json")
        if not path.is_file():
            raise TransformerLabError(f"{path}: not found; train it first (`dvc repro {start.stage}`)")
        scores = json.loads(path.read_text())
        missing = [m for m in cfg.metrics if m not in scores]
        if missing:
            raise TransformerLabError(f"{path}: no {missing[0]!r} (it has {', '.join(sorted(scores))})")
        rows.append({"start": name, **{m: round(float(scores[m]), 4) for m in cfg.metrics},
                     "params": int(scores.get("params", 0))})
    metrics = {row["start"]: {m: row[m] for m in cfg.metrics} for row in rows}
    metrics_path = output_dir / "comparison.json"
    atomic_write_json(metrics_path, metrics)
    write_csv(output_dir / "comparison.csv", rows)
    figure = plots.model_comparison(rows, list(cfg.metrics), output_dir / "comparison.png", cfg.title, name_key="start")
    log_comparison(cfg, metrics, {name: start.dir for name, start in cfg.starts.items()},
                   [metrics_path, output_dir / "comparison.csv", figure])
    return metrics
