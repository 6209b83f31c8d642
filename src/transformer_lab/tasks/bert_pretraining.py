"""BERT pre-training: masked-LM + next-sentence losses, their accuracies, tokens/second;
and `load_pretrained_bert`, which every fine-tuning task uses to start from these weights."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from transformer_lab.data import published
from transformer_lab.data.bert import BertPreprocessor
from transformer_lab.models.bert import BertConfig, BertForPreTraining, BertModel, from_hf_state_dict
from transformer_lab.tasks.checkpoints import NamesItsFamily
from transformer_lab.tasks.embeddings import TokenEmbeddings
from transformer_lab.tasks.inference import batches, inference
from transformer_lab.tasks.losses import cross_entropy
from transformer_lab.tasks.pretrained import load_pretrained
from transformer_lab.tasks.schedules import adamw_warmup_linear
from transformer_lab.tasks.throughput import TokenThroughput


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
                 betas: tuple[float, float] = (0.9, 0.999), warmup_ratio: float = 0.1, embeddings: dict | None = None):
        """preprocessor: the datamodule's BertPreprocessor state (the tokenizer, max_len), so that
        predict() reads raw text. embeddings: {init, vectors} (tasks/embeddings.py)."""
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.preprocessor = BertPreprocessor.from_state(preprocessor)
        self.model = BertForPreTraining(BertConfig(**model_config))
        vocab = self.model.config.vocab_size
        self.metrics = torch.nn.ModuleDict({
            f"{stage}_{name}": metric for stage in ("train", "val")
            for name, metric in (("mlm_acc", MulticlassAccuracy(vocab, average="micro")),
                                 ("nsp_acc", MulticlassAccuracy(2, average="micro")))})

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        chosen = batch["mlm_labels"] != -100
        out = self.model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"], mlm_positions=chosen)
        mlm_logits, targets = out.logits, batch["mlm_labels"][chosen]
        result = {"mlm_loss": cross_entropy(mlm_logits, targets), "mlm_pred": mlm_logits.argmax(-1),
                  "mlm_target": targets}
        if "is_next" in batch:  # sentence pairs; single sentences train the masked LM alone
            result["nsp_loss"] = F.cross_entropy(out.nsp_logits, batch["is_next"])
            result["nsp_pred"] = out.nsp_logits.argmax(-1)
        return result

    def _step(self, batch: dict, stage: str) -> torch.Tensor:
        out = self(batch)
        pairs = "nsp_loss" in out
        loss = out["mlm_loss"] + out["nsp_loss"] if pairs else out["mlm_loss"]
        size = len(batch["input_ids"])
        self.metrics[f"{stage}_mlm_acc"].update(out["mlm_pred"], out["mlm_target"])
        losses = {f"{stage}/loss": loss, f"{stage}/mlm_loss": out["mlm_loss"]}
        accuracies = {f"{stage}/mlm_acc": self.metrics[f"{stage}_mlm_acc"]}
        if pairs:
            self.metrics[f"{stage}_nsp_acc"].update(out["nsp_pred"], batch["is_next"])
            losses[f"{stage}/nsp_loss"] = out["nsp_loss"]
            accuracies[f"{stage}/nsp_acc"] = self.metrics[f"{stage}_nsp_acc"]
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
        filled = []
        for chunk in batches(batch, batch_size, self.device):
            logits = self.model(chunk["input_ids"], chunk["segment_ids"], chunk["attention_mask"]).logits
            for ids, row in zip(chunk["input_ids"], logits):
                best = row[ids == mask_id].softmax(-1).topk(min(top_k, row.shape[-1]))
                filled.append([[{"token": token(i), "token_id": i, "score": p}
                                for p, i in zip(scores.tolist(), indices.tolist())]
                               for scores, indices in zip(best.values, best.indices)])
        return filled
