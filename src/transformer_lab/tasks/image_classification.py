"""Image classification with the Vision Transformer: cross-entropy (optionally label-smoothed),
accuracy and macro-F1 (the sentence-classification task's metrics and logging), AdamW with
linear warm-up then cosine decay."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from transformer_lab.data.images import ImagePreprocessor
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.models.vit import VisionTransformer, ViTConfig
from transformer_lab.tasks.classification import ClassificationTask
from transformer_lab.tasks.inference import inference


class ImageClassificationTask(ClassificationTask):
    lr_decay = "cosine"
    preprocessor_class = ImagePreprocessor

    def __init__(self, model_config: dict, preprocessor: dict, lr: float = 1e-3, weight_decay: float = 0.05,
                 warmup_ratio: float = 0.1, label_smoothing: float = 0.0):
        """preprocessor: the datamodule's ImagePreprocessor state (class names, normalisation statistics)."""
        super().__init__(model_config, preprocessor, None, lr, weight_decay, warmup_ratio, label_smoothing)
        self.save_hyperparameters(logger=False)

    def build_model(self, model_config: dict, pretrained: str | None) -> nn.Module:
        return VisionTransformer(ViTConfig(**model_config))

    def classify(self, batch: dict) -> tuple[ModelOutput, torch.Tensor | None]:
        return self.model(batch["images"]), None

    @inference
    def predict(self, images: np.ndarray | torch.Tensor, batch_size: int = 256, return_weights: bool = False
                ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Class probabilities (images, n_classes) of raw uint8 images (images, C, H, W), normalised by
        the preprocessor's statistics, batch_size images at a time, and with
        return_weights every block's attention weights over all the images (computed explicitly,
        outside the fused kernel: ask only for the images you will plot); else None."""
        images = self.preprocessor.encode(images)
        probabilities, attentions = [], []
        for start in range(0, len(images), batch_size):
            out = self.model(images[start:start + batch_size].to(self.device), return_weights=return_weights)
            probabilities.append(out.logits.softmax(-1).cpu())
            if return_weights:
                attentions.append([weights.cpu() for weights in out.attentions])
        per_layer = [torch.cat(layer) for layer in zip(*attentions)] if return_weights else None
        return torch.cat(probabilities), per_layer
