"""BERT pre-training: masked-LM + next-sentence losses, their accuracies, tokens/second;
and `load_pretrained_bert`, which every fine-tuning task uses to start from these weights.

`objective: causal` pre-trains the same encoder as a left-to-right language model instead (the
BERT paper's "LTR & No NSP" ablation): causal attention, and the next token as the label at every
position, read from the sentence as written (the masked LM's corruption undone). `objective: electra`
pre-trains it as ELECTRA's discriminator (models/bert.py's BertForReplacedTokenDetection): a small
generator's masked LM fills the masked positions, and the encoder labels every token replaced or
original; the loss is the generator's masked-LM loss + rtd_weight x the discriminator's. Fine-tuning
is bidirectional in every case and loads the same `model.bert` weights; only the objective differs."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics.classification import BinaryAccuracy, MulticlassAccuracy

from transformer_lab.data import published
from transformer_lab.data.bert import IGNORE_INDEX, BertPreprocessor
from transformer_lab.errors import TransformerLabError
from transformer_lab.models.bert import (
    BertConfig,
    BertForPreTraining,
    BertForReplacedTokenDetection,
    BertModel,
    from_hf_state_dict,
)
from transformer_lab.tasks.checkpoints import NamesItsFamily
from transformer_lab.tasks.embeddings import TokenEmbeddings
from transformer_lab.tasks.inference import batches, inference
from transformer_lab.tasks.losses import cross_entropy
from transformer_lab.tasks.pretrained import load_pretrained
from transformer_lab.tasks.schedules import adamw_warmup_linear
from transformer_lab.tasks.throughput import TokenThroughput

OBJECTIVES = ("mlm", "causal", "electra")


def published_body(start) -> dict:
    """The encoder body's weights of a published start (data/published.py's PublishedBert) under
    models.bert.BertModel's names: embeddings, blocks, pooler."""
    state = from_hf_state_dict(start.weights())
    return {k.removeprefix("bert."): v for k, v in state.items() if k.startswith("bert.")}


def load_pretrained_bert(bert: BertModel, source: str | None) -> None:
    """Copy pre-trained encoder weights into `bert` (embeddings, blocks, pooler).

    source: None (keep the random initialisation), a `pretrain_bert` checkpoint (.ckpt), or published
    weights (published.py: minilm, a Hugging Face folder, hf:NAME; train() has already given the model
    their sizes and the data their tokenizer). The encoder's sizes and vocabulary must match.
    """
    load_pretrained(bert, source, prefix="model.bert.", stage="pretrain_bert", hub_example="task.pretrained=minilm",
                    is_published=published.is_published,
                    from_published=lambda name: published_body(published.resolve(name)))


