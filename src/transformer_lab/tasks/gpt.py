"""GPT as Lightning tasks: causal language-model pre-training, and GPT-1 fine-tuning
(classification, entailment, similarity, multiple choice) with the auxiliary LM loss."""

from __future__ import annotations

import math

import lightning as L
import torch
from torch import nn

from transformer_lab.data.bert import IGNORE_INDEX
from transformer_lab.data.gpt import GPTClassificationPreprocessor, GPTPreprocessor
from transformer_lab.errors import TransformerLabError
from transformer_lab.models.gpt import GPTClassifierConfig, GPTConfig, GPTForSequenceClassification, GPTLMHeadModel
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.tasks.checkpoints import NamesItsFamily
from transformer_lab.tasks.classification import ClassificationTask
from transformer_lab.tasks.embeddings import TokenEmbeddings
from transformer_lab.tasks.inference import inference
from transformer_lab.tasks.losses import cross_entropy
from transformer_lab.tasks.pretrained import load_pretrained
from transformer_lab.tasks.schedules import adamw_with_warmup
from transformer_lab.tasks.throughput import TokenThroughput


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; IGNORE_INDEX targets (padding) do not count."""
    return cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)


class GPTPretrainingTask(TokenEmbeddings, TokenThroughput, NamesItsFamily, L.LightningModule):
    """Next-token prediction. AdamW (decay on matrices), linear warm-up then cosine decay to
    min_lr_ratio × lr (GPT-1's schedule); gradient clipping is the trainer's gradient_clip_val.
    Logs loss, validation perplexity, tokens/second, the learning rate and, with model.ffn=moe,
    the load-balancing loss (added to the loss with weight moe_aux_weight)."""

    def __init__(self, model_config: dict, preprocessor: dict, lr: float = 1e-3, weight_decay: float = 0.1,
                 betas: tuple[float, float] = (0.9, 0.95), warmup_steps: int = 100, min_lr_ratio: float = 0.1,
                 moe_aux_weight: float = 0.01, embeddings: dict | None = None):
        """preprocessor: the datamodule's GPTPreprocessor state (the tokenizer), so that a checkpoint
        alone turns prompts into text. embeddings: {init, vectors} (tasks/embeddings.py)."""
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.preprocessor = GPTPreprocessor.from_state(preprocessor)
        self.model = GPTLMHeadModel(GPTConfig(**model_config))

    def forward(self, input_ids: torch.Tensor) -> ModelOutput:
        return self.model(input_ids)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        out = self(batch["input_ids"])
        loss = lm_loss(out.logits, batch["labels"])
        size = len(batch["input_ids"])
        if out.aux_loss is not None:  # model.ffn=moe
            balance = out.aux_loss
            self.log("train/moe_balance_loss", balance, on_step=True, on_epoch=True, batch_size=size)
            self.log("train/lm_loss", loss, on_step=True, on_epoch=True, batch_size=size, sync_dist=True)
            loss = loss + self.hparams.moe_aux_weight * balance
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=size, sync_dist=True)
        self.log_throughput(batch["input_ids"].numel())
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.log("val/loss", lm_loss(self(batch["input_ids"]).logits, batch["labels"]), on_epoch=True, prog_bar=True,
                 batch_size=len(batch["input_ids"]), sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        loss = self.trainer.callback_metrics.get("val/loss")
        if loss is not None:  # perplexity of the epoch's mean loss (not the mean of per-batch perplexities)
            self.log("val/perplexity", math.exp(min(float(loss), 50.0)))

    def configure_optimizers(self):
        h = self.hparams
        total = self.trainer.estimated_stepping_batches
        return adamw_with_warmup(self.model, h.lr, h.weight_decay, total, min(h.warmup_steps, total), h.betas,
                                 decay="cosine", min_ratio=h.min_lr_ratio, trainer=self.trainer)

    @inference
    def predict(self, prompts: list[str], max_new_tokens: int, stop_at_eos: bool = True, **sampling) -> list[dict]:
        """Continuations of raw prompts (an empty prompt starts a new document): one
        {"text", "token_ids"} per prompt, text cut at the first end-of-text when stop_at_eos, token_ids
        every generated id (GPTLMHeadModel.generate pads a row that ended early with end-of-text).
        sampling: generate's options (strategy, temperature, top_k, top_p, generator, use_cache).
        All prompts in one batch, no batch_size: a sampled row's tokens depend on the batch it was
        drawn in; so the prompts must encode to the same number of tokens."""
        encoded = [self.preprocessor.encode(prompt) for prompt in prompts]
        if len({len(ids) for ids in encoded}) > 1:
            raise TransformerLabError(f"prompts encode to {sorted({len(ids) for ids in encoded})} tokens; "
                                      "one call takes prompts of one length (call once per prompt)")
        eos_id = self.preprocessor.eos_id
        new = self.model.generate(torch.tensor(encoded, device=self.device), max_new_tokens,
                                  eos_id=eos_id if stop_at_eos else None, **sampling).cpu()
        results = []
        for row in new.tolist():
            kept = row[:row.index(eos_id)] if stop_at_eos and eos_id in row else row
            results.append({"text": self.preprocessor.decode(kept), "token_ids": row})
        return results


class GPTClassificationTask(ClassificationTask):
    """GPT-1 fine-tuning: L = L_task + lm_weight · L_lm (lm_weight 0.5 in the paper; 0 disables
    the auxiliary loss). Metrics, logging and test scoring are the BERT fine-tuning task's, so
    the two models' runs line up in MLflow."""

    preprocessor_class = GPTClassificationPreprocessor

    def __init__(self, model_config: dict, preprocessor: dict, pretrained: str | None = None, lm_weight: float = 0.5,
                 lr: float = 6.25e-5, weight_decay: float = 0.01, warmup_ratio: float = 0.002,
                 moe_aux_weight: float = 0.01, embeddings: dict | None = None):
        """preprocessor: the datamodule's GPTClassificationPreprocessor state; predict() takes texts,
        (text_a, text_b) pairs or (context, choices) as its format reads them. pretrained: a
        `pretrain_gpt` checkpoint, "hf:NAME" (GPT-2 weights), or None for a random start.
        moe_aux_weight: weight of the load-balancing loss with model.ffn=moe."""
        super().__init__(model_config, preprocessor, pretrained, lr, weight_decay, warmup_ratio, embeddings=embeddings)
        self.save_hyperparameters(logger=False)

    def build_model(self, model_config: dict, pretrained: str | None) -> nn.Module:
        model = GPTForSequenceClassification(GPTClassifierConfig(**model_config))
        load_pretrained(model.gpt, pretrained, prefix="model.gpt.", stage="pretrain_gpt", hub_example="hf:gpt2",
                        is_published=lambda source: source.startswith("hf:"),
                        from_published=lambda source: GPTLMHeadModel.from_pretrained(source[3:]).gpt.state_dict())
        return model

    def classify(self, batch: dict) -> tuple[ModelOutput, torch.Tensor | None]:
        out = self.model(batch["input_ids"], batch["last"])
        if not self.training:
            return out, None
        auxiliary = []
        if self.hparams.lm_weight:
            auxiliary.append(self.hparams.lm_weight * lm_loss(out.lm_logits, batch["lm_labels"]))
        if out.aux_loss is not None:  # model.ffn=moe
            auxiliary.append(self.hparams.moe_aux_weight * out.aux_loss)
        return out, sum(auxiliary) if auxiliary else None
