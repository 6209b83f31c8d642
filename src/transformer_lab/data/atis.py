"""ATIS joint intent detection + slot filling: four sources, one schema, one DataModule.

Sources (`data.source`): builtin (a generated ATIS-style sample), local (the seq.in / seq.out /
label layout), hub (the hub CSV), synthetic_order (data/synthetic_order.py: number words tagged
by their order, for position ablations; its settings in `data.synthetic_order`).

Schema of an example: {"words": [str], "slots": [BIO tag per word], "intent": str}.
Multi-intent labels such as `atis_flight#atis_airfare` are kept as classes of their own, as in
most published ATIS results.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

from transformer_lab.data.elmo import BOS, word_characters
from transformer_lab.data.hub import load_hub_dataset
from transformer_lab.data.preprocessing import Preprocessor
from transformer_lab.errors import DataError
from transformer_lab.utils.io import atomic_directory, decode_utf8

SPLITS = ("train", "dev", "test")
PAD, UNK, CLS = "[PAD]", "[UNK]", "[CLS]"
UNK_LABEL = "UNK"
IGNORE_INDEX = -100  # slot positions that are padding or [CLS]


# --------------------------------------------------------------------------- sources
def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise DataError(f"{path}: missing file (a split needs seq.in, seq.out and label)")
    lines = decode_utf8(path, path.read_bytes()).splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise DataError(f"{path}: file is empty")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            raise DataError(f"{path}:{number}: empty line")
    return lines


def _check_tags(words: list[str], tags: list[str], where: str) -> None:
    if len(words) != len(tags):
        raise DataError(f"{where}: {len(tags)} slot tags for {len(words)} words")
    for tag in tags:
        if tag != "O" and not tag.startswith(("B-", "I-")) and tag not in (UNK_LABEL, PAD):
            raise DataError(f"{where}: slot tag {tag!r} is not O, B-<type> or I-<type>")


def read_seq_in_split(split_dir: str | Path) -> list[dict]:
    """One split in the seq.in / seq.out / label layout."""
    split_dir = Path(split_dir)
    if not split_dir.is_dir():
        raise DataError(f"{split_dir}: missing split directory")
    utterances = _read_lines(split_dir / "seq.in")
    tag_lines = _read_lines(split_dir / "seq.out")
    intents = _read_lines(split_dir / "label")
    for path, lines in ((split_dir / "seq.out", tag_lines), (split_dir / "label", intents)):
        if len(lines) != len(utterances):
            raise DataError(f"{path}: {len(lines)} lines but {split_dir / 'seq.in'} has {len(utterances)}")
    examples = []
    for number, (utterance, tag_line, intent) in enumerate(zip(utterances, tag_lines, intents), 1):
        words, tags = utterance.split(), tag_line.split()
        _check_tags(words, tags, f"{split_dir / 'seq.out'}:{number}")
        examples.append({"words": words, "slots": tags, "intent": intent.strip()})
    return examples


def read_seq_in_dir(root: str | Path) -> dict[str, list[dict]]:
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: data directory not found (expected {'/, '.join(SPLITS)}/ with seq.in, seq.out, label)")
    return {split: read_seq_in_split(root / split) for split in SPLITS}


def examples_from_hub_rows(rows, where: str) -> list[dict]:
    """Rows of the hub CSV (columns id, intent, text, slots) in this project's schema."""
    examples = []
    for index, row in enumerate(rows):
        for field in ("intent", "text", "slots"):
            if row.get(field) is None:
                raise DataError(f"{where} row {index}: field {field!r} is missing")
        words, tags = row["text"].split(), row["slots"].split()
        _check_tags(words, tags, f"{where} row {index}")
        examples.append({"words": words, "slots": tags, "intent": row["intent"].strip()})
    return examples


