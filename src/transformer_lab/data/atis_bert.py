"""ATIS for BERT (the JointBERT recipe): each word becomes its WordPiece pieces, the word's
slot tag sits on its first piece, the other pieces and [CLS]/[SEP] carry no slot loss; the
intent comes from [CLS].

    [CLS] show  flights  from  bo ##ston  [SEP]
          O     O        O     B-fromloc  (ignored)

Reads the prepared ATIS set of `prepare_atis`, so both models train on the same split.
"""

from __future__ import annotations

from dataclasses import dataclass

import lightning as L
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader

from transformer_lab.data.atis import IGNORE_INDEX, SPLITS, UNK_LABEL, AtisPreprocessor, read_prepared_split
from transformer_lab.data.bert import BertTokenizerPreprocessor, pad_batch
from transformer_lab.data.tokenizers import load_tokenizer


def word_pieces(tokenizer: Tokenizer, word: str, specials: dict[str, int]) -> list[int]:
    return tokenizer.encode(word, add_special_tokens=False).ids or [specials["unk"]]


def encode_words(tokenizer: Tokenizer, words: list[str], specials: dict[str, int],
                 max_len: int = 512) -> tuple[list[int], list[int]]:
    """[CLS] pieces... [SEP] and the position of each word's first piece (words whose pieces
    would pass max_len are cut, as the whole utterance would not fit; a first word longer than
    that alone keeps its first pieces)."""
    ids, first = [specials["cls"]], []
    for word in words:
        pieces = word_pieces(tokenizer, word, specials)
        if len(ids) + len(pieces) > max_len - 1:
            if first:
                break
            pieces = pieces[:max_len - 2]
        first.append(len(ids))
        ids += pieces
    return ids + [specials["sep"]], first


@dataclass(eq=False)
class AtisBertPreprocessor(BertTokenizerPreprocessor):
    """ATIS words as WordPiece pieces, and the intent and slot labels.

    State: tokenizer (its JSON), intent_labels, slot_labels, lowercase, max_len."""

    tokenizer: Tokenizer
    intent_labels: list[str]
    slot_labels: list[str]
    lowercase: bool = True
    max_len: int = 128

    def __post_init__(self):
        super().__post_init__()
        self.intent_id = {label: i for i, label in enumerate(self.intent_labels)}
        self.slot_id = {label: i for i, label in enumerate(self.slot_labels)}

    @classmethod
    def from_files(cls, prepared_dir: str, tokenizer_path: str, max_len: int = 128) -> AtisBertPreprocessor:
        labels = AtisPreprocessor.from_prepared(prepared_dir)  # the label lists and lowercasing of prepare_atis
        return cls(load_tokenizer(tokenizer_path), labels.intent_labels, labels.slot_labels, labels.lowercase, max_len)

    def encode_words(self, words: list[str]) -> tuple[list[int], list[int]]:
        words = [w.lower() for w in words] if self.lowercase else words
        return encode_words(self.tokenizer, words, self.specials, self.max_len)

    def piece_counts(self, words: list[str]) -> list[int]:
        """How many pieces each word becomes (encode_words's), what a window of words costs."""
        words = [w.lower() for w in words] if self.lowercase else words
        return [len(word_pieces(self.tokenizer, word, self.specials)) for word in words]

    def encode(self, example: dict) -> dict:
        ids, first = self.encode_words(example["words"])
        unk = self.slot_id[UNK_LABEL]
        slots = [IGNORE_INDEX] * (len(ids) - 1)  # positions 1.. (after [CLS]), as the task's slot logits
        for position, tag in zip(first, example["slots"]):
            slots[position - 1] = self.slot_id.get(tag, unk)
        intent = self.intent_id.get(example["intent"], self.intent_id[UNK_LABEL])
        return {"input_ids": ids, "segment_ids": [0] * len(ids), "slot_labels": slots, "intent_label": intent}

    def batch(self, utterances: list[list[str]]) -> tuple[dict, list[list[int]]]:
        """Model inputs of raw utterances, and each word's first-piece position (where its tag is read)."""
        encoded = [self.encode_words(words) for words in utterances]
        batch = pad_batch([{"input_ids": ids, "segment_ids": [0] * len(ids)} for ids, _ in encoded],
                          self.specials["pad"])
        return batch, [first for _, first in encoded]


class AtisBertDataModule(L.LightningDataModule):
    preprocessor: AtisBertPreprocessor

    def __init__(self, prepared_dir: str, tokenizer_path: str, max_len: int = 128, batch_size: int = 32,
                 eval_batch_size: int = 256, max_examples: int | None = None, num_workers: int = 0):
        super().__init__()
        self.prepared_dir = prepared_dir
        self.batch_size, self.eval_batch_size, self.max_examples, self.num_workers = (
            batch_size, eval_batch_size, max_examples, num_workers)
        self.preprocessor = AtisBertPreprocessor.from_files(prepared_dir, tokenizer_path, max_len)
        self.examples: dict[str, list[dict]] = {}

    def model_kwargs(self) -> dict:
        p = self.preprocessor
        return {"vocab_size": p.tokenizer.get_vocab_size(), "pad_id": p.specials["pad"],
                "n_intents": len(p.intent_labels), "n_slots": len(p.slot_labels)}

    def setup(self, stage: str | None = None) -> None:
        for split in SPLITS:
            if split not in self.examples:
                rows = read_prepared_split(self.prepared_dir, split)[: self.max_examples]
                self.examples[split] = [self.preprocessor.encode(row) for row in rows]

    def collate(self, items: list[dict]) -> dict[str, torch.Tensor]:
        batch = pad_batch(items, self.preprocessor.specials["pad"])
        length = batch["input_ids"].shape[1]
        batch["slot_labels"] = torch.tensor([item["slot_labels"] + [IGNORE_INDEX] * (length - 1 - len(item["slot_labels"]))
                                             for item in items])
        batch["intent_labels"] = torch.tensor([item["intent_label"] for item in items])
        return batch

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.examples["train"], self.batch_size, shuffle=True, collate_fn=self.collate,
                          num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.examples["dev"], self.eval_batch_size, collate_fn=self.collate,
                          num_workers=self.num_workers)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.examples["test"], self.eval_batch_size, collate_fn=self.collate,
                          num_workers=self.num_workers)
