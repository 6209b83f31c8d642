"""Vision Transformer evaluation: accuracy and macro-F1 on a prepared image split, the confusion
matrix, a grid of misclassified images and the last layer's attention over the patches."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig
from torchmetrics.functional.classification import multiclass_accuracy, multiclass_f1_score

from transformer_lab.data.images import read_split
from transformer_lab.tasks.checkpoints import load_task
from transformer_lab.tasks.image_classification import ImageClassificationTask
from transformer_lab.tracking import runs as tracking
from transformer_lab.tracking.evaluations import log_into_training_run
from transformer_lab.utils import plots
from transformer_lab.utils.io import atomic_write_json, write_csv


def evaluate(cfg: DictConfig) -> dict:
    """Accuracy and macro-F1 of a ViT checkpoint on a prepared image split, the confusion matrix,
    a grid of misclassified images and the last layer's [CLS] attention over the patches."""
    tracking.check_tracking(cfg)
    torch.manual_seed(cfg.seed)
    output_dir = Path(cfg.paths.output_dir)
    task = load_task(cfg.checkpoint, ImageClassificationTask, "train_vit")
    raw_images, labels = read_split(cfg.data.prepared_dir, cfg.split)
    predictions = task.predict(raw_images)[0].argmax(-1)  # uint8, normalised by the checkpoint's own statistics
    targets = torch.from_numpy(labels)
    classes = task.preprocessor.classes
    n = len(classes)
    metrics = {f"{cfg.split}/acc": multiclass_accuracy(predictions, targets, n, average="micro").item(),
               f"{cfg.split}/macro_f1": multiclass_f1_score(predictions, targets, n, average="macro").item(),
               f"{cfg.split}/n_images": len(labels)}

    rows = [{"actual": classes[a], "predicted": classes[p]} for a, p in zip(labels.tolist(), predictions.tolist())]
    wrong = torch.nonzero(predictions != targets).flatten()[:cfg.max_misclassified].tolist()
    figures = [
        plots.confusion_matrix(rows, output_dir / "confusion.png", f"confusion ({cfg.split})"),
        plots.image_grid(raw_images[wrong], [f"{classes[labels[i]]} → {classes[predictions[i]]}" for i in wrong],
                         output_dir / "misclassified.png", f"misclassified {cfg.split} images (true → predicted), "
                         f"{int((predictions != targets).sum())} of {len(labels)}"),
    ]
    if task.model.config.attention == "global":  # windowed attention has no [CLS] token to read
        shown = list(range(min(cfg.attention_maps, len(labels))))
        _, weights = task.predict(raw_images[shown], return_weights=True)
        grid = task.model.config.image_size // task.model.config.patch_size
        last = weights[-1].mean(dim=1)  # (images, 1 + patches, 1 + patches), mean over heads
        if task.model.config.pool == "cls":  # what the classifier reads: the [CLS] row
            maps, what = last[:, 0, 1:], "[CLS] attention over patches"
        else:  # mean pooling reads every patch: the attention each patch receives, averaged over patches
            maps, what = last[:, 1:, 1:].mean(dim=1), "attention each patch receives (mean over patch queries)"
        figures.append(plots.attention_maps(raw_images[shown], maps.view(-1, grid, grid).numpy(),
                                            [f"{classes[labels[i]]} → {classes[predictions[i]]}" for i in shown],
                                            output_dir / "attention.png", f"last layer: {what}, mean of heads"))

    metrics_path = output_dir / "metrics.json"
    atomic_write_json(metrics_path, metrics)
    write_csv(output_dir / "confusion.csv", rows)
    log_into_training_run(cfg, metrics, [metrics_path, output_dir / "confusion.csv", *figures])
    return metrics
