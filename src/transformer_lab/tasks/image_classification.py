"""Image classification with the Vision Transformer: cross-entropy (optionally label-smoothed),
accuracy and macro-F1 (the sentence-classification task's metrics and logging), AdamW with
linear warm-up then cosine decay."""

from __future__ import annotations

import torch
from torch import nn

from transformer_lab.models.outputs import ModelOutput
from transformer_lab.models.vit import ViTConfig, VisionTransformer
from transformer_lab.tasks.sequence_classification import SequenceClassificationTask


class ImageClassificationTask(SequenceClassificationTask):
    lr_decay = "cosine"

    def __init__(self, model_config: dict, labels: list[str], lr: float = 1e-3, weight_decay: float = 0.05,
                 warmup_ratio: float = 0.1, label_smoothing: float = 0.0):
        super().__init__(model_config, labels, None, lr, weight_decay, warmup_ratio, label_smoothing)
        self.save_hyperparameters(logger=False)

    def build_model(self, model_config: dict, pretrained: str | None) -> nn.Module:
        return VisionTransformer(ViTConfig(**model_config))

    def classify(self, batch: dict) -> tuple[ModelOutput, torch.Tensor | None]:
        return self.model(batch["images"]), None

    @torch.no_grad()
    def predict_images(self, images: torch.Tensor, return_weights: bool = False) -> tuple[torch.Tensor, list]:
        """Predicted classes, in eval mode, and with return_weights every block's attention weights
        (computed explicitly, outside the fused kernel: ask only for the images you will plot)."""
        self.model.eval()
        out = self.model(images, return_weights=return_weights)
        return out.logits.argmax(-1), out.attentions
