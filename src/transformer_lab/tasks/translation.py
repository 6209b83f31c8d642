"""Translation as a Lightning task: the encoder-decoder Transformer trained with teacher forcing
on shifted-right targets, label smoothing and the inverse-square-root warm-up (the 2017
paper's recipe), selected on the validation set's BLEU of greedy translations."""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F

from transformer_lab.data.bert import IGNORE_INDEX
from transformer_lab.data.translation import TranslationPreprocessor, length_sorted_batches
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.models.seq2seq import Seq2SeqConfig, TransformerSeq2Seq
from transformer_lab.tasks.checkpoints import NamesItsFamily
from transformer_lab.tasks.inference import inference
from transformer_lab.tasks.schedules import adamw_with_warmup
from transformer_lab.tasks.throughput import TokenThroughput


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """sacreBLEU's corpus BLEU and chrF (its default 13a tokenisation, on detokenized text)."""
    import sacrebleu

    return {"bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score}


def decoding_budget(source_length: int, max_len: int) -> int:
    """New tokens a translation may take: 1.5 x the source + 10 (a target rarely runs longer), at most max_len."""
    return min(max_len, int(1.5 * source_length) + 10)


class TranslationTask(TokenThroughput, NamesItsFamily, L.LightningModule):
    """Loss: cross-entropy with label smoothing over the target tokens (padding not counted).
    Logs train/loss, val/loss (smoothed, as trained), val/nll and val/perplexity (unsmoothed),
    and val/bleu, val/chrf of greedy translations of the validation set (val_bleu=false skips
    the decoding). AdamW (Adam with decay 0 by default) and the inverse-square-root warm-up."""

    def __init__(self, model_config: dict, preprocessor: dict, lr: float = 7e-4, warmup_steps: int = 4000,
                 label_smoothing: float = 0.1, betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-9,
                 weight_decay: float = 0.0, val_bleu: bool = True):
        """preprocessor: the datamodule's TranslationPreprocessor state (the shared vocabulary), so
        that a checkpoint alone translates raw text. lr: the peak rate, reached after warmup_steps."""
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.preprocessor = TranslationPreprocessor.from_state(preprocessor)
        self.model = TransformerSeq2Seq(Seq2SeqConfig(**model_config))
        self._hypotheses: list[str] = []
        self._references: list[str] = []

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> ModelOutput:
        return self.model(input_ids, decoder_input_ids)

    def losses(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(label-smoothed loss, plain negative log-likelihood), both per target token."""
        logits = self(batch["input_ids"], batch["decoder_input_ids"]).logits.flatten(0, 1)
        labels = batch["labels"].flatten()
        smoothed = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX,
                                   label_smoothing=self.hparams.label_smoothing)
        nll = F.cross_entropy(logits.detach(), labels, ignore_index=IGNORE_INDEX)
        return smoothed, nll

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, _ = self.losses(batch)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=len(batch["input_ids"]),
                 sync_dist=True)
        self.log_throughput(int((batch["input_ids"] != self.preprocessor.pad_id).sum())
                            + int((batch["labels"] != IGNORE_INDEX).sum()))
        return loss

    def on_validation_epoch_start(self) -> None:
        self._hypotheses, self._references = [], []

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, nll = self.losses(batch)
        size = len(batch["input_ids"])
        self.log("val/loss", loss, on_epoch=True, prog_bar=True, batch_size=size, sync_dist=True)
        self.log("val/nll", nll, on_epoch=True, batch_size=size, sync_dist=True)
        if self.hparams.val_bleu:
            budget = decoding_budget(batch["input_ids"].shape[1], self.model.config.max_len)
            tokens = self.model.generate(batch["input_ids"], budget).tolist()
            self._hypotheses += [self.preprocessor.decode(row) for row in tokens]
            self._references += batch["references"]

    def on_validation_epoch_end(self) -> None:
        nll = self.trainer.callback_metrics.get("val/nll")
        if nll is not None:  # perplexity of the epoch's mean loss
            self.log("val/perplexity", math.exp(min(float(nll), 50.0)))
        hypotheses, references = self._hypotheses, self._references
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # BLEU is a corpus score: every process's share of the validation set, scored together
            shares = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(shares, (hypotheses, references))
            hypotheses = [h for share in shares for h in share[0]]
            references = [r for share in shares for r in share[1]]
        if hypotheses:
            scores = corpus_scores(hypotheses, references)
            self.log("val/bleu", scores["bleu"], prog_bar=True)
            self.log("val/chrf", scores["chrf"])

    def configure_optimizers(self):
        h = self.hparams
        return adamw_with_warmup(self.model, h.lr, h.weight_decay, self.trainer.estimated_stepping_batches,
                                 h.warmup_steps, h.betas, decay="inverse_sqrt", eps=h.eps,
                                 trainer=self.trainer)

    @inference
    def predict(self, texts: list[str], num_beams: int = 4, length_penalty: float = 1.0, batch_size: int = 64,
                max_new_tokens: int | None = None) -> list[str]:
        """Translations of raw source sentences, beam search (num_beams=1: greedy); batches of
        similar length, answers in the order given."""
        encoded = self.preprocessor.encode(list(texts))
        translations: list[str | None] = [None] * len(encoded)
        for rows, input_ids in length_sorted_batches(encoded, batch_size, self.preprocessor.pad_id):
            budget = max_new_tokens or decoding_budget(input_ids.shape[1], self.model.config.max_len)
            tokens = self.model.generate(input_ids.to(self.device), budget, num_beams=num_beams,
                                         length_penalty=length_penalty)
            for i, row in zip(rows, tokens.tolist()):
                translations[i] = self.preprocessor.decode(row)
        return translations

    @inference
    def cross_attention(self, source: str, target: str) -> tuple[list[str], list[str], torch.Tensor]:
        """The decoder's attention over the source while it reads `target` (teacher forcing):
        source tokens, target tokens (end token included), and weights (layers, heads, target, source)."""
        tokenizer = self.preprocessor.tokenizer
        source_ids, target_ids = self.preprocessor.encode([source, target])
        decoder_input = [self.preprocessor.bos_id, *target_ids[:-1]]
        out = self.model(torch.tensor([source_ids], device=self.device),
                         torch.tensor([decoder_input], device=self.device), return_weights=True)
        weights = torch.stack([w[0] for w in out.cross_attentions]).cpu()
        return ([tokenizer.id_to_token(i) for i in source_ids], [tokenizer.id_to_token(i) for i in target_ids],
                weights)
