"""BERT fine-tuning for sentence and sentence-pair classification: the classifier task
(classification.py) on the pooled [CLS], with BERT's warm-up + linear decay."""

from __future__ import annotations

from torch import nn

from transformer_lab.data.text_classification import TextClassificationPreprocessor
from transformer_lab.models.bert import BertClassifierConfig, BertForSequenceClassification
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.tasks.bert_pretraining import load_pretrained_bert
from transformer_lab.tasks.classification import ClassificationTask


class SequenceClassificationTask(ClassificationTask):
    preprocessor_class = TextClassificationPreprocessor

    def build_model(self, model_config: dict, pretrained: str | None) -> nn.Module:
        model = BertForSequenceClassification(BertClassifierConfig(**model_config))
        load_pretrained_bert(model.bert, pretrained)
        return model

    def classify(self, batch: dict) -> tuple[ModelOutput, None]:
        """BERT adds no auxiliary loss."""
        return self.model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"]), None