class BertPretrainingTask(TokenEmbeddings, TokenThroughput, NamesItsFamily, L.LightningModule):
    def __init__(self, model_config: dict, preprocessor: dict, lr: float = 1e-3, weight_decay: float = 0.01,
                 betas: tuple[float, float] = (0.9, 0.999), warmup_ratio: float = 0.1, embeddings: dict | None = None,
                 objective: str = "mlm", rtd_weight: float = 50.0, generator_layers: int = 1):
        """preprocessor: the datamodule's BertPreprocessor state (the tokenizer, max_len), so that
        predict() reads raw text. embeddings: {init, vectors} (tasks/embeddings.py). objective: mlm
        (BERT's masked LM, with next-sentence prediction on sentence pairs), causal (left to right,
        on single sentences: data.datamodule.next_sentence=false) or electra (replaced-token
        detection, single sentences; rtd_weight: the discriminator loss's weight, the paper's 50;
        generator_layers: the generator's blocks, of the encoder's width)."""
        super().__init__()
        if objective not in OBJECTIVES:
            raise TransformerLabError(f"task.objective={objective!r}; expected one of {', '.join(OBJECTIVES)}")
        self.save_hyperparameters(logger=False)
        self.preprocessor = BertPreprocessor.from_state(preprocessor)
        config = BertConfig(**model_config)
        if objective == "electra":
            self.model = BertForReplacedTokenDetection(config, generator_layers)
        else:
            self.model = BertForPreTraining(config)
        self.lm = "lm" if objective == "causal" else "mlm"  # the language model's metrics: lm_loss or mlm_loss
        vocab = self.model.config.vocab_size
        self.metrics = torch.nn.ModuleDict({
            f"{stage}_{name}": metric for stage in ("train", "val")
            for name, metric in ((f"{self.lm}_acc", MulticlassAccuracy(vocab, average="micro")),
                                 ("nsp_acc", MulticlassAccuracy(2, average="micro")), ("rtd_acc", BinaryAccuracy()))})

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        if self.hparams.objective == "causal":
            return self.causal_lm(batch)
        if self.hparams.objective == "electra":
            return self.replaced_token_detection(batch)
        chosen = batch["mlm_labels"] != IGNORE_INDEX
        out = self.model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"], mlm_positions=chosen)
        mlm_logits, targets = out.logits, batch["mlm_labels"][chosen]
        result = {"lm_loss": cross_entropy(mlm_logits, targets), "lm_pred": mlm_logits.argmax(-1),
                  "lm_target": targets}
        if "is_next" in batch:  # sentence pairs; single sentences train the masked LM alone
            result["nsp_loss"] = F.cross_entropy(out.nsp_logits, batch["is_next"])
            result["nsp_pred"] = out.nsp_logits.argmax(-1)
        return result

    def causal_lm(self, batch: dict) -> dict[str, torch.Tensor]:
        """Left to right: position i, seeing positions 0..i only, predicts token i + 1, at every
        position followed by a real token (the last word predicts [SEP]). The masking collator's
        corruption is undone first: where it chose a token, its label is the token as written."""
        if "is_next" in batch:
            raise TransformerLabError("task.objective=causal pre-trains on single sentences: set "
                                      "data.datamodule.next_sentence=false (a causal [CLS] sees no sentence B)")
        labels = batch.get("mlm_labels")
        ids = batch["input_ids"] if labels is None else torch.where(labels != IGNORE_INDEX, labels, batch["input_ids"])
        real = batch["attention_mask"].bool()
        predicting = torch.zeros_like(real)
        predicting[:, :-1] = real[:, 1:]  # a real token follows
        out = self.model(ids, batch["segment_ids"], batch["attention_mask"], mlm_positions=predicting, is_causal=True)
        targets = ids[:, 1:][real[:, 1:]]  # row by row, in position order: the order of hidden[predicting]
        return {"lm_loss": cross_entropy(out.logits, targets), "lm_pred": out.logits.argmax(-1), "lm_target": targets}

    def replaced_token_detection(self, batch: dict) -> dict[str, torch.Tensor]:
        """ELECTRA: the generator's masked LM at the collator's chosen positions, and the
        discriminator's binary loss over every real token ([CLS] and [SEP] included, as the paper)."""
        if "is_next" in batch:
            raise TransformerLabError("task.objective=electra pre-trains on single sentences: set "
                                      "data.datamodule.next_sentence=false (ELECTRA drops next-sentence prediction)")
        chosen = batch["mlm_labels"] != IGNORE_INDEX
        original = torch.where(chosen, batch["mlm_labels"], batch["input_ids"])
        out = self.model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"], chosen, original)
        real = batch["attention_mask"].bool()
        logits, replaced = out.logits[real], out.replaced[real]
        targets = batch["mlm_labels"][chosen]
        return {"lm_loss": cross_entropy(out.generator_logits, targets), "lm_pred": out.generator_logits.argmax(-1),
                "lm_target": targets, "rtd_loss": F.binary_cross_entropy_with_logits(logits, replaced.float()),
                "rtd_pred": (logits > 0).long(), "rtd_target": replaced.long()}

    def _step(self, batch: dict, stage: str) -> torch.Tensor:
        out = self(batch)
        pairs = "nsp_loss" in out
        loss = out["lm_loss"] + out["nsp_loss"] if pairs else out["lm_loss"]
        size = len(batch["input_ids"])
        self.metrics[f"{stage}_{self.lm}_acc"].update(out["lm_pred"], out["lm_target"])
        losses = {f"{stage}/loss": loss, f"{stage}/{self.lm}_loss": out["lm_loss"]}
        accuracies = {f"{stage}/{self.lm}_acc": self.metrics[f"{stage}_{self.lm}_acc"]}
        if pairs:
            self.metrics[f"{stage}_nsp_acc"].update(out["nsp_pred"], batch["is_next"])
            losses[f"{stage}/nsp_loss"] = out["nsp_loss"]
            accuracies[f"{stage}/nsp_acc"] = self.metrics[f"{stage}_nsp_acc"]
        if "rtd_loss" in out:
            loss = loss + self.hparams.rtd_weight * out["rtd_loss"]
            losses[f"{stage}/loss"] = loss
            self.metrics[f"{stage}_rtd_acc"].update(out["rtd_pred"], out["rtd_target"])
            losses[f"{stage}/rtd_loss"] = out["rtd_loss"]
            accuracies[f"{stage}/rtd_acc"] = self.metrics[f"{stage}_rtd_acc"]
        self.log_dict(losses, on_step=stage == "train", on_epoch=True, prog_bar=stage == "val", batch_size=size,
                      sync_dist=True)
        self.log_dict(accuracies, on_step=False, on_epoch=True, batch_size=size)
        return loss

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self._step(batch, "train")
        self.log_throughput(int(batch["attention_mask"].sum()))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._step(batch, "val")

    def configure_optimizers(self):
        h = self.hparams
        return adamw_warmup_linear(self.model, h.lr, h.weight_decay, h.warmup_ratio,
                                   self.trainer.estimated_stepping_batches, h.betas, trainer=self.trainer)

    def predict(self, texts: list[str], batch_size: int = 256) -> list[list[str]]:
        """The masked LM's fill-in for every `[MASK]` of each raw text, in order: one list of token
        strings per text."""
        return [[candidates[0]["token"] for candidates in masks] for masks in self.fill_mask(texts, 1, batch_size)]

    @inference
    def fill_mask(self, texts: list[str], top_k: int = 5, batch_size: int = 256) -> list[list[list[dict]]]:
        """For each raw text, for each of its `[MASK]`s in order, the masked LM's top_k tokens:
        {"token", "token_id", "score"} (the probability over the vocabulary), best first."""
        batch = self.preprocessor.batch(texts)
        mask_id, token = self.preprocessor.specials["mask"], self.preprocessor.tokenizer.id_to_token
        masked_lm = self.model.generator if self.hparams.objective == "electra" else self.model
        filled = []
        for chunk in batches(batch, batch_size, self.device):
            logits = masked_lm(chunk["input_ids"], chunk["segment_ids"], chunk["attention_mask"]).logits
            for ids, row in zip(chunk["input_ids"], logits):
                best = row[ids == mask_id].softmax(-1).topk(min(top_k, row.shape[-1]))
                filled.append([[{"token": token(i), "token_id": i, "score": p}
                                for p, i in zip(scores.tolist(), indices.tolist())]
                               for scores, indices in zip(best.values, best.indices)])
        return filled
