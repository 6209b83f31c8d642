"""BERT fine-tuning for token classification (CoNLL-2003 named entities): cross-entropy on each
word's first piece, entity-level F1 (conlleval / seqeval rules, metrics.SlotF1) and token accuracy,
AdamW with BERT's warm-up + linear decay."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from transformer_lab.data.atis import IGNORE_INDEX
from transformer_lab.data.conll import TaggingPreprocessor
from transformer_lab.models.bert import BertForTokenClassification, BertTaggerConfig
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.tasks.bert_pretraining import load_pretrained_bert
from transformer_lab.tasks.checkpoints import NamesItsFamily
from transformer_lab.tasks.embeddings import TokenEmbeddings
from transformer_lab.tasks.inference import inference
from transformer_lab.tasks.metrics import SlotF1
from transformer_lab.tasks.pretrained import FrozenBody
from transformer_lab.tasks.schedules import adamw_with_warmup


class TokenClassificationTask(FrozenBody, TokenEmbeddings, NamesItsFamily, L.LightningModule):
    def __init__(self, model_config: dict, preprocessor: dict, pretrained: str | None = None, lr: float = 1e-4,
                 weight_decay: float = 0.01, warmup_ratio: float = 0.1, embeddings: dict | None = None,
                 freeze: str = "none"):
        """preprocessor: the datamodule's TaggingPreprocessor state (tokenizer, tag labels, max_len), so
        that predict() tags raw words from the checkpoint alone. pretrained: a `pretrain_bert`
        checkpoint, published weights (minilm, a Hugging Face folder, hf:NAME) or None for a random
        start. freeze: none | embeddings | encoder (tasks/pretrained.py)."""
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.preprocessor = TaggingPreprocessor.from_state(preprocessor)
        self.model = BertForTokenClassification(BertTaggerConfig(**model_config))
        load_pretrained_bert(self.model.bert, pretrained)
        self.freeze_body(self.model.bert, freeze)
        n_labels = len(self.preprocessor.labels)
        self.metrics = nn.ModuleDict({stage: nn.ModuleDict({
            "f1": SlotF1(), "token_acc": MulticlassAccuracy(n_labels, average="micro", ignore_index=IGNORE_INDEX)})
            for stage in ("val", "test")})

    def forward(self, batch: dict) -> ModelOutput:
        return self.model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"])

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self._loss(self(batch).logits, batch["labels"])
        size = batch["input_ids"].shape[0]
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=size, sync_dist=True)
        return loss

    def _evaluate(self, batch: dict, stage: str) -> None:
        logits, labels = self(batch).logits, batch["labels"]
        size = labels.shape[0]
        self.log(f"{stage}/loss", self._loss(logits, labels), batch_size=size, sync_dist=True)
        predicted, real = logits.argmax(-1), labels != IGNORE_INDEX
        names = self.preprocessor.labels
        metrics = self.metrics[stage]
        metrics["f1"].update([[names[i] for i in row[keep].tolist()] for row, keep in zip(predicted, real)],
                             [[names[i] for i in row[keep].tolist()] for row, keep in zip(labels, real)])
        metrics["token_acc"].update(predicted, labels)
        for name, metric in metrics.items():
            self.log(f"{stage}/{name}", metric, on_epoch=True, prog_bar=name == "f1", batch_size=size)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def configure_optimizers(self):
        h = self.hparams
        total = self.trainer.estimated_stepping_batches
        return adamw_with_warmup(self.model, h.lr, h.weight_decay, total, int(h.warmup_ratio * total),
                                 trainer=self.trainer)

    def predict(self, sentences: list[list[str]], batch_size: int = 128) -> list[list[str]]:
        """One BIO tag per word of each raw sentence (a list of words), read at the word's first piece;
        words past max_len pieces are O."""
        return [tags for tags, _ in self.predict_scored(sentences, batch_size)]

    @inference
    def predict_scored(self, sentences: list[list[str]], batch_size: int = 128
                       ) -> list[tuple[list[str], list[float | None]]]:
        """predict's tags and each tag's probability at the word's first piece (None for a word past
        max_len pieces, whose O was not predicted)."""
        tagged = []
        for start in range(0, len(sentences), batch_size):
            chunk = sentences[start : start + batch_size]
            batch, firsts = self.preprocessor.batch(chunk)
            best, predicted = self({k: v.to(self.device) for k, v in batch.items()}).logits.softmax(-1).max(-1)
            for words, first, row, scores in zip(chunk, firsts, predicted.tolist(), best.tolist()):
                tags = [self.preprocessor.labels[row[position]] for position in first]
                missing = len(words) - len(tags)
                tagged.append((tags + ["O"] * missing, [scores[position] for position in first] + [None] * missing))
        return tagged
