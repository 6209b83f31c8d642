"""Extractive question answering with BERT (the fourth fine-tuning use in the BERT paper):
start and end logits over `[CLS] question [SEP] passage [SEP]`, loss = mean of the two
cross-entropies, the best span decoded inside the passage, scored by SQuAD's exact match and F1.
"""

from __future__ import annotations

import collections
import re
import string
from dataclasses import replace

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric

from transformer_lab.data.qa import QAPreprocessor
from transformer_lab.errors import TransformerLabError
from transformer_lab.models.bert import BertConfig, BertForQuestionAnswering
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.tasks.bert_pretraining import load_pretrained_bert
from transformer_lab.tasks.checkpoints import NamesItsFamily
from transformer_lab.tasks.embeddings import TokenEmbeddings
from transformer_lab.tasks.inference import inference
from transformer_lab.tasks.pretrained import FrozenBody
from transformer_lab.tasks.schedules import adamw_warmup_linear

# --------------------------------------------------------------------------- SQuAD v1.1 metrics
PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD v1.1's normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
    """Token overlap F1 of the normalised answers (as in the official v1.1 script, two answers
    that normalise to nothing score 0)."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((collections.Counter(predicted) & collections.Counter(expected)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(expected)
    return 2 * precision * recall / (precision + recall)


def best_over_golds(metric, prediction: str, golds: list[str]) -> float:
    """SQuAD's dev set has several gold answers per question; a prediction scores its best match."""
    return max((metric(prediction, gold) for gold in golds), default=0.0)


