"""JointBERT: the ATIS joint intent + slot task (loss, metrics, optimiser of
JointIntentSlotTask) on a pre-trained BERT encoder instead of the from-scratch encoder, so
that the two compare in one MLflow experiment."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from transformer_lab.data.atis import UNK_LABEL
from transformer_lab.data.atis_bert import AtisBertPreprocessor
from transformer_lab.models.bert import BertForJointIntentSlot, BertJointConfig
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.tasks.bert_pretraining import load_pretrained_bert
from transformer_lab.tasks.joint_intent_slot import JointIntentSlotTask
from transformer_lab.tasks.pretrained import FrozenBody


class BertJointIntentSlotTask(FrozenBody, JointIntentSlotTask):
    preprocessor_class = AtisBertPreprocessor

    def __init__(self, model_config: dict, preprocessor: dict, pretrained: str | None = None, lr: float = 1e-4,
                 weight_decay: float = 0.01, betas: tuple[float, float] = (0.9, 0.999), warmup_ratio: float = 0.1,
                 min_lr_ratio: float = 0.0, slot_loss_coef: float = 1.0, label_smoothing: float = 0.0,
                 embeddings: dict | None = None, freeze: str = "none"):
        """pretrained: a `pretrain_bert` checkpoint, published weights (minilm, a Hugging Face folder,
        hf:NAME), or None for a random start. freeze: none | embeddings | encoder (tasks/pretrained.py).
        preprocessor: the datamodule's AtisBertPreprocessor state (the tokenizer itself included),
        so that predict() reads raw words from the checkpoint alone."""
        super().__init__(model_config, preprocessor, lr=lr, weight_decay=weight_decay, betas=betas,
                         warmup_ratio=warmup_ratio, min_lr_ratio=min_lr_ratio, slot_loss_coef=slot_loss_coef,
                         label_smoothing=label_smoothing, embeddings=embeddings)
        self.freeze_body(self.model.bert, freeze)

    def build_model(self, model_config: dict) -> nn.Module:
        model = BertForJointIntentSlot(BertJointConfig(**model_config))
        load_pretrained_bert(model.bert, self.hparams.pretrained)
        return model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> ModelOutput:
        out = self.model(input_ids, None, attention_mask)
        return replace(out, slot_logits=out.slot_logits[:, 1:])  # slot labels start after [CLS]

    def window_budget(self) -> int:
        # word pieces between [CLS] and [SEP], within what the preprocessor and the model read
        return min(self.preprocessor.max_len, self.model.config.max_len) - 2

    def word_costs(self, words: list[str]) -> list[int]:
        return self.preprocessor.piece_counts(words)

    def read_windows(self, windows: list[list[str]]) -> tuple[torch.Tensor, list[list[str]]]:
        """As JointIntentSlotTask.read_windows, each word's tag read at its first piece."""
        batch, firsts = self.preprocessor.batch(windows)
        out = self(batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device))
        labels = self.preprocessor.slot_labels
        tags = [["O" if labels[slots[position - 1]] == UNK_LABEL else labels[slots[position - 1]] for position in first]
                for first, slots in zip(firsts, out.slot_logits.argmax(-1).tolist())]
        return out.logits.softmax(-1), tags
