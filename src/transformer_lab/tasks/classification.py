"""What every classifier's task shares: cross-entropy (optionally label-smoothed) on the model's
class logits, accuracy and macro-F1, AdamW with warm-up then linear (or cosine) decay, batched
predict. Each classifier (BERT's in sequence_classification.py, GPT, ViT, TabTransformer,
multimodal) derives from it and names its model, inputs, metrics and schedule, so that their runs
log the same names; this module knows no model."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from transformer_lab.models.outputs import ModelOutput
from transformer_lab.tasks.checkpoints import NamesItsFamily
from transformer_lab.tasks.embeddings import TokenEmbeddings
from transformer_lab.tasks.inference import batches, inference
from transformer_lab.tasks.pretrained import FrozenBody
from transformer_lab.tasks.schedules import adamw_with_warmup


class ClassificationTask(FrozenBody, TokenEmbeddings, NamesItsFamily, L.LightningModule):
    lr_decay = "linear"  # after warm-up: BERT's linear decay to 0; the ViT and table tasks decay along a cosine
    preprocessor_class: type  # the family's Preprocessor (families.py): from_state(preprocessor)

    def __init__(self, model_config: dict, preprocessor: dict, pretrained: str | None = None, lr: float = 1e-4,
                 weight_decay: float = 0.01, warmup_ratio: float = 0.1, label_smoothing: float = 0.0,
                 embeddings: dict | None = None, freeze: str = "none"):
        """preprocessor: the datamodule's `preprocessor.to_state()` (tokenizer, labels, truncation),
        kept in the checkpoint for predict(). pretrained: a `pretrain_bert` checkpoint, published
        weights (minilm, a Hugging Face folder, hf:NAME), or None for a random start. embeddings:
        {init, vectors} (tasks/embeddings.py). freeze: none | embeddings | encoder (tasks/pretrained.py)."""
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.preprocessor = self.preprocessor_class.from_state(preprocessor)
        self.model = self.build_model(model_config, pretrained)
        self.freeze_body(getattr(self.model, "bert", None), freeze)
        self.metrics = nn.ModuleDict({stage: self.build_metrics(len(self.preprocessor.labels))
                                      for stage in ("val", "test")})

    def build_metrics(self, n_classes: int) -> nn.ModuleDict:
        return nn.ModuleDict({"acc": MulticlassAccuracy(n_classes, average="micro"),
                              "macro_f1": MulticlassF1Score(n_classes, average="macro")})

    def metric_input(self, logits: torch.Tensor) -> torch.Tensor:
        """What the metrics are updated with: predicted classes here."""
        return logits.argmax(-1)

    def build_model(self, model_config: dict, pretrained: str | None) -> nn.Module:
        """The classifier, from its config's fields, started from `pretrained` where the family has such starts."""
        raise NotImplementedError

    def classify(self, batch: dict) -> tuple[ModelOutput, torch.Tensor | None]:
        """The model's output (class logits in `logits`) and any auxiliary training loss the task adds."""
        raise NotImplementedError

    def forward(self, batch: dict) -> ModelOutput:
        return self.classify(batch)[0]

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        out, auxiliary = self.classify(batch)
        loss = F.cross_entropy(out.logits, batch["labels"], label_smoothing=self.hparams.label_smoothing)
        size = len(batch["labels"])
        if auxiliary is not None:
            self.log("train/task_loss", loss, on_step=True, on_epoch=True, batch_size=size, sync_dist=True)
            self.log("train/aux_loss", auxiliary, on_step=True, on_epoch=True, batch_size=size, sync_dist=True)
            loss = loss + auxiliary
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=size, sync_dist=True)
        return loss

    def _evaluate(self, batch: dict, stage: str) -> None:
        logits = self(batch).logits
        size = len(batch["labels"])
        self.log(f"{stage}/loss", F.cross_entropy(logits, batch["labels"]), batch_size=size, sync_dist=True)
        predictions = self.metric_input(logits)
        for name, metric in self.metrics[stage].items():
            metric.update(predictions, batch["labels"])
            self.log(f"{stage}/{name}", metric, on_epoch=True, prog_bar=name == "acc", batch_size=size)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def configure_optimizers(self):
        h = self.hparams
        total = self.trainer.estimated_stepping_batches
        return adamw_with_warmup(self.model, h.lr, h.weight_decay, total, int(h.warmup_ratio * total),
                                 decay=self.lr_decay, trainer=self.trainer)

    @inference
    def predict(self, texts: list, batch_size: int = 256) -> torch.Tensor:
        """Class probabilities (rows, n_classes) of raw inputs, encoded by the task's preprocessor
        (BERT: texts or (text_a, text_b) pairs), batch_size rows at a time."""
        batch = self.preprocessor.batch(texts)
        return torch.cat([self(chunk).logits.softmax(-1).cpu() for chunk in batches(batch, batch_size, self.device)])
