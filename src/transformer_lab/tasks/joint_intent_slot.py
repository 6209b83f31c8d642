"""Joint intent detection + slot filling: the encoder model, its loss, metrics and optimiser.

The slot loss is the per-word cross-entropy, or, with a CRF output layer (model.crf=true), the
negative log-likelihood of the gold tag sequence over the words (label smoothing does not apply
there); predictions are then the Viterbi sequence, not each word's best tag."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from transformer_lab.data.atis import IGNORE_INDEX, AtisPreprocessor
from transformer_lab.models.encoder import JointIntentSlotConfig, JointIntentSlotModel
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.tasks.checkpoints import NamesItsFamily, read_checkpoint
from transformer_lab.tasks.embeddings import TokenEmbeddings
from transformer_lab.tasks.inference import inference
from transformer_lab.tasks.metrics import SlotF1
from transformer_lab.tasks.pretrained import load_pretrained
from transformer_lab.tasks.schedules import decay_groups, scheduled, warmup_cosine


def word_windows(costs: list[int], budget: int) -> list[tuple[int, int]]:
    """[start, end) windows over an utterance's words, each word costing `costs[i]` positions and
    a window at most `budget`: the first from the first word, each next one starting halfway
    through the one before, the last one ending at the last word and reaching back as far as the
    budget allows. One window when every word fits; a word that alone costs more is a window of
    its own (its encoder cuts it)."""
    if not costs:
        return [(0, 0)]
    windows, start = [], 0
    while True:
        end, used = start, 0
        while end < len(costs) and used + costs[end] <= budget:
            used, end = used + costs[end], end + 1
        end = max(end, start + 1)
        if end == len(costs):
            start, used = end - 1, costs[end - 1]  # the last window: back from the last word
            while start > 0 and used + costs[start - 1] <= budget:
                start, used = start - 1, used + costs[start - 1]
            return [*windows, (start, end)]
        windows.append((start, end))
        start += max(1, (end - start) // 2)


def best_window_of_each_word(windows: list[tuple[int, int]], n_words: int) -> list[int]:
    """For each word, the window that reads it with the most context on its shorter side (the
    BERT reference code's rule for a token read by several windows); the earlier one on a tie."""
    best = []
    for i in range(n_words):
        around = [(min(i - start, end - 1 - i), -w) for w, (start, end) in enumerate(windows) if start <= i < end]
        best.append(-max(around)[1])
    return best


class JointIntentSlotTask(TokenEmbeddings, NamesItsFamily, L.LightningModule):
    preprocessor_class = AtisPreprocessor

    def __init__(
        self,
        model_config: dict,
        preprocessor: dict,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.98),
        warmup_ratio: float = 0.1,
        min_lr_ratio: float = 0.0,
        slot_loss_coef: float = 1.0,
        label_smoothing: float = 0.0,
        embeddings: dict | None = None,
        elmo: str | None = None,
    ):
        """preprocessor: the datamodule's `preprocessor.to_state()` (vocabulary, label lists); it travels
        in the checkpoint so that predict needs nothing else. embeddings: {init: random | word2vec,
        vectors: FILE} (tasks/embeddings.py). elmo: a `pretrain_elmo` checkpoint whose frozen biLM
        layers join the token embeddings (its config and weights are then part of this model's)."""
        super().__init__()
        # Not sent to the logger: the resolved Hydra config is logged instead.
        self.save_hyperparameters(logger=False)
        self.preprocessor = self.preprocessor_class.from_state(preprocessor)
        self.model = self.build_model(model_config)
        self.o_index = self.preprocessor.slot_labels.index("O")
        self.metrics = nn.ModuleDict({stage: self._stage_metrics() for stage in ("val", "test")})

    def build_model(self, model_config: dict) -> nn.Module:
        # A new model with ELMo features takes the biLM's config and weights from its checkpoint;
        # one restored from its own checkpoint has the config already, and the weights follow.
        new_elmo = bool(self.hparams.get("elmo")) and not model_config.get("elmo")
        if new_elmo:
            bilm = read_checkpoint(self.hparams.elmo, "run `dvc repro pretrain_elmo` or set task.elmo=null")
            model_config = {**model_config, "elmo": bilm["hyper_parameters"]["model_config"]}
            self.hparams.model_config = model_config  # saved in this model's checkpoints
        model = JointIntentSlotModel(JointIntentSlotConfig(**model_config))
        if new_elmo:
            load_pretrained(model.encoder.elmo, self.hparams.elmo, prefix="model.", stage="pretrain_elmo",
                            hub_example="task.elmo=null", is_published=lambda source: False, from_published=None)
        return model

    def _stage_metrics(self) -> nn.ModuleDict:
        n_intents, n_slots = len(self.preprocessor.intent_labels), len(self.preprocessor.slot_labels)
        return nn.ModuleDict({
            "intent_acc": MulticlassAccuracy(n_intents, average="micro"),
            "token_acc": MulticlassAccuracy(n_slots, average="micro", ignore_index=IGNORE_INDEX),
            "non_o_token_acc": MulticlassAccuracy(n_slots, average="micro", ignore_index=IGNORE_INDEX),
            "slot_f1": SlotF1(),
            "sentence_acc": MeanMetric(),
        })

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                characters: torch.Tensor | None = None) -> ModelOutput:
        """logits: intent logits; slot_logits: one row per word, aligned with batch["slot_labels"].
        characters: each token's spelling, read with model.char_features or task.elmo."""
        return self.model(input_ids, attention_mask, characters=characters)

    def model_inputs(self, batch: dict) -> dict:
        """What forward reads from a batch: the spelling only for a model that reads it."""
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        config = getattr(self.model, "config", None)
        if getattr(config, "char_features", False) or getattr(config, "elmo", None):
            inputs["characters"] = batch["characters"]
        return inputs

    @property
    def crf(self):
        return getattr(self.model, "crf", None)

    def slot_predictions(self, slot_logits: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """Each word's tag: the CRF's best sequence, else each word's highest score."""
        return self.crf.decode(slot_logits, real) if self.crf is not None else slot_logits.argmax(-1)

    def _losses(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self(**self.model_inputs(batch))
        intent_logits, slot_logits = out.logits, out.slot_logits
        smoothing = self.hparams.label_smoothing
        intent_loss = F.cross_entropy(intent_logits, batch["intent_labels"], label_smoothing=smoothing)
        if self.crf is not None:  # per word, as the cross-entropy is, so slot_loss_coef keeps its meaning
            real = batch["slot_labels"] != IGNORE_INDEX
            slot_loss = -self.crf.log_likelihood(slot_logits, batch["slot_labels"], real).sum() / real.sum()
        else:
            slot_loss = F.cross_entropy(slot_logits.flatten(0, 1), batch["slot_labels"].flatten(),
                                        ignore_index=IGNORE_INDEX, label_smoothing=smoothing)
        return intent_loss, slot_loss, intent_logits, slot_logits

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        intent_loss, slot_loss, _, _ = self._losses(batch)
        loss = intent_loss + self.hparams.slot_loss_coef * slot_loss
        size = batch["input_ids"].shape[0]
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=size, sync_dist=True)
        self.log_dict({"train/intent_loss": intent_loss, "train/slot_loss": slot_loss}, batch_size=size)
        return loss

    def _evaluate(self, batch: dict, stage: str) -> None:
        intent_loss, slot_loss, intent_logits, slot_logits = self._losses(batch)
        size = batch["input_ids"].shape[0]
        self.log(f"{stage}/loss", intent_loss + self.hparams.slot_loss_coef * slot_loss, batch_size=size, sync_dist=True)

        metrics = self.metrics[stage]
        gold, real = batch["slot_labels"], batch["slot_labels"] != IGNORE_INDEX
        intent_pred, slot_pred = intent_logits.argmax(-1), self.slot_predictions(slot_logits, real)
        metrics["intent_acc"].update(intent_pred, batch["intent_labels"])
        metrics["token_acc"].update(slot_pred, gold)
        metrics["non_o_token_acc"].update(slot_pred, gold.masked_fill(gold == self.o_index, IGNORE_INDEX))
        metrics["slot_f1"].update(self._tag_strings(slot_pred, real), self._tag_strings(gold, real))
        all_slots_right = ((slot_pred == gold) | ~real).all(dim=1)
        metrics["sentence_acc"].update((all_slots_right & (intent_pred == batch["intent_labels"])).float())
        for name, metric in metrics.items():
            self.log(f"{stage}/{name}", metric, on_epoch=True, prog_bar=name == "slot_f1", batch_size=size)

    def _tag_strings(self, ids: torch.Tensor, real: torch.Tensor) -> list[list[str]]:
        labels = self.preprocessor.slot_labels
        return [[labels[i] for i in row[keep].tolist()] for row, keep in zip(ids, real)]

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(decay_groups(self.model, self.hparams.weight_decay), lr=self.hparams.lr,
                                      betas=tuple(self.hparams.betas))
        total = self.trainer.estimated_stepping_batches
        scheduler = warmup_cosine(optimizer, total, int(self.hparams.warmup_ratio * total), self.hparams.min_lr_ratio)
        return {"optimizer": optimizer, "lr_scheduler": scheduled(scheduler)}

    def window_budget(self) -> int:
        return self.model.config.max_len - 1  # positions after [CLS]

    def word_costs(self, words: list[str]) -> list[int]:
        return [1] * len(words)  # one position a word

    def read_windows(self, windows: list[list[str]]) -> tuple[torch.Tensor, list[list[str]]]:
        """Each window's intent probabilities (windows, n_intents) and a slot tag per word."""
        batch = {name: tensor.to(self.device) for name, tensor in self.preprocessor.batch(windows).items()}
        out = self(**self.model_inputs(batch))
        slots = self.slot_predictions(out.slot_logits, batch["attention_mask"][:, 1:])
        return out.logits.softmax(-1), [self.preprocessor.decode_slots(row, len(words))
                                        for words, row in zip(windows, slots.tolist())]

    @inference
    def predict(self, utterances: list[list[str]], batch_size: int = 256) -> list[dict]:
        """Intent and one slot tag per word for each raw utterance (a list of words):
        [{"intent": str, "slots": [tag per word]}]. An utterance longer than the model reads is
        read whole, in overlapping windows (word_windows): each word tagged by the window that
        reads it with the most context (best_window_of_each_word), the intent the most probable
        one on average over the windows. One window, the usual case, is the utterance as it is."""
        spans = [word_windows(self.word_costs(words), self.window_budget()) for words in utterances]
        windows = [words[start:end] for words, own in zip(utterances, spans) for start, end in own]
        intents, tags = [], []
        for first in range(0, len(windows), batch_size):
            probabilities, window_tags = self.read_windows(windows[first:first + batch_size])
            intents += list(probabilities)
            tags += window_tags
        results, first = [], 0
        for words, own in zip(utterances, spans):
            chosen = best_window_of_each_word(own, len(words))
            slots = [tags[first + w][i - own[w][0]] for i, w in enumerate(chosen)]
            intent = torch.stack(intents[first:first + len(own)]).mean(0).argmax().item()
            results.append({"intent": self.preprocessor.intent_labels[intent], "slots": slots})
            first += len(own)
        return results