def load_hub_atis(hub_id: str = "tuetschek/atis", dev_size: int = 500, seed: int = 0) -> dict[str, list[dict]]:
    dataset = load_hub_dataset(hub_id, local_hint="data.local_dir=DIR")
    splits = {name: examples_from_hub_rows(dataset[name], f"{hub_id}[{name}]") for name in dataset}
    if "test" not in splits or "train" not in splits:
        raise DataError(f"{hub_id}: expected train and test splits, found {sorted(splits)}")
    dev_name = next((name for name in ("dev", "validation") if name in splits), None)
    if dev_name is None:  # the hub copy has no dev split: hold out a fixed slice of train
        train = splits["train"][:]
        random.Random(seed).shuffle(train)
        splits["train"], splits["dev"] = train[dev_size:], train[:dev_size]
    else:
        splits["dev"] = splits.pop(dev_name)
    return {split: splits[split] for split in SPLITS}


def load_atis(source: str, local_dir: str | None = None, hub_id: str = "tuetschek/atis", builtin: dict | None = None,
              synthetic_order: dict | None = None):
    """{train, dev, test} examples of a source; builtin and synthetic_order: the generator's settings."""
    if source == "local":
        if not local_dir:
            raise DataError("data.local_dir must be set when data.source=local")
        return read_seq_in_dir(local_dir)
    if source == "hub":
        return load_hub_atis(hub_id)
    if source == "builtin":
        from transformer_lab.data.atis_builtin import generate_atis_sample

        return generate_atis_sample(**(builtin or {}))
    if source == "synthetic_order":
        from transformer_lab.data.synthetic_order import generate_order_sample

        return generate_order_sample(**(synthetic_order or {}))
    raise DataError(f"data.source={source!r} is not one of builtin, local, hub, synthetic_order")


# --------------------------------------------------------------------------- preparation
def build_vocabularies(train: list[dict], min_word_count: int = 1) -> dict[str, list[str]]:
    """Word vocabulary and label lists from the training split only."""
    counts: dict[str, int] = {}
    for example in train:
        for word in example["words"]:
            counts[word] = counts.get(word, 0) + 1
    words = sorted(w for w, c in counts.items() if c >= min_word_count)
    intents = sorted({e["intent"] for e in train} - {UNK_LABEL})
    slots = sorted({t for e in train for t in e["slots"]} - {"O", UNK_LABEL, PAD})
    return {
        "vocab": [PAD, UNK, CLS] + words,
        "intent_labels": [UNK_LABEL] + intents,
        "slot_labels": [UNK_LABEL, "O"] + slots,
    }


def prepare_atis(splits: dict[str, list[dict]], output_dir: str | Path, lowercase: bool = True, min_word_count: int = 1) -> dict:
    """Writes {train,dev,test}.parquet, vocab.json, intent_labels.json, slot_labels.json, summary.json."""
    import datasets

    if lowercase:
        splits = {s: [{**e, "words": [w.lower() for w in e["words"]]} for e in exs] for s, exs in splits.items()}
    vocabularies = build_vocabularies(splits["train"], min_word_count)
    known_words, known_intents = set(vocabularies["vocab"]), set(vocabularies["intent_labels"])
    known_slots = set(vocabularies["slot_labels"])
    summary: dict = {"lowercase": lowercase, "vocab_size": len(vocabularies["vocab"]),
                     "n_intents": len(vocabularies["intent_labels"]), "n_slots": len(vocabularies["slot_labels"])}
    for split, examples in splits.items():
        words = [w for e in examples for w in e["words"]]
        summary[split] = {
            "utterances": len(examples),
            "words": len(words),
            "oov_rate": sum(w not in known_words for w in words) / max(len(words), 1),
            "unseen_intents": sum(e["intent"] not in known_intents for e in examples),
            "unseen_slot_tags": sum(t not in known_slots for e in examples for t in e["slots"]),
        }
    datasets.disable_progress_bars()  # a few small files; the bars are noise
    with atomic_directory(output_dir) as tmp:
        for split, examples in splits.items():
            datasets.Dataset.from_list(examples).to_parquet(str(tmp / f"{split}.parquet"))
        for name, values in vocabularies.items():
            (tmp / f"{name}.json").write_text(json.dumps(values, indent=0) + "\n")
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def prepare(source: str, output_dir: str, local_dir: str | None = None, hub_id: str = "tuetschek/atis",
            builtin: dict | None = None, lowercase: bool = True, min_word_count: int = 1,
            synthetic_order: dict | None = None) -> dict:
    """The `prepare_atis` stage: load a source, write the prepared set; returns its summary."""
    splits = load_atis(source, local_dir=local_dir, hub_id=hub_id, builtin=builtin, synthetic_order=synthetic_order)
    return prepare_atis(splits, output_dir, lowercase=lowercase, min_word_count=min_word_count)


