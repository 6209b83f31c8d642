"""A published BERT encoder (data/published.py: minilm, a Hugging Face folder, hf:NAME) as a model
the feature-extraction pipeline reads. Imported by name (inference/pipeline.py), so that loading a
checkpoint of another family runs none of BERT's code."""

from __future__ import annotations

import torch

from transformer_lab.data.bert import BertPreprocessor
from transformer_lab.models.bert import BertConfig, BertModel
from transformer_lab.tasks.bert_pretraining import published_body


class PublishedEncoder(torch.nn.Module):
    """A published BERT (published.py) with its tokenizer: the encoder feature extraction reads."""

    def __init__(self, start):
        super().__init__()
        fields = start.config_fields()
        self.bert = BertModel(BertConfig(**fields))
        self.bert.load_state_dict(published_body(start))
        self.preprocessor = BertPreprocessor(start.tokenizer(), max_len=fields["max_len"])
        self.eval()