# --------------------------------------------------------------------------- decoding
def best_spans(start_logits: torch.Tensor, end_logits: torch.Tensor, allowed: torch.Tensor,
               max_answer_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The span (i, j) with the highest start_logits[i] + end_logits[j] such that i <= j,
    j - i < max_answer_tokens, and both positions are allowed (in the passage).

    All (batch, length) in; start, end and score (batch,) out. A row with no allowed position
    returns (0, 0) and a score of -inf.
    """
    length = start_logits.shape[1]
    scores = start_logits[:, :, None] + end_logits[:, None, :]  # (batch, start, end)
    steps = torch.arange(length, device=scores.device)
    width = steps[None, :] - steps[:, None]  # end - start
    ok = (width >= 0) & (width < max_answer_tokens)
    ok = ok[None] & allowed[:, :, None] & allowed[:, None, :]
    best, flat = scores.masked_fill(~ok, float("-inf")).flatten(1).max(dim=1)
    return flat // length, flat % length, best


def span_probabilities(start_logits: torch.Tensor, end_logits: torch.Tensor, allowed: torch.Tensor,
                       starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """P(start) x P(end) of each row's chosen span, each a softmax over the allowed positions and
    [CLS] (position 0, SQuAD 2.0's no-answer slot): the score of transformers' question-answering
    pipeline, so that an exported model scores answers alike."""
    candidates = allowed.clone()
    candidates[:, 0] = True
    rows = torch.arange(len(starts), device=starts.device)
    p_start = start_logits.masked_fill(~candidates, float("-inf")).softmax(-1)[rows, starts]
    p_end = end_logits.masked_fill(~candidates, float("-inf")).softmax(-1)[rows, ends]
    return torch.where(allowed.any(-1), p_start * p_end, 0.0)  # no passage tokens: no answer to score


def spans_to_answers(starts: torch.Tensor, ends: torch.Tensor, offsets: torch.Tensor,
                     contexts: list[str]) -> list[dict]:
    """Token spans -> {"answer", "start", "end"} with answer == context[start:end]: the text is
    sliced from the context, not detokenised, so case, accents and spacing survive."""
    answers = []
    for row, (i, j) in enumerate(zip(starts.tolist(), ends.tolist())):
        char_start, char_end = int(offsets[row, i, 0]), int(offsets[row, j, 1])
        if char_start < 0 or char_end < 0:  # no passage tokens to choose from
            char_start = char_end = 0
        answers.append({"answer": contexts[row][char_start:char_end], "start": char_start, "end": char_end})
    return answers


class QuestionAnsweringTask(FrozenBody, TokenEmbeddings, NamesItsFamily, L.LightningModule):
    """`pretrained`: a `pretrain_bert` checkpoint, published weights (minilm, a Hugging Face folder,
    hf:NAME), or None (random start); `freeze`: none | embeddings | encoder (tasks/pretrained.py). Loading a
    trained checkpoint with `load_from_checkpoint(path, pretrained=None)` skips that step."""

    def __init__(self, model_config: dict, preprocessor: dict, pretrained: str | None = None, lr: float = 1e-4,
                 weight_decay: float = 0.01, warmup_ratio: float = 0.1, max_answer_tokens: int = 30,
                 embeddings: dict | None = None, freeze: str = "none"):
        """preprocessor: the datamodule's QAPreprocessor state (tokenizer, max_len, max_question_tokens);
        it travels in the checkpoint, so that predict() encodes text the way training did."""
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.preprocessor = QAPreprocessor.from_state(preprocessor)
        self.model = BertForQuestionAnswering(BertConfig(**model_config))
        max_len = self.preprocessor.max_len
        if max_len > self.model.config.max_len:
            raise TransformerLabError(f"data.datamodule.max_len={max_len} exceeds "
                                      f"model.max_len={self.model.config.max_len}")
        load_pretrained_bert(self.model.bert, pretrained)
        self.freeze_body(self.model.bert, freeze)
        self.metrics = torch.nn.ModuleDict({f"{stage}_{name}": MeanMetric() for stage in ("val", "test")
                                            for name in ("exact_match", "f1")})

    def forward(self, batch: dict) -> ModelOutput:
        """The model's output with padding masked out of the span logits (logits, start_logits, end_logits)."""
        out = self.model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"])
        # Padding is never an answer; [CLS] stays allowed (examples whose answer was cut off point there).
        padding = ~batch["attention_mask"]
        logits = out.logits.masked_fill(padding[..., None], torch.finfo(out.logits.dtype).min)
        start, end = logits.unbind(-1)
        return replace(out, logits=logits, start_logits=start, end_logits=end)

    def _loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self(batch)
        start, end = out.start_logits, out.end_logits
        loss = (F.cross_entropy(start, batch["start_positions"]) + F.cross_entropy(end, batch["end_positions"])) / 2
        return loss, start, end

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, _, _ = self._loss(batch)
        size = len(batch["input_ids"])
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=size, sync_dist=True)
        return loss

    def _evaluate(self, batch: dict, stage: str) -> None:
        loss, start, end = self._loss(batch)
        size = len(batch["input_ids"])
        in_passage = batch["offsets"][..., 0] >= 0
        starts, ends, _ = best_spans(start, end, in_passage, self.hparams.max_answer_tokens)
        predictions = spans_to_answers(starts, ends, batch["offsets"], batch["context"])
        em = [best_over_golds(exact_match, p["answer"], golds) for p, golds in zip(predictions, batch["answers"])]
        f1 = [best_over_golds(f1_score, p["answer"], golds) for p, golds in zip(predictions, batch["answers"])]
        self.metrics[f"{stage}_exact_match"].update(torch.tensor(em, device=self.device))
        self.metrics[f"{stage}_f1"].update(torch.tensor(f1, device=self.device))
        self.log(f"{stage}/loss", loss, batch_size=size, sync_dist=True)
        self.log_dict({f"{stage}/exact_match": self.metrics[f"{stage}_exact_match"],
                       f"{stage}/f1": self.metrics[f"{stage}_f1"]}, on_epoch=True, prog_bar=True, batch_size=size)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def configure_optimizers(self):
        h = self.hparams
        return adamw_warmup_linear(self.model, h.lr, h.weight_decay, h.warmup_ratio,
                                   self.trainer.estimated_stepping_batches, trainer=self.trainer)

    @inference
    def predict(self, questions: list[str], contexts: list[str], batch_size: int = 64,
                doc_stride: int | None = None) -> list[dict]:
        """The best answer span for each raw (question, context): {"answer", "start", "end", "score",
        "windows"} with context[start:end] == answer (character offsets into the context), score its
        probability (span_probabilities) and windows how many windows of the context were read. A
        context longer than a window is read in overlapping windows, doc_stride tokens shared
        (None: the preprocessor's default_doc_stride), and the best-scoring span of any window wins,
        as transformers' question-answering pipeline does."""
        if len(questions) != len(contexts):
            raise TransformerLabError(f"{len(questions)} questions but {len(contexts)} contexts")
        stride = self.preprocessor.default_doc_stride if doc_stride is None else doc_stride
        features = self.preprocessor.encode([{"question": q, "context": c} for q, c in zip(questions, contexts)],
                                            doc_stride=stride)
        best: list[dict | None] = [None] * len(questions)
        windows = collections.Counter(feature["example"] for feature in features)
        for first in range(0, len(features), batch_size):
            chunk = features[first:first + batch_size]
            batch = self.preprocessor.collate(chunk)
            batch = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}
            out = self(batch)
            in_passage = batch["offsets"][..., 0] >= 0
            starts, ends, _ = best_spans(out.start_logits, out.end_logits, in_passage, self.hparams.max_answer_tokens)
            scores = span_probabilities(out.start_logits, out.end_logits, in_passage, starts, ends)
            answers = spans_to_answers(starts, ends, batch["offsets"], batch["context"])
            for feature, answer, score in zip(chunk, answers, scores.tolist()):
                index = feature["example"]
                if best[index] is None or score > best[index]["score"]:  # a tie: the earlier window
                    best[index] = {**answer, "score": score, "windows": windows[index]}
        return best
