"""word2vec training: plain SGD on sparse rows with the linearly decaying learning rate of
the original implementation, and words/second as gensim counts them.

Manual optimisation: the model applies word2vec's closed-form SGD step in place
(Word2Vec.sgd_update), several times per training step, at a learning rate that decays with
every update as in word2vec."""

from __future__ import annotations

import time

import lightning as L
import numpy as np
import torch

from transformer_lab.data.word2vec import Word2VecPreprocessor
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.models.word2vec import Word2Vec, Word2VecConfig
from transformer_lab.tasks.checkpoints import NamesItsFamily
from transformer_lab.tasks.inference import inference
from transformer_lab.tasks.schedules import scheduled


class Word2VecTask(NamesItsFamily, L.LightningModule):
    def __init__(self, model_config: dict, preprocessor: dict, lr: float = 0.025, min_lr: float = 1e-4,
                 update_size: int | None = None):
        """preprocessor: the datamodule's Word2VecPreprocessor state (words and their counts).
        update_size: centre words per SGD update; None = 512 for skip-gram, 2048 for CBOW, which
        scores one averaged vector per word instead of one per context word, so that an update
        touches about as many rows either way (CBOW measured 1.3x faster at 2048 than at 512,
        its agreement with gensim unchanged; 8192 diverged)."""
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.preprocessor = Word2VecPreprocessor.from_state(preprocessor)
        self.model = Word2Vec(Word2VecConfig(**model_config), torch.tensor(self.preprocessor.counts))
        self.update_size = update_size or (2048 if self.model.config.architecture == "cbow" else 512)
        self.automatic_optimization = False
        self._epoch_start, self._epoch_words = 0.0, 0

    def forward(self, batch: dict) -> ModelOutput:
        return self.model(batch["context"], batch["context_mask"], batch["centres"])

    def learning_rate(self, progress: float) -> float:
        """word2vec's schedule: linear from lr at the start to min_lr at the end of training."""
        return max(self.hparams.min_lr, self.hparams.lr * (1 - progress))

    def training_step(self, batch: dict, batch_idx: int) -> None:
        # One SGD update per update_size centre words: few enough that frequent words see fresh
        # vectors often and the rows stay in cache, while the training loop's own per-step cost
        # (about a millisecond with logging, more than an update) is paid once per batch. Each
        # update follows the gradient of the summed loss: every example moves its rows by a full
        # step, as in word2vec.
        fields = [batch[k] for k in ("context", "context_mask", "centres")]
        chunks = list(zip(*(f.split(self.update_size) for f in fields)))
        total_steps = max(1, self.trainer.estimated_stepping_batches)
        losses = []
        for i, chunk in enumerate(chunks):
            lr = self.learning_rate((self.global_step + i / len(chunks)) / total_steps)
            losses.append(self.model.sgd_update(*chunk, lr=lr))
        losses = torch.cat(losses)
        # The rows moved in place above, so SGD has no gradient to apply; its step is how
        # Lightning counts training steps (global_step, checkpoints, max_steps, resuming).
        self.optimizers().step()
        self.lr_schedulers().step()  # the rate the next step starts at, for the LearningRateMonitor to log

        self._epoch_words += len(losses)  # one example per effective word (see training_windows)
        # Effective words (after min_count and subsampling) per second so far this epoch, as gensim counts them.
        elapsed = time.perf_counter() - self._epoch_start
        self.log("train/words_per_s", self._epoch_words / elapsed)
        self.log("train/loss", losses.mean(), on_step=True, on_epoch=True, prog_bar=True, batch_size=len(losses))

    def on_train_epoch_start(self) -> None:
        self._epoch_start, self._epoch_words = time.perf_counter(), 0

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.log("val/loss", self(batch).loss.mean(), batch_size=len(batch["centres"]), sync_dist=True)

    def configure_optimizers(self):
        # The updates above take their rate from learning_rate() chunk by chunk; the optimiser's
        # schedule follows it step by step only so that the rate is logged as in every family.
        optimizer = torch.optim.SGD(self.model.parameters(), lr=self.hparams.lr)
        total_steps = max(1, self.trainer.estimated_stepping_batches)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: self.learning_rate(step / total_steps) / self.hparams.lr)
        return {"optimizer": optimizer, "lr_scheduler": scheduled(schedule)}

    def vectors(self) -> tuple[list[str], np.ndarray]:
        """The whole vocabulary and its vectors, for export (word2vec text format)."""
        return self.preprocessor.words, self.model.input_vectors.weight.detach().cpu().numpy()

    @inference
    def predict(self, words: list[str]) -> torch.Tensor:
        """The vectors (len(words), dim) of the given words. A lookup, so no batch_size."""
        rows = torch.tensor(self.preprocessor.encode(words), dtype=torch.long, device=self.device)
        return self.model.input_vectors(rows).cpu()