def read_prepared_split(prepared_dir: str | Path, split: str) -> list[dict]:
    import pyarrow.parquet as pq

    path = Path(prepared_dir) / f"{split}.parquet"
    if not path.is_file():
        raise DataError(f"{path}: prepared split not found; run `dvc repro prepare_atis` or `python pipelines/prepare.py`")
    return pq.read_table(path).to_pylist()


# --------------------------------------------------------------------------- encoding
@dataclass(eq=False)
class AtisPreprocessor(Preprocessor):
    """Maps words and labels to ids and back; anything unseen in train becomes UNK.

    Each token is also spelt out (`characters`, for model.char_features): [CLS] as the begin-of-
    sentence marker, every word by its characters, a word the vocabulary lacks included.

    State: vocab (id -> word, [PAD] [UNK] [CLS] first), intent_labels, slot_labels, lowercase,
    max_word_chars."""

    vocab: list[str]
    intent_labels: list[str]
    slot_labels: list[str]
    lowercase: bool = True
    max_word_chars: int = 20

    def __post_init__(self):
        self.word_id = {w: i for i, w in enumerate(self.vocab)}
        self.intent_id = {label: i for i, label in enumerate(self.intent_labels)}
        self.slot_id = {label: i for i, label in enumerate(self.slot_labels)}
        self.pad_id, self.unk_id, self.cls_id = self.word_id[PAD], self.word_id[UNK], self.word_id[CLS]

    @classmethod
    def from_prepared(cls, prepared_dir: str | Path) -> AtisPreprocessor:
        prepared_dir = Path(prepared_dir)
        try:
            lists = {name: json.loads((prepared_dir / f"{name}.json").read_text())
                     for name in ("vocab", "intent_labels", "slot_labels")}
            lowercase = json.loads((prepared_dir / "summary.json").read_text())["lowercase"]
        except FileNotFoundError as err:
            raise DataError(f"{err.filename}: not found; run `dvc repro prepare_atis` or `python pipelines/prepare.py`") from None
        return cls(**lists, lowercase=lowercase)

    @property
    def tokens(self) -> list[str]:
        """Token strings by embedding row."""
        return self.vocab

    def encode_words(self, words: list[str]) -> list[int]:
        words = [w.lower() for w in words] if self.lowercase else words
        return [self.cls_id] + [self.word_id.get(w, self.unk_id) for w in words]

    def encode_characters(self, words: list[str]) -> list[list[int]]:
        words = [w.lower() for w in words] if self.lowercase else words
        return [word_characters(w, self.max_word_chars) for w in [BOS, *words]]

    def encode(self, example: dict) -> dict:
        unk_slot = self.slot_id[UNK_LABEL]
        return {
            "input_ids": self.encode_words(example["words"]),
            "characters": self.encode_characters(example["words"]),
            "slot_labels": [self.slot_id.get(t, unk_slot) for t in example["slots"]],
            "intent_label": self.intent_id.get(example["intent"], self.intent_id[UNK_LABEL]),
        }

    def batch(self, utterances: list[list[str]]) -> dict[str, torch.Tensor]:
        """Model inputs (input_ids, attention_mask) of raw utterances (lists of words)."""
        items = [{"input_ids": self.encode_words(words), "characters": self.encode_characters(words),
                  "slot_labels": [0] * len(words), "intent_label": 0}
                 for words in utterances]  # placeholder labels: collate pads them, the model never reads them
        return collate(items, self.pad_id)

    def decode_slots(self, slot_ids: list[int], n_words: int) -> list[str]:
        """The tags of the first n_words predicted slot ids; an UNK slot reads as O."""
        tags = [self.slot_labels[i] for i in slot_ids[:n_words]]
        return ["O" if t == UNK_LABEL else t for t in tags]


