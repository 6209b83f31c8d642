"""CoNLL-2003 named entities for BERT token classification: any directory with `eng.train`,
`eng.testa` (validation) and, if present, `eng.testb` (test), in the shared task's layout (word,
POS, chunk, NER tag per line; a blank line between sentences; `-DOCSTART-` lines between documents).

The files tag in IOB1 (`I-PER` throughout; `B-` only where two entities of one type touch); the
sentences here are in BIO (IOB2: every entity starts with `B-`), the scheme seqeval and this
project's entity F1 score. Words become WordPiece pieces; a word's tag is read at its first piece.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader

from transformer_lab.data.atis import IGNORE_INDEX
from transformer_lab.data.atis_bert import encode_words
from transformer_lab.data.bert import BertTokenizerPreprocessor, pad_batch
from transformer_lab.data.checks import require_file
from transformer_lab.data.tokenizers import load_tokenizer
from transformer_lab.errors import DataError
from transformer_lab.utils.io import decode_utf8

FILES = {"train": "eng.train", "validation": "eng.testa", "test": "eng.testb"}
SPLITS = tuple(FILES)


def iob1_to_bio(tags: list[str]) -> list[str]:
    """IOB1 -> BIO: an I- tag that starts an entity (after O, or after a tag of another type) becomes B-."""
    bio, previous = [], "O"
    for tag in tags:
        if tag.startswith("I-") and (previous == "O" or previous[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        bio.append(tag)
        previous = tag
    return bio


def read_conll(path: str | Path) -> list[dict]:
    """Sentences of a CoNLL-2003 file: [{"words", "tags" (BIO)}]. A malformed line is a DataError
    naming the file and line."""
    path = Path(path)
    require_file(path, "a CoNLL-2003 file",
                 f"file not found (a CoNLL-2003 directory has {', '.join(FILES.values())})")
    sentences, words, tags = [], [], []
    lines = decode_utf8(path, path.read_bytes()).splitlines()
    for number, line in enumerate([*lines, ""], 1):
        if not line.strip() or line.startswith("-DOCSTART-"):
            if words:
                sentences.append({"words": words, "tags": iob1_to_bio(tags)})
                words, tags = [], []
            continue
        columns = line.split()
        tag = columns[-1]
        if len(columns) < 2 or not (tag == "O" or tag[:2] in ("I-", "B-")):
            raise DataError(f"{path}:{number}: expected 'word ... NER-tag' with an O, I-X or B-X tag, got {line!r}")
        words.append(columns[0])
        tags.append(tag)
    if not sentences:
        raise DataError(f"{path}: no sentences")
    return sentences


def read_conll_dir(directory: str | Path) -> dict[str, list[dict]]:
    """train and validation (required), test if its file is there (else empty)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: CoNLL-2003 directory not found (data.data_dir=DIR with {', '.join(FILES.values())})")
    return {split: read_conll(directory / name) if split != "test" or (directory / name).is_file() else []
            for split, name in FILES.items()}


@dataclass(eq=False)
class TaggingPreprocessor(BertTokenizerPreprocessor):
    """Words as WordPiece pieces ([CLS] pieces [SEP]) and their tags at each word's first piece.

    State: tokenizer (its JSON), labels (the BIO tags), max_len."""

    tokenizer: Tokenizer
    labels: list[str]
    max_len: int = 128

    def __post_init__(self):
        super().__post_init__()
        self.label_id = {label: i for i, label in enumerate(self.labels)}

    def encode(self, words: list[str], tags: list[str] | None = None) -> dict:
        """input_ids, segment_ids and, with tags, tag ids at first pieces (IGNORE_INDEX elsewhere;
        a tag training never saw is O)."""
        ids, first = encode_words(self.tokenizer, words, self.specials, self.max_len)
        encoded = {"input_ids": ids, "segment_ids": [0] * len(ids)}
        if tags is not None:
            labels = [IGNORE_INDEX] * len(ids)
            for position, tag in zip(first, tags):
                labels[position] = self.label_id.get(tag, self.label_id["O"])
            encoded["labels"] = labels
        return encoded

    def batch(self, sentences: list[list[str]]) -> tuple[dict, list[list[int]]]:
        """Model inputs of raw sentences (lists of words), and each word's first-piece position."""
        encoded = [encode_words(self.tokenizer, words, self.specials, self.max_len) for words in sentences]
        batch = pad_batch([{"input_ids": ids, "segment_ids": [0] * len(ids)} for ids, _ in encoded],
                          self.specials["pad"])
        return batch, [first for _, first in encoded]


class ConllDataModule(L.LightningDataModule):
    """CoNLL-2003 sentences (read_conll_dir), encoded by TaggingPreprocessor."""

    preprocessor: TaggingPreprocessor

    def __init__(self, data_dir: str, tokenizer_path: str, max_len: int = 128, batch_size: int = 32,
                 eval_batch_size: int = 128, max_examples: int | None = None, num_workers: int = 0):
        super().__init__()
        tokenizer = load_tokenizer(tokenizer_path)  # before the data: a missing file fails fast
        self.splits = read_conll_dir(data_dir)
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.max_examples = max_examples  # sentences kept per split (None = all; debug=smoke)
        labels = sorted({tag for sentence in self.splits["train"] for tag in sentence["tags"]} | {"O"})
        self.preprocessor = TaggingPreprocessor(tokenizer, labels, max_len)
        self.features: dict[str, list[dict]] = {}

    def model_kwargs(self) -> dict:
        p = self.preprocessor
        return {"vocab_size": p.tokenizer.get_vocab_size(), "pad_id": p.specials["pad"], "n_labels": len(p.labels)}

    def setup(self, stage: str | None = None) -> None:
        for split in SPLITS:
            if split not in self.features:
                self.features[split] = [self.preprocessor.encode(s["words"], s["tags"])
                                        for s in self.splits[split][: self.max_examples]]

    def collate(self, items: list[dict]) -> dict:
        batch = pad_batch(items, self.preprocessor.specials["pad"])
        length = batch["input_ids"].shape[1]
        batch["labels"] = torch.tensor([item["labels"] + [IGNORE_INDEX] * (length - len(item["labels"]))
                                        for item in items])
        return batch

    def _loader(self, split: str, batch_size: int, shuffle: bool = False) -> DataLoader:
        return DataLoader(self.features[split], batch_size, shuffle=shuffle, collate_fn=self.collate,
                          num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation", self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.eval_batch_size)
