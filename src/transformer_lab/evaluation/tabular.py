"""Tabular evaluation: every trained tabular model (TabTransformer, FT-Transformer, MLP, XGBoost,
logistic regression) scored on the same prepared split with the same metrics, as a comparison
table and a bar chart."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from transformer_lab.data.tabular import fold_rows, read_prepared
from transformer_lab.tasks.checkpoints import load_task
from transformer_lab.tasks.tabular_classification import TabularClassificationTask, score_probabilities
from transformer_lab.tracking import runs as tracking
from transformer_lab.tracking.evaluations import log_comparison
from transformer_lab.training import baselines
from transformer_lab.utils import plots
from transformer_lab.utils.io import atomic_write_json, write_csv


def evaluate(cfg: DictConfig) -> dict:
    """Every trained tabular model (TabTransformer, MLP, XGBoost, logistic regression) scored on the
    same prepared split with the same metrics: a comparison table (JSON + CSV) and a bar chart,
    each model's scores logged into its own run, the comparison into a run of its own."""
    tracking.check_tracking(cfg)
    torch.manual_seed(cfg.seed)
    output_dir = Path(cfg.paths.output_dir)
    table, schema, encoder = read_prepared(cfg.data.prepared_dir)
    split = fold_rows(table, None)[cfg.split]
    rows = encoder.transform(split)
    labels = torch.from_numpy(rows.labels)
    comparison = []
    for name, directory in cfg.models.items():
        stage = {"xgboost": "train_xgboost", "logistic_regression": "train_logreg"}.get(name, f"train_tabular@{name}")
        checkpoint = Path(directory, "checkpoints", "best.ckpt")
        if checkpoint.is_file():
            task = load_task(checkpoint, TabularClassificationTask, stage)
            probabilities = task.predict(split[schema.features])  # the parsed rows, re-read by its own preprocessor
        else:
            probabilities = torch.from_numpy(
                baselines.predict(baselines.load(directory, stage), encoder, rows)).float()
        comparison.append({"model": name, **score_probabilities(probabilities, labels)})

    metric_names = ["auroc", "acc", "f1"]
    metrics = {r["model"]: {f"{cfg.split}/{m}": r[m] for m in metric_names} for r in comparison}
    metrics_path = output_dir / "comparison.json"
    atomic_write_json(metrics_path, metrics)
    write_csv(output_dir / "comparison.csv", comparison)
    figure = plots.model_comparison(comparison, metric_names, output_dir / "comparison.png",
                                    f"{schema.name}: {cfg.split} split, {len(labels)} rows")
    log_comparison(cfg, metrics, dict(cfg.models), [metrics_path, output_dir / "comparison.csv", figure])
    return metrics