def collate(batch: list[dict], pad_id: int = 0) -> dict[str, torch.Tensor]:
    length = max(len(item["input_ids"]) for item in batch)
    input_ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
    slot_labels = torch.full((len(batch), length - 1), IGNORE_INDEX, dtype=torch.long)
    for row, item in enumerate(batch):
        n = len(item["input_ids"])
        input_ids[row, :n] = torch.tensor(item["input_ids"])
        slot_labels[row, : n - 1] = torch.tensor(item["slot_labels"])
    out = {
        "input_ids": input_ids,
        "attention_mask": input_ids != pad_id,
        "slot_labels": slot_labels,
        "intent_labels": torch.tensor([item["intent_label"] for item in batch]),
    }
    if "characters" in batch[0]:  # padding positions spell nothing (all CHAR_PAD = 0)
        width = len(batch[0]["characters"][0])
        out["characters"] = torch.zeros((len(batch), length, width), dtype=torch.long)
        for row, item in enumerate(batch):
            out["characters"][row, : len(item["characters"])] = torch.tensor(item["characters"])
    return out


class AtisDataModule(L.LightningDataModule):
    preprocessor: AtisPreprocessor

    def __init__(
        self,
        prepared_dir: str,
        batch_size: int = 64,
        eval_batch_size: int = 256,
        num_workers: int = 0,
        word_dropout: float = 0.0,
        train_splits: tuple[str, ...] = ("train",),
        max_examples: int | None = None,
    ):
        """word_dropout: probability of replacing a training word by [UNK], so the model
        learns what to do with words it has never seen. max_examples caps every split
        (debug runs)."""
        super().__init__()
        self.prepared_dir = prepared_dir
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.word_dropout, self.train_splits, self.max_examples = word_dropout, tuple(train_splits), max_examples
        self.preprocessor = AtisPreprocessor.from_prepared(prepared_dir)
        self.examples: dict[str, list[dict]] = {}

    def model_kwargs(self) -> dict:
        """The model config fields that only the data knows."""
        p = self.preprocessor
        return {"vocab_size": len(p.vocab), "n_intents": len(p.intent_labels), "n_slots": len(p.slot_labels),
                "pad_id": p.pad_id}

    def setup(self, stage: str | None = None) -> None:
        for split in SPLITS:
            if split not in self.examples:
                rows = read_prepared_split(self.prepared_dir, split)[: self.max_examples]
                self.examples[split] = [self.preprocessor.encode(row) for row in rows]

    def _train_collate(self, batch: list[dict]) -> dict[str, torch.Tensor]:
        out = collate(batch, self.preprocessor.pad_id)
        if self.word_dropout > 0:
            drop = (torch.rand(out["input_ids"].shape) < self.word_dropout) & out["attention_mask"]
            drop[:, 0] = False  # keep [CLS]
            out["input_ids"] = out["input_ids"].masked_fill(drop, self.preprocessor.unk_id)
        return out

    def train_dataloader(self) -> DataLoader:
        train = [e for split in self.train_splits for e in self.examples[split]]
        return DataLoader(train, self.batch_size, shuffle=True, collate_fn=self._train_collate,
                          num_workers=self.num_workers)

    def _eval_loader(self, split: str) -> DataLoader:
        return DataLoader(self.examples[split], self.eval_batch_size, collate_fn=functools.partial(collate, pad_id=self.preprocessor.pad_id),
                          num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("dev")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")
