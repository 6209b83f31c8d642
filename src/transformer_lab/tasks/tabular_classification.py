"""Classification of table rows with the TabTransformer (or its MLP ablation): the sentence-
classification task's training and logging, with accuracy, ROC-AUC and F1 (torchmetrics; binary
scores on the positive class for two classes, macro averages otherwise), AdamW with linear
warm-up, then a constant rate (the configured default: early stopping decides when training
ends, so no horizon has to be guessed for the table's size) or a decay over max_epochs."""

from __future__ import annotations

import pandas as pd
import torch
from torch import nn
from torchmetrics import AUROC, Accuracy, F1Score

from transformer_lab.data.tabular import TabularPreprocessor
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.models.tab_transformer import TabTransformer, TabTransformerConfig
from transformer_lab.tasks.classification import ClassificationTask
from transformer_lab.tasks.schedules import adamw_with_warmup


def classification_metrics(n_classes: int) -> nn.ModuleDict:
    """acc, auroc, f1 over class probabilities: binary (positive = class 1) or macro-averaged."""
    if n_classes == 2:
        return nn.ModuleDict({"acc": Accuracy("binary"), "auroc": AUROC("binary"), "f1": F1Score("binary")})
    return nn.ModuleDict({"acc": Accuracy("multiclass", num_classes=n_classes, average="micro"),
                          "auroc": AUROC("multiclass", num_classes=n_classes, average="macro"),
                          "f1": F1Score("multiclass", num_classes=n_classes, average="macro")})


def metric_input(probabilities: torch.Tensor) -> torch.Tensor:
    """What the metrics above take: the positive class's probability for two classes, all of them otherwise."""
    return probabilities[:, 1] if probabilities.shape[1] == 2 else probabilities


def score_probabilities(probabilities: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """acc, auroc, f1 of class probabilities (rows, classes): how every tabular model is scored."""
    metrics = classification_metrics(probabilities.shape[1])
    return {name: float(metric(metric_input(probabilities), labels)) for name, metric in metrics.items()}


class TabularClassificationTask(ClassificationTask):
    preprocessor_class = TabularPreprocessor

    def __init__(self, model_config: dict, preprocessor: dict, lr: float = 1e-3, weight_decay: float = 1e-2,
                 warmup_ratio: float = 0.05, label_smoothing: float = 0.0, decay: str = "linear",
                 warmup_steps: int | None = None):
        """preprocessor: the datamodule's TabularPreprocessor state (schema and fitted encoder).
        decay: linear | cosine (to 0 over max_epochs) | constant (after warm-up). warmup_steps: the warm-up's
        length in steps (None = warmup_ratio of max_epochs' steps, which means little when early
        stopping ends the run)."""
        if decay not in ("linear", "cosine", "constant"):
            raise ValueError(f"decay={decay!r}; expected 'linear', 'cosine' or 'constant'")
        super().__init__(model_config, preprocessor, None, lr, weight_decay, warmup_ratio, label_smoothing)
        self.save_hyperparameters(logger=False)

    def configure_optimizers(self):
        h = self.hparams
        total = self.trainer.estimated_stepping_batches
        warmup = int(h.warmup_ratio * total) if h.warmup_steps is None else min(h.warmup_steps, total)
        return adamw_with_warmup(self.model, h.lr, h.weight_decay, total, warmup, decay=h.decay, trainer=self.trainer)

    def build_model(self, model_config: dict, pretrained: str | None) -> nn.Module:
        return TabTransformer(TabTransformerConfig(**model_config))

    def build_metrics(self, n_classes: int) -> nn.ModuleDict:
        return classification_metrics(n_classes)

    def metric_input(self, logits: torch.Tensor) -> torch.Tensor:
        return metric_input(logits.softmax(-1))  # ROC-AUC needs scores, not classes

    def classify(self, batch: dict) -> tuple[ModelOutput, torch.Tensor | None]:
        return self.model(batch["categorical"], batch["continuous"]), None

    def predict(self, rows: pd.DataFrame | list[dict], batch_size: int = 1024) -> torch.Tensor:
        """Class probabilities (rows, n_classes) of raw table rows (dicts or a DataFrame with the
        schema's feature columns, cells as in the CSV), encoded by the task's preprocessor."""
        return super().predict(rows, batch_size)  # the classifiers' batched predict (and its @inference)
