"""ATIS for BERT (the JointBERT recipe): each word becomes its WordPiece pieces, the word's
slot tag sits on its first piece, the other pieces and [CLS]/[SEP] carry no slot loss; the
intent comes from [CLS].

    [CLS] show  flights  from  bo ##ston  [SEP]
          O     O        O     B-fromloc  (ignored)

Reads the prepared ATIS set of `prepare_atis`, so both models train on the same split.
"""

from __future__ import annotations

import lightning as L
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader

from transformer_lab.data.atis import IGNORE_INDEX, SPLITS, UNK_LABEL, AtisVocabulary, read_prepared_split
from transformer_lab.data.bert import pad_batch, special_ids
from transformer_lab.data.tokenizers import load_tokenizer


def encode_words(tokenizer: Tokenizer, words: list[str], specials: dict[str, int],
                 max_len: int = 512) -> tuple[list[int], list[int]]:
    """[CLS] pieces... [SEP] and the position of each word's first piece (words whose pieces
    would pass max_len are cut, as the whole utterance would not fit)."""
    ids, first = [specials["cls"]], []
    for word in words:
        pieces = tokenizer.encode(word, add_special_tokens=False).ids or [specials["unk"]]
        if len(ids) + len(pieces) > max_len - 1:
            break
        first.append(len(ids))
        ids += pieces
    return ids + [specials["sep"]], first


class AtisBertDataModule(L.LightningDataModule):
    def __init__(self, prepared_dir: str, tokenizer_path: str, max_len: int = 128, batch_size: int = 32,
                 eval_batch_size: int = 256, max_examples: int | None = None, num_workers: int = 0):
        super().__init__()
        self.prepared_dir, self.tokenizer_path, self.max_len = prepared_dir, tokenizer_path, max_len
        self.batch_size, self.eval_batch_size, self.max_examples, self.num_workers = (
            batch_size, eval_batch_size, max_examples, num_workers)
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.specials = special_ids(self.tokenizer)
        self.labels = AtisVocabulary.from_prepared(prepared_dir)  # intent and slot label lists
        self.examples: dict[str, list[dict]] = {}

    def model_kwargs(self) -> dict:
        return {"vocab_size": self.tokenizer.get_vocab_size(), "pad_id": self.specials["pad"],
                "n_intents": len(self.labels.intent_labels), "n_slots": len(self.labels.slot_labels)}

    def task_kwargs(self) -> dict:
        return {"intent_labels": self.labels.intent_labels, "slot_labels": self.labels.slot_labels,
                "tokenizer_path": str(self.tokenizer_path)}

    def encode(self, example: dict) -> dict:
        words = [w.lower() for w in example["words"]] if self.labels.lowercase else example["words"]
        ids, first = encode_words(self.tokenizer, words, self.specials, self.max_len)
        slot_id, unk = self.labels.slot_id, self.labels.slot_id[UNK_LABEL]
        slots = [IGNORE_INDEX] * (len(ids) - 1)  # positions 1.. (after [CLS]), as the task's slot logits
        for position, tag in zip(first, example["slots"]):
            slots[position - 1] = slot_id.get(tag, unk)
        intent = self.labels.intent_id.get(example["intent"], self.labels.intent_id[UNK_LABEL])
        return {"input_ids": ids, "segment_ids": [0] * len(ids), "slot_labels": slots, "intent_label": intent}

    def setup(self, stage: str | None = None) -> None:
        for split in SPLITS:
            if split not in self.examples:
                rows = read_prepared_split(self.prepared_dir, split)[: self.max_examples]
                self.examples[split] = [self.encode(row) for row in rows]

    def collate(self, items: list[dict]) -> dict[str, torch.Tensor]:
        batch = pad_batch(items, self.specials["pad"])
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
