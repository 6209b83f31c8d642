"""Multimodal evaluation: every trained variant (one modality, all three in one sequence, late
fusion) scored on the same test rows, a comparison table and bar chart, and the joint model's
[CLS] attention over the patches, the word pieces and the columns of a few test rows."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig
from torchmetrics.functional.classification import multiclass_accuracy, multiclass_f1_score

from transformer_lab.data.multimodal import LABEL, TEXT, MultimodalDataModule
from transformer_lab.tasks.checkpoints import load_task
from transformer_lab.tasks.multimodal import MultimodalClassificationTask
from transformer_lab.tracking import runs as tracking
from transformer_lab.tracking.evaluations import log_comparison
from transformer_lab.utils import plots
from transformer_lab.utils.io import atomic_write_json, write_csv


def score(task: MultimodalClassificationTask, rows, images) -> tuple[dict[str, float], torch.Tensor]:
    """acc and macro_f1 of a checkpoint on parsed rows and their images, and its predicted classes."""
    inputs = task.preprocessor.encode_rows(rows, images)
    lookup = {name: i for i, name in enumerate(task.preprocessor.labels)}
    labels = torch.tensor([lookup[v] for v in rows[LABEL]])
    predictions = task.predict_inputs(inputs)[0].argmax(-1)
    n = len(lookup)
    return {"acc": multiclass_accuracy(predictions, labels, n, average="micro").item(),
            "macro_f1": multiclass_f1_score(predictions, labels, n, average="macro").item()}, predictions


def cls_attention(task: MultimodalClassificationTask, rows, images, predictions: torch.Tensor) -> list[dict]:
    """The last layer's [CLS] row (mean of heads) of each row, cut into the modalities' tokens."""
    inputs = task.preprocessor.encode_rows(rows, images)
    _, weights = task.predict_inputs(inputs, return_weights=True)
    cls_row = weights[-1].mean(dim=1)[:, 0]  # (rows, 1 + tokens)
    spans = task.model.token_spans(**{k: v for k, v in inputs.items() if k != "present"})
    config, preprocessor = task.model.config, task.preprocessor
    encoder = preprocessor.table_encoder
    column_names = [*encoder.categorical, *encoder.continuous, *(f"{c} missing" for c in encoder.indicators)]
    products = []
    for i in range(len(rows)):
        weight = cls_row[i]
        product = {"caption": f"{rows[LABEL].iat[i]} → {preprocessor.labels[predictions[i]]}", "image": None,
                   "patches": None, "words": [], "columns": [],
                   "shares": {m: float(weight[span].sum()) for m, span in spans.items()}}
        if "image" in spans and bool(inputs["present"][i, 0]):
            grid = config.image_size // config.patch_size
            product["image"] = images[i]
            product["patches"] = weight[spans["image"]].view(grid, grid).numpy()
        if "text" in spans:
            ids = inputs["input_ids"][i]
            n_words = int((ids != 0).sum())
            pieces = [preprocessor.tokenizer.id_to_token(int(t)) for t in ids[:n_words]]
            product["words"] = list(zip(pieces, weight[spans["text"]][:n_words].tolist()))
            product["caption"] += f"\n“{rows[TEXT].iat[i][:40]}”"
        if "table" in spans:
            product["columns"] = list(zip(column_names, weight[spans["table"]].tolist()))
        products.append(product)
    return products


def evaluate(cfg: DictConfig) -> dict:
    """Every variant in cfg.models scored on the same split (acc, macro-F1): comparison.{json,csv,png},
    each variant's scores into its training run, the comparison into a `comparison` run; and the
    joint model's [CLS] attention over a few rows' patches, word pieces and columns (attention.png)."""
    tracking.check_tracking(cfg)
    torch.manual_seed(cfg.seed)
    output_dir = Path(cfg.paths.output_dir)
    rows, images = MultimodalDataModule(cfg.data.prepared_dir).split_rows(cfg.split)
    comparison, figures, tasks = [], [], {}
    for name, directory in cfg.models.items():
        task = load_task(Path(directory, "checkpoints", "best.ckpt"), MultimodalClassificationTask,
                         f"train_multimodal@{name}")
        scores, predictions = score(task, rows, images)
        comparison.append({"model": name, **scores})
        tasks[name] = (task, predictions)

    metrics = {r["model"]: {f"{cfg.split}/{m}": r[m] for m in ("acc", "macro_f1")} for r in comparison}
    metrics_path = output_dir / "comparison.json"
    atomic_write_json(metrics_path, metrics)
    write_csv(output_dir / "comparison.csv", comparison)
    figures.append(plots.model_comparison(comparison, ["acc", "macro_f1"], output_dir / "comparison.png",
                                          f"{cfg.split} split, {len(rows)} rows: each modality alone, "
                                          "joint and late fusion"))
    joint = next((name for name, (task, _) in tasks.items() if task.model.config.fusion == "joint"
                  and len(task.model.config.modalities) > 1), None)
    if joint and cfg.attention_rows:
        task, predictions = tasks[joint]
        shown = min(cfg.attention_rows, len(rows))
        products = cls_attention(task, rows.iloc[:shown], images[:shown], predictions[:shown])
        figures.append(plots.modality_attention(products, output_dir / "attention.png",
                                                f"{joint}: last layer's [CLS] attention (mean of heads), "
                                                f"first {shown} {cfg.split} rows (true → predicted)"))
    log_comparison(cfg, metrics, dict(cfg.models), [metrics_path, output_dir / "comparison.csv", *figures])
    return metrics
