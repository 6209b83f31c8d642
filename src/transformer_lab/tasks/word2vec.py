"""word2vec training: plain SGD on sparse rows with the linearly decaying learning rate of
the original implementation, and words/second as gensim counts them."""

from __future__ import annotations

import time

import lightning as L
import numpy as np
import torch

from transformer_lab.models.word2vec import Word2Vec, Word2VecConfig


class Word2VecTask(L.LightningModule):
    def __init__(self, model_config: dict, words: list[str], counts: list[int], lr: float = 0.025,
                 min_lr: float = 1e-4):
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.model = Word2Vec(Word2VecConfig(**model_config), torch.tensor(counts))
        self._epoch_start, self._epoch_words = 0.0, 0.0

    def forward(self, batch: dict) -> torch.Tensor:
        return self.model(batch["inputs"], batch["targets"], batch.get("input_mask"))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        losses = self(batch)
        self._epoch_words += batch["words"]
        # Effective words (after min_count and subsampling) per second so far this epoch, as gensim counts them.
        elapsed = time.perf_counter() - self._epoch_start
        self.log("train/words_per_s", self._epoch_words / elapsed, on_step=True, on_epoch=False)
        self.log("train/loss", losses.mean(), on_step=True, on_epoch=True, prog_bar=True, batch_size=len(losses))
        # Summed, not averaged: each example moves its rows by a full learning-rate step, as in word2vec.
        return losses.sum()

    def on_train_epoch_start(self) -> None:
        self._epoch_start, self._epoch_words = time.perf_counter(), 0.0

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.log("val/loss", self(batch).mean(), batch_size=len(batch["targets"]), sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.model.parameters(), lr=self.hparams.lr)
        total = max(1, self.trainer.estimated_stepping_batches)
        final = self.hparams.min_lr / self.hparams.lr
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(final, 1 - step / total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def vectors(self) -> tuple[list[str], np.ndarray]:
        return self.hparams.words, self.model.input_vectors.weight.detach().cpu().numpy()
