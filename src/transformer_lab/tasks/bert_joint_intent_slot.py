"""JointBERT: the ATIS joint intent + slot task (loss, metrics, optimiser of
JointIntentSlotTask) on a pre-trained BERT encoder instead of the from-scratch encoder, so
that the two compare in one MLflow experiment."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from transformer_lab.data.atis_bert import AtisBertPreprocessor
from transformer_lab.models.bert import BertForJointIntentSlot, BertJointConfig
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.tasks.bert_pretraining import load_pretrained_bert
from transformer_lab.tasks.pretrained import FrozenBody
from transformer_lab.tasks.inference import inference
from transformer_lab.tasks.joint_intent_slot import JointIntentSlotTask


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

    @inference
    def predict(self, utterances: list[list[str]], batch_size: int = 256) -> list[dict]:
        """Intent and one slot tag per word (read at the word's first piece), as JointIntentSlotTask.predict."""
        results = []
        for start in range(0, len(utterances), batch_size):
            chunk = utterances[start : start + batch_size]
            batch, firsts = self.preprocessor.batch(chunk)
            out = self(batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device))
            for first, words, intent_id, slots in zip(firsts, chunk, out.logits.argmax(-1).tolist(),
                                                      out.slot_logits.argmax(-1).tolist()):
                tags = [self.preprocessor.slot_labels[slots[position - 1]] for position in first]
                tags += ["O"] * (len(words) - len(tags))  # words cut by max_len
                results.append({"intent": self.preprocessor.intent_labels[intent_id],
                                "slots": ["O" if t == "UNK" else t for t in tags]})
        return results
