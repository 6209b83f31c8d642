"""Sequence-labelling metrics that torchmetrics lacks, as torchmetrics Metrics so that
they reduce correctly across data-parallel processes."""

from __future__ import annotations

import torch
from torchmetrics import Metric


def _split_tag(tag: str) -> tuple[str, str]:
    if tag == "O":
        return "O", ""
    prefix, _, entity_type = tag.partition("-")
    return prefix, entity_type


def extract_chunks(tags: list[str]) -> set[tuple[str, int, int]]:
    """Entity chunks (type, start, end inclusive) by the conlleval rules that seqeval's default
    mode follows: an I- tag after O or after another type starts a new chunk."""
    chunks = set()
    start, prev_prefix, prev_type = None, "O", ""
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, entity_type = _split_tag(tag)
        ends = prev_prefix != "O" and (prefix in ("B", "O") or entity_type != prev_type)
        if ends:
            chunks.add((prev_type, start, i - 1))
        if prefix == "B" or (prefix == "I" and (prev_prefix == "O" or entity_type != prev_type)):
            start = i
        prev_prefix, prev_type = prefix, entity_type
    return chunks


class SlotF1(Metric):
    """Entity-level micro F1 over slot chunks (the conlleval / seqeval number ATIS papers report)."""

    higher_is_better = True
    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("correct", torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("predicted", torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("gold", torch.tensor(0), dist_reduce_fx="sum")

    def update(self, predicted: list[list[str]], gold: list[list[str]]) -> None:
        for pred_tags, gold_tags in zip(predicted, gold):
            pred_chunks, gold_chunks = extract_chunks(pred_tags), extract_chunks(gold_tags)
            self.correct += len(pred_chunks & gold_chunks)
            self.predicted += len(pred_chunks)
            self.gold += len(gold_chunks)

    def compute(self) -> torch.Tensor:
        precision = self.correct / self.predicted.clamp(min=1)
        recall = self.correct / self.gold.clamp(min=1)
        return torch.where(precision + recall > 0, 2 * precision * recall / (precision + recall), torch.tensor(0.0))
