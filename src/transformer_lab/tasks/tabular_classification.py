"""Classification of table rows with the TabTransformer (or its MLP ablation): cross-entropy,
accuracy, ROC-AUC and F1 (torchmetrics; binary scores on the positive class for two classes,
macro averages otherwise), AdamW with linear warm-up then cosine decay."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Accuracy, AUROC, F1Score

from transformer_lab.models.tab_transformer import TabTransformer, TabTransformerConfig
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


class TabularClassificationTask(L.LightningModule):
    def __init__(self, model_config: dict, labels: list[str], lr: float = 1e-3, weight_decay: float = 1e-2,
                 warmup_ratio: float = 0.05, label_smoothing: float = 0.0):
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.model = TabTransformer(TabTransformerConfig(**model_config))
        self.metrics = nn.ModuleDict({stage: classification_metrics(len(labels)) for stage in ("val", "test")})

    def forward(self, batch: dict) -> torch.Tensor:
        return self.model(batch["categorical"], batch["continuous"])

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = F.cross_entropy(self(batch), batch["labels"], label_smoothing=self.hparams.label_smoothing)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=len(batch["labels"]),
                 sync_dist=True)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def _evaluate(self, batch: dict, stage: str) -> None:
        logits = self(batch)
        size = len(batch["labels"])
        self.log(f"{stage}/loss", F.cross_entropy(logits, batch["labels"]), batch_size=size, sync_dist=True)
        scores = metric_input(logits.softmax(-1))
        for name, metric in self.metrics[stage].items():
            metric.update(scores, batch["labels"])
            self.log(f"{stage}/{name}", metric, on_epoch=True, prog_bar=name == "auroc", batch_size=size)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    @torch.no_grad()
    def predict_probabilities(self, categorical: torch.Tensor, continuous: torch.Tensor) -> torch.Tensor:
        self.model.eval()
        return self.model(categorical, continuous).softmax(-1)

    def configure_optimizers(self):
        h = self.hparams
        total = self.trainer.estimated_stepping_batches
        return adamw_with_warmup(self.model, h.lr, h.weight_decay, total, int(h.warmup_ratio * total),
                                 decay="cosine")
