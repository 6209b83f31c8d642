"""ELMo's bidirectional language model as a Lightning task: the mean of the forward (next word) and
backward (previous word) losses, Adam with warm-up and linear decay, gradient clipping by the
trainer; and the frozen representation other tasks read (`features`)."""

from __future__ import annotations

import math

import lightning as L
import torch

from transformer_lab.data.elmo import ElmoPreprocessor, words_of
from transformer_lab.models.elmo import IGNORE_INDEX, ElmoBiLM, ElmoConfig
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.tasks.checkpoints import NamesItsFamily
from transformer_lab.tasks.inference import inference
from transformer_lab.tasks.schedules import adamw_with_warmup
from transformer_lab.tasks.throughput import TokenThroughput


class ElmoPretrainingTask(TokenThroughput, NamesItsFamily, L.LightningModule):
    """Logs the mean of the two directions' losses (`loss`, what is minimised: the paper maximises
    their summed log-likelihood), each direction's, and the forward LM's per-word perplexity on
    validation (every scored word weighs the same, whatever its sentence's length)."""

    def __init__(self, model_config: dict, preprocessor: dict, lr: float = 2e-3, weight_decay: float = 0.0,
                 warmup_steps: int = 100):
        """preprocessor: the datamodule's ElmoPreprocessor state (the output vocabulary)."""
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.preprocessor = ElmoPreprocessor.from_state(preprocessor)
        self.model = ElmoBiLM(ElmoConfig(**model_config))

    def forward(self, batch: dict) -> ModelOutput:
        return self.model(batch["characters"], batch["lengths"], batch.get("word_ids"))

    def model_step(self, batch: dict, stage: str) -> torch.Tensor:
        out = self(batch)
        scored = int((batch["word_ids"][:, 1:] != IGNORE_INDEX).sum())  # words each direction predicts
        for name, value in (("loss", out.loss), ("forward_loss", out.forward_loss),
                            ("backward_loss", out.backward_loss)):
            self.log(f"{stage}/{name}", value, on_step=stage == "train", on_epoch=True, prog_bar=name == "loss",
                     batch_size=scored, sync_dist=True)
        return out.loss

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self.log_throughput(int(batch["lengths"].sum()))
        return self.model_step(batch, "train")

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.model_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        loss = self.trainer.callback_metrics.get("val/forward_loss")
        if loss is not None:  # exp of the mean per-word loss over the epoch, not a mean of per-batch perplexities
            self.log("val/perplexity", math.exp(min(float(loss), 50.0)))

    def configure_optimizers(self):
        h = self.hparams
        total = self.trainer.estimated_stepping_batches
        return adamw_with_warmup(self.model, h.lr, h.weight_decay, total, min(h.warmup_steps, total),
                                 trainer=self.trainer)

    @inference
    def forward_word_nll(self, sentences: list[list[str]], batch_size: int = 128) -> tuple[float, int]:
        """(total negative log-likelihood, words scored) of the forward LM over the sentences:
        every word and each sentence's </S>, so exp(total / words) is the per-word perplexity."""
        total, words = 0.0, 0
        for start in range(0, len(sentences), batch_size):
            batch = {k: v.to(self.device) for k, v in self.preprocessor.batch(sentences[start:start + batch_size]).items()}
            forward_states, _, _ = self.model.layers(batch["characters"], batch["lengths"])
            targets = batch["word_ids"][:, 1:]
            total += float(self.model.word_loss(forward_states[-1][:, :-1], targets, reduction="sum"))
            words += int((targets != IGNORE_INDEX).sum())
        return total, words

    @inference
    def features(self, sentences: list[str] | list[list[str]], batch_size: int = 64) -> list[torch.Tensor]:
        """Each sentence's ELMo layers, (L + 1, words, 2 * projection_dim) without the <S> / </S>
        markers: layer 0 context-free (characters only), the others contextual. A sentence is a
        string (cut into words as in training) or a list of words."""
        sentences = [words_of(s) if isinstance(s, str) else list(s) for s in sentences]
        layers = []
        for start in range(0, len(sentences), batch_size):
            chunk = sentences[start:start + batch_size]
            batch = self.preprocessor.batch(chunk)
            stacked = self.model(batch["characters"].to(self.device), batch["lengths"].to(self.device)).logits
            for row, length in enumerate(batch["lengths"].tolist()):
                layers.append(stacked[:, row, 1:length - 1].cpu())
        return layers
