"""GloVe training: AdaGrad at the paper's initial rate 0.05 over the co-occurrence matrix's non-zero
entries, shuffled, a step per batch (the paper samples the non-zero entries stochastically; a batch
holding all of them is the full-batch AdaGrad that mittens runs).

Manual optimisation: the step is taken on J/2 of the batch (models/glove.py), by torch.optim.Adagrad
after a backward pass (model.update=autograd) or by the model's compiled loop in place on the rows
the batch touches, with the optimiser's own sums of squared gradients (model.update=compiled), so
that checkpoints and resuming hold the same AdaGrad state either way."""

from __future__ import annotations

import time

import lightning as L
import numpy as np
import torch

from transformer_lab.data.word2vec import Word2VecPreprocessor
from transformer_lab.models.glove import GloVe, GloVeConfig
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.tasks.checkpoints import NamesItsFamily
from transformer_lab.tasks.inference import inference
from transformer_lab.tasks.schedules import scheduled


class GloVeTask(NamesItsFamily, L.LightningModule):
    def __init__(self, model_config: dict, preprocessor: dict, lr: float = 0.05, initial_accumulator: float = 0.1):
        """preprocessor: the datamodule's vocabulary state (words and their counts).
        initial_accumulator: where AdaGrad's sums of squared gradients start (mittens' and TensorFlow's
        0.1; GloVe's C code, which steps one entry at a time, starts at 1)."""
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.preprocessor = Word2VecPreprocessor.from_state(preprocessor)
        self.model = GloVe(GloVeConfig(**model_config))
        self.automatic_optimization = False
        self._epoch_start, self._epoch_entries = 0.0, 0

    def forward(self, batch: dict) -> ModelOutput:
        return self.model(batch["rows"], batch["cols"], batch["counts"])

    def training_step(self, batch: dict, batch_idx: int) -> dict:
        """One AdaGrad step on the batch; returns each entry's term of J before the step (entry_losses),
        which callbacks receive as the batch's outputs."""
        optimizer = self.optimizers()
        if self.model.config.update == "compiled":
            adagrad = optimizer.optimizer
            group = adagrad.param_groups[0]
            sums = [adagrad.state[table]["sum"] for table in self.model.tables()]
            losses = self.model.adagrad_step(batch["rows"], batch["cols"], batch["counts"], sums, group["lr"],
                                             group["eps"])
            # The rows moved in place above, so Adagrad has no gradient to apply; its step is how
            # Lightning counts training steps (global_step, checkpoints, max_steps, resuming).
            optimizer.step()
        else:
            losses = self(batch).loss
            optimizer.zero_grad()
            self.manual_backward(losses.sum() / 2)
            optimizer.step()
        self.lr_schedulers().step()

        self._epoch_entries += len(losses)
        self.log("train/entries_per_s", self._epoch_entries / (time.perf_counter() - self._epoch_start))
        # J per entry (the paper's terms, no 1/2), each as it stood just before its step
        self.log("train/loss", losses.mean(), on_step=True, on_epoch=True, prog_bar=True, batch_size=len(losses))
        return {"entry_losses": losses.detach()}

    def on_train_epoch_start(self) -> None:
        self._epoch_start, self._epoch_entries = time.perf_counter(), 0

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        losses = self.model.entry_losses(batch["rows"], batch["cols"], batch["counts"])
        self.log("val/loss", losses.mean(), batch_size=len(losses), sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.Adagrad(self.model.parameters(), lr=self.hparams.lr,
                                        initial_accumulator_value=self.hparams.initial_accumulator)
        # The paper's rate is constant (AdaGrad scales it per coordinate); a schedule only so that the
        # rate is logged as in every family.
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        return {"optimizer": optimizer, "lr_scheduler": scheduled(schedule)}

    def vectors(self) -> tuple[list[str], np.ndarray]:
        """The whole vocabulary and its vectors w + w~, for export (word2vec text format)."""
        return self.preprocessor.words, self.model.vectors().detach().cpu().numpy()

    @inference
    def predict(self, words: list[str]) -> torch.Tensor:
        """The vectors w + w~ (len(words), dim) of the given words. A lookup, so no batch_size."""
        rows = torch.tensor(self.preprocessor.encode(words), dtype=torch.long, device=self.device)
        return self.model.vectors()[rows].cpu()
