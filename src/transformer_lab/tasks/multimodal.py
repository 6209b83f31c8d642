"""Classification of rows with a picture, a text and table columns by the multimodal transformer
(one joint sequence, or the late-fusion baseline): the sentence-classification task's training and
logging (accuracy, macro-F1), AdamW with linear warm-up then cosine decay."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from transformer_lab.data import published
from transformer_lab.data.multimodal import MultimodalPreprocessor
from transformer_lab.errors import TransformerLabError
from transformer_lab.models.multimodal import MultimodalConfig, MultimodalTransformer
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.tasks.bert_pretraining import published_body
from transformer_lab.tasks.checkpoints import read_checkpoint
from transformer_lab.tasks.classification import ClassificationTask
from transformer_lab.tasks.inference import batches, inference

INPUTS = ("images", "input_ids", "categorical", "continuous", "present")


def pretrained_word_embeddings(source: str) -> torch.Tensor:
    """A BERT's word-embedding table (vocab, width): published weights (published.py) or a
    `pretrain_bert` checkpoint, read as data."""
    if published.is_published(source):
        return published_body(published.resolve(source))["embeddings.token.weight"]
    state = read_checkpoint(source, "run `dvc repro pretrain_bert`, or task.pretrained=minilm")["state_dict"]
    if "model.bert.embeddings.token.weight" not in state:
        raise TransformerLabError(f"{source}: not a BERT checkpoint (no model.bert.embeddings.token.weight)")
    return state["model.bert.embeddings.token.weight"]


class MultimodalClassificationTask(ClassificationTask):
    lr_decay = "cosine"
    preprocessor_class = MultimodalPreprocessor

    def __init__(self, model_config: dict, preprocessor: dict, pretrained: str | None = None, lr: float = 1e-3,
                 weight_decay: float = 0.05, warmup_ratio: float = 0.1, label_smoothing: float = 0.0):
        """preprocessor: the datamodule's MultimodalPreprocessor state (schema, table encoder,
        tokenizer, image statistics). pretrained: where the word embeddings start, a BERT's table:
        minilm, a Hugging Face BERT folder, hf:NAME, or a `pretrain_bert` checkpoint; None = random.
        The data must be prepared with that model's tokenizer (data.text_tokenizer)."""
        super().__init__(model_config, preprocessor, pretrained, lr, weight_decay, warmup_ratio, label_smoothing)
        self.save_hyperparameters(logger=False)

    def build_model(self, model_config: dict, pretrained: str | None) -> nn.Module:
        model = MultimodalTransformer(MultimodalConfig(**model_config))
        if pretrained:
            try:
                model.load_word_embeddings(pretrained_word_embeddings(pretrained))
            except ValueError as err:
                raise TransformerLabError(f"task.pretrained={pretrained}: {err}") from None
        return model

    def classify(self, batch: dict) -> tuple[ModelOutput, torch.Tensor | None]:
        return self.model(**{name: batch[name] for name in INPUTS}), None

    @inference
    def predict(self, rows: list[dict], images: np.ndarray | None = None, batch_size: int = 256,
                return_weights: bool = False) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Class probabilities (rows, n_classes) of raw rows (dicts with the schema's text and table
        columns) and their uint8 images (rows, C, S, S) or None; with return_weights (joint fusion)
        every block's attention weights, else None."""
        return self.predict_inputs(self.preprocessor.batch(rows, images), batch_size, return_weights)

    @inference
    def predict_inputs(self, inputs: dict[str, torch.Tensor], batch_size: int = 256, return_weights: bool = False
                       ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """predict() of inputs already encoded (MultimodalPreprocessor.encode_rows)."""
        probabilities, attentions = [], []
        for chunk in batches(inputs, batch_size, self.device):
            out = self.model(**chunk, return_weights=return_weights)
            probabilities.append(out.logits.softmax(-1).cpu())
            if return_weights:
                attentions.append([w.cpu() for w in out.attentions])
        per_layer = [torch.cat(layer) for layer in zip(*attentions)] if return_weights else None
        return torch.cat(probabilities), per_layer
