"""JointBERT: the ATIS joint intent + slot task (loss, metrics, optimiser of
JointIntentSlotTask) on a pre-trained BERT encoder instead of the from-scratch encoder, so
that the two compare in one MLflow experiment."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from transformer_lab.data.atis_bert import encode_words
from transformer_lab.data.bert import pad_batch, special_ids
from transformer_lab.data.tokenizers import load_tokenizer
from transformer_lab.models.bert import BertForJointIntentSlot, BertJointConfig
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.tasks.bert_pretraining import load_pretrained_bert
from transformer_lab.tasks.inference import inference
from transformer_lab.tasks.joint_intent_slot import JointIntentSlotTask


class BertJointIntentSlotTask(JointIntentSlotTask):
    def __init__(self, model_config: dict, intent_labels: list[str], slot_labels: list[str], tokenizer_path: str,
                 pretrained: str | None = None, lr: float = 1e-4, weight_decay: float = 0.01,
                 betas: tuple[float, float] = (0.9, 0.999), warmup_ratio: float = 0.1, min_lr_ratio: float = 0.0,
                 slot_loss_coef: float = 1.0, label_smoothing: float = 0.0):
        """pretrained: a `pretrain_bert` checkpoint, "hf:NAME", or None for a random start.
        The tokenizer path travels in the checkpoint so that predict() can read raw words."""
        super().__init__(model_config, [], intent_labels, slot_labels, lr=lr, weight_decay=weight_decay,
                         betas=betas, warmup_ratio=warmup_ratio, min_lr_ratio=min_lr_ratio,
                         slot_loss_coef=slot_loss_coef, label_smoothing=label_smoothing)

    def build_model(self, model_config: dict) -> nn.Module:
        self.tokenizer = load_tokenizer(self.hparams.tokenizer_path)
        model = BertForJointIntentSlot(BertJointConfig(**model_config))
        load_pretrained_bert(model.bert, self.hparams.pretrained)
        return model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> ModelOutput:
        out = self.model(input_ids, None, attention_mask)
        return replace(out, slot_logits=out.slot_logits[:, 1:])  # slot labels start after [CLS]

    @inference
    def predict(self, utterances: list[list[str]], batch_size: int = 256) -> list[dict]:
        """Intent and one slot tag per word (read at the word's first piece), as JointIntentSlotTask.predict."""
        specials = special_ids(self.tokenizer)
        results = []
        for start in range(0, len(utterances), batch_size):
            chunk = [[w.lower() for w in words] for words in utterances[start : start + batch_size]]
            encoded = [encode_words(self.tokenizer, words, specials, self.model.config.max_len) for words in chunk]
            batch = pad_batch([{"input_ids": ids, "segment_ids": [0] * len(ids)} for ids, _ in encoded],
                              specials["pad"])
            out = self(batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device))
            for (_, first), words, intent_id, slots in zip(encoded, chunk, out.logits.argmax(-1).tolist(),
                                                           out.slot_logits.argmax(-1).tolist()):
                tags = [self.hparams.slot_labels[slots[position - 1]] for position in first]
                tags += ["O"] * (len(words) - len(tags))  # words cut by max_len
                results.append({"intent": self.hparams.intent_labels[intent_id],
                                "slots": ["O" if t == "UNK" else t for t in tags]})
        return results
