"""BERT fine-tuning for sentence and sentence-pair classification: cross-entropy on the pooled
[CLS], accuracy and macro-F1, AdamW with BERT's warm-up + linear decay."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from transformer_lab.models.bert import BertClassifierConfig, BertForSequenceClassification
from transformer_lab.tasks.bert_pretraining import load_pretrained_bert
from transformer_lab.tasks.schedules import adamw_warmup_linear


class SequenceClassificationTask(L.LightningModule):
    def __init__(self, model_config: dict, labels: list[str], pretrained: str | None = None, lr: float = 1e-4,
                 weight_decay: float = 0.01, warmup_ratio: float = 0.1):
        """pretrained: a `pretrain_bert` checkpoint, "hf:NAME", or None for a random start."""
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.model = self.build_model(model_config, pretrained)
        n = len(labels)
        self.metrics = nn.ModuleDict({stage: nn.ModuleDict({"acc": MulticlassAccuracy(n, average="micro"),
                                                            "macro_f1": MulticlassF1Score(n, average="macro")})
                                      for stage in ("val", "test")})

    def build_model(self, model_config: dict, pretrained: str | None) -> nn.Module:
        model = BertForSequenceClassification(BertClassifierConfig(**model_config))
        load_pretrained_bert(model.bert, pretrained)
        return model

    def classify(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Class logits and any auxiliary training loss the model adds (none for BERT)."""
        return self.model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"]), None

    def forward(self, batch: dict) -> torch.Tensor:
        return self.classify(batch)[0]

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        logits, auxiliary = self.classify(batch)
        loss = F.cross_entropy(logits, batch["labels"])
        size = len(batch["labels"])
        if auxiliary is not None:
            self.log("train/task_loss", loss, on_step=True, on_epoch=True, batch_size=size, sync_dist=True)
            self.log("train/aux_loss", auxiliary, on_step=True, on_epoch=True, batch_size=size, sync_dist=True)
            loss = loss + auxiliary
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=size, sync_dist=True)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def _evaluate(self, batch: dict, stage: str) -> None:
        logits = self(batch)
        size = len(batch["labels"])
        self.log(f"{stage}/loss", F.cross_entropy(logits, batch["labels"]), batch_size=size, sync_dist=True)
        for name, metric in self.metrics[stage].items():
            metric.update(logits.argmax(-1), batch["labels"])
            self.log(f"{stage}/{name}", metric, on_epoch=True, prog_bar=name == "acc", batch_size=size)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def configure_optimizers(self):
        h = self.hparams
        return adamw_warmup_linear(self.model, h.lr, h.weight_decay, h.warmup_ratio,
                                   self.trainer.estimated_stepping_batches)
