"""Sentence and sentence-pair classification for BERT fine-tuning: one schema
{"text_a", "text_b" (None for single sentences), "label"}, several sources, one DataModule.

Sources:
  sentiment      gensim's shipped movie-review sentences (`pang_lee_polarity.cor`, Pang & Lee;
                 `__label__neg|pos text` per line), offline default for single sentences
  next_sentence  pairs from the prepared corpus' held-out documents: is B the sentence after A?
                 (offline default for pairs)
  local          a CSV/TSV file with named text and label columns (split here), or a directory in
                 the GLUE layout: train.tsv, dev.tsv (validation) and, if present, test.tsv with labels
  hub            a Hugging Face data set (e.g. stanfordnlp/sst2, nyu-mll/glue rte) with a clear
                 offline error
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader

from transformer_lab.data.bert import (
    BertTokenizerPreprocessor,
    encode_pair,
    next_sentence_pairs,
    pad_batch,
    truncate,
    truncate_pair,
)
from transformer_lab.data.checks import require_file
from transformer_lab.data.corpus import read_documents
from transformer_lab.data.hub import load_hub_dataset
from transformer_lab.data.tokenizers import load_tokenizer
from transformer_lab.errors import DataError
from transformer_lab.utils.io import decode_utf8

SPLITS = ("train", "validation", "test")


def builtin_sentiment_path() -> Path:
    import logging

    logging.getLogger("gensim").setLevel(logging.WARNING)
    from gensim.test.utils import datapath

    return Path(datapath("pang_lee_polarity.cor"))


def read_fasttext_labels(path: Path, encoding: str = "utf-8") -> list[dict]:
    """`__label__X text` lines (the format of gensim's polarity sample)."""
    require_file(path, "a text file of '__label__X text' lines")
    raw = path.read_bytes()
    text = decode_utf8(path, raw) if encoding == "utf-8" else raw.decode(encoding)
    examples = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        label, _, text = line.partition(" ")
        if not label.startswith("__label__") or not text.strip():
            raise DataError(f"{path}:{number}: expected '__label__<name> <text>'")
        examples.append({"text_a": text.strip(), "text_b": None, "label": label.removeprefix("__label__")})
    return examples


def read_table(path: Path, text_a: str, text_b: str | None, label: str) -> list[dict]:
    """A CSV (or .tsv) file with a header naming the columns."""
    require_file(path, "a CSV or TSV file")
    tab = path.suffix in (".tsv", ".tab")
    # GLUE's TSV files quote nothing: a '"' inside a sentence is text (csv's quoting would swallow lines)
    text = decode_utf8(path, path.read_bytes()).removeprefix("\ufeff")  # MRPC's files start with a BOM
    rows = list(csv.DictReader(text.splitlines(), delimiter="\t" if tab else ",",
                               quoting=csv.QUOTE_NONE if tab else csv.QUOTE_MINIMAL))
    if not rows:
        raise DataError(f"{path}: no rows under the header")
    missing = [c for c in (text_a, text_b, label) if c and c not in rows[0]]
    if missing:
        raise DataError(f"{path}: column {missing[0]!r} not in the header ({', '.join(rows[0])})")
    examples = []
    for number, row in enumerate(rows, 2):  # line 1 is the header
        for column in (text_a, text_b, label):
            if column and not (row.get(column) or "").strip():
                raise DataError(f"{path}:{number}: empty {column!r}")
        examples.append({"text_a": row[text_a].strip(), "text_b": row[text_b].strip() if text_b else None,
                         "label": row[label].strip()})
    return examples


def split_examples(examples: list[dict], fractions: tuple[float, float], seed: int) -> dict[str, list[dict]]:
    """Stratified, seeded train/validation/test split (fractions = validation, test)."""
    by_label: dict[str, list[dict]] = {}
    for example in examples:
        by_label.setdefault(example["label"], []).append(example)
    rng = random.Random(seed)
    splits = {split: [] for split in SPLITS}
    for label in sorted(by_label):
        group = by_label[label][:]
        rng.shuffle(group)
        n_val, n_test = round(fractions[0] * len(group)), round(fractions[1] * len(group))
        splits["validation"] += group[:n_val]
        splits["test"] += group[n_val:n_val + n_test]
        splits["train"] += group[n_val + n_test:]
    for split in SPLITS:
        rng.shuffle(splits[split])
    return splits


def read_split_directory(directory: Path, columns: dict) -> dict[str, list[dict]]:
    """A GLUE-layout directory: train.tsv, dev.tsv (the validation split) and an optional labelled
    test.tsv; the splits are the files' (nothing is re-split)."""
    files = {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}
    splits = {}
    for split, name in files.items():
        path = directory / name
        if split == "test" and not path.is_file():
            splits[split] = []
            continue
        splits[split] = read_table(path, **columns)
    return splits


def stratified_subset(examples: list[dict], n: int | None, seed: int) -> list[dict]:
    """n examples with the label proportions of `examples` (largest remainders), drawn with `seed`:
    the training sets of a label-efficiency curve. None or n >= len keeps them all."""
    if n is None or n >= len(examples):
        return list(examples)
    by_label: dict[str, list[dict]] = {}
    for example in examples:
        by_label.setdefault(example["label"], []).append(example)
    shares = {label: n * len(group) / len(examples) for label, group in by_label.items()}
    counts = {label: int(share) for label, share in shares.items()}
    for label in sorted(shares, key=lambda k: (counts[k] - shares[k], k))[: n - sum(counts.values())]:
        counts[label] += 1
    rng = random.Random(seed)
    chosen = [e for label in sorted(by_label) for e in rng.sample(by_label[label], counts[label])]
    rng.shuffle(chosen)
    return chosen


def next_sentence_examples(prepared_dir: str, seed: int) -> list[dict]:
    """Sentence pairs from the corpus' held-out documents (the pre-training never saw them)."""
    documents = read_documents(prepared_dir, "validation")
    pairs = next_sentence_pairs(documents, np.random.default_rng(seed))
    return [{"text_a": a, "text_b": b, "label": "next" if is_next else "not_next"} for a, b, is_next in pairs]


def load_examples(source: str, *, seed: int, fractions: tuple[float, float], local_path: str | None = None,
                  columns: dict | None = None, hub_id: str | None = None, hub_config: str | None = None,
                  prepared_dir: str | None = None) -> dict[str, list[dict]]:
    columns = dict(columns or {"text_a": "text", "text_b": None, "label": "label"})
    if source == "sentiment":
        # The original Pang & Lee sentences are Windows-1252 (its em dashes are 0x97), not UTF-8.
        return split_examples(read_fasttext_labels(builtin_sentiment_path(), "cp1252"), fractions, seed)
    if source == "next_sentence":
        return split_examples(next_sentence_examples(prepared_dir, seed), fractions, seed)
    if source == "local":
        path = Path(local_path or "")
        if path.is_dir():
            return read_split_directory(path, columns)
        examples = read_fasttext_labels(path) if path.suffix == ".cor" else read_table(path, **columns)
        return split_examples(examples, fractions, seed)
    if source == "hub":
        data = load_hub_dataset(hub_id, hub_config, local_hint="data.local_path=FILE")
        rows = [r for split in data for r in data[split] if r[columns["label"]] is not None and r[columns["label"]] >= 0]
        examples = [{"text_a": r[columns["text_a"]], "text_b": r[columns["text_b"]] if columns["text_b"] else None,
                     "label": str(r[columns["label"]])} for r in rows]  # GLUE test splits have no labels (-1)
        return split_examples(examples, fractions, seed)
    raise DataError(f"data.source={source!r} is not one of sentiment, next_sentence, local, hub")


def training_labels(splits: dict[str, list[dict]], source: str) -> list[str]:
    """The sorted labels of the training split; fewer than two is an error."""
    labels = sorted({e["label"] for e in splits["train"]})
    if len(labels) < 2:
        raise DataError(f"data.source={source}: the training split has {len(labels)} label(s); need 2 or more")
    return labels


@dataclass(eq=False)
class TextClassificationPreprocessor(BertTokenizerPreprocessor):
    """`[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]` with segment ids; long single inputs cut by
    `truncation` (head | tail | head_tail), pairs by BERT's longest-first rule.

    State: tokenizer (its JSON), labels, max_len, truncation, head_tokens."""

    tokenizer: Tokenizer
    labels: list[str]
    max_len: int = 128
    truncation: str = "head"
    head_tokens: int = 128

    def encode(self, text_a: str, text_b: str | None = None) -> dict:
        a = self.tokenizer.encode(text_a, add_special_tokens=False).ids
        if text_b is None:
            a, b = truncate(a, self.max_len - 2, self.truncation, self.head_tokens), None
        else:
            a, b = truncate_pair(a, self.tokenizer.encode(text_b, add_special_tokens=False).ids, self.max_len - 3)
        ids, segments = encode_pair(a, b, self.specials)
        return {"input_ids": ids, "segment_ids": segments}

    def batch(self, texts: list[str | tuple[str, str]]) -> dict:
        """Model inputs (input_ids, segment_ids, attention_mask) of raw texts or (text_a, text_b) pairs."""
        return pad_batch([self.encode(text) if isinstance(text, str) else self.encode(*text) for text in texts],
                         self.specials["pad"])


class TextClassificationDataModule(L.LightningDataModule):
    """Labelled texts or text pairs, encoded by TextClassificationPreprocessor."""

    preprocessor: TextClassificationPreprocessor

    def __init__(self, source: str, tokenizer_path: str, max_len: int = 128, truncation: str = "head",
                 head_tokens: int = 128, batch_size: int = 32, eval_batch_size: int = 128, seed: int = 0,
                 validation_fraction: float = 0.15, test_fraction: float = 0.15, local_path: str | None = None,
                 columns: dict | None = None, hub_id: str | None = None, hub_config: str | None = None,
                 prepared_dir: str | None = None, num_workers: int = 0, max_examples: int | None = None,
                 train_examples: int | None = None):
        super().__init__()
        tokenizer = load_tokenizer(tokenizer_path)  # before the data: a missing file fails fast
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.max_examples = max_examples  # examples kept per split (None = all; debug=smoke)
        self.splits = load_examples(source, seed=seed, fractions=(validation_fraction, test_fraction),
                                    local_path=local_path, columns=columns, hub_id=hub_id, hub_config=hub_config,
                                    prepared_dir=prepared_dir)
        # train_examples: a stratified, seeded subset of the training split (label-efficiency curves)
        self.splits["train"] = stratified_subset(self.splits["train"], train_examples, seed)
        self.preprocessor = TextClassificationPreprocessor(tokenizer,
                                                           training_labels(self.splits, source), max_len,
                                                           truncation, head_tokens)
        self.features: dict[str, list[dict]] = {}

    def model_kwargs(self) -> dict:
        p = self.preprocessor
        return {"vocab_size": p.tokenizer.get_vocab_size(), "pad_id": p.specials["pad"], "n_classes": len(p.labels)}

    def setup(self, stage: str | None = None) -> None:
        label_id = {label: i for i, label in enumerate(self.preprocessor.labels)}
        for split in SPLITS:
            if split not in self.features:
                # A label unseen in training cannot be predicted; such examples are left out of scoring.
                self.features[split] = [{**self.preprocessor.encode(e["text_a"], e["text_b"]), "label": label_id[e["label"]]}
                                        for e in self.splits[split][: self.max_examples] if e["label"] in label_id]

    def collate(self, items: list[dict]) -> dict:
        batch = pad_batch(items, self.preprocessor.specials["pad"])
        batch["labels"] = torch.tensor([item["label"] for item in items])
        return batch

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.features["train"], self.batch_size, shuffle=True, collate_fn=self.collate,
                          num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.features["validation"], self.eval_batch_size, collate_fn=self.collate,
                          num_workers=self.num_workers)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.features["test"], self.eval_batch_size, collate_fn=self.collate,
                          num_workers=self.num_workers)
