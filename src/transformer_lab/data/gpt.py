"""GPT inputs: contiguous token blocks for language-model pre-training, and the GPT-1
fine-tuning formats (Radford et al., 2018, figure 1).

Pre-training streams the corpus that `train_tokenizers` encoded (`<tokenizer>/train.npy`,
BPE or char): a training example is a random contiguous block of block_size tokens and the
same block shifted by one as targets (offsets drawn with replacement, as nanoGPT does);
validation scores every non-overlapping block of the held-out documents.

Fine-tuning turns each example into one or more token sequences, each ending in the extract
token whose final hidden state the classifier reads:

    classification   <s> text <e>
    entailment       <s> premise $ hypothesis <e>
    similarity       <s> A $ B <e>  and  <s> B $ A <e>  (no natural order: both, summed)
    multiple_choice  <s> context $ answer_k <e>  for every answer k
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset, RandomSampler

from transformer_lab.data.bert import IGNORE_INDEX, truncate, truncate_pair
from transformer_lab.data.checks import require_file
from transformer_lab.data.corpus import read_documents
from transformer_lab.data.preprocessing import TokenizerPreprocessor
from transformer_lab.data.text_classification import load_examples, split_examples, training_labels
from transformer_lab.data.tokenizers import END_OF_TEXT, GPT_SPECIAL, load_tokenizer
from transformer_lab.errors import DataError
from transformer_lab.utils.io import decode_utf8


def load_token_stream(path: str | Path) -> torch.Tensor:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: encoded corpus not found; run `dvc repro train_tokenizers`")
    return torch.from_numpy(np.load(path).astype(np.int64))


class TokenBlocks(Dataset):
    """Item i: tokens[i : i + block_size] as input, tokens[i + 1 : i + block_size + 1] as target."""

    def __init__(self, tokens: torch.Tensor, block_size: int, starts: torch.Tensor | None = None):
        if len(tokens) <= block_size:
            raise DataError(f"{len(tokens)} tokens cannot fill one block of {block_size} (+1 target); "
                            "use a smaller data.datamodule.block_size or more text")
        self.tokens, self.block_size = tokens, block_size
        self.starts = starts  # None: every offset (random training blocks)

    def __len__(self) -> int:
        return len(self.tokens) - self.block_size if self.starts is None else len(self.starts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = index if self.starts is None else int(self.starts[index])
        chunk = self.tokens[start:start + self.block_size + 1]
        return {"input_ids": chunk[:-1], "labels": chunk[1:]}


@dataclass(eq=False)
class GPTPreprocessor(TokenizerPreprocessor):
    """Text <-> token ids with the BPE or char tokenizer a GPT was trained on. State: tokenizer (its JSON)."""

    tokenizer: Tokenizer

    def __post_init__(self):
        self.eos_id = self.tokenizer.token_to_id(END_OF_TEXT)

    def encode(self, text: str) -> list[int]:
        """The prompt's ids; an empty prompt starts a new document, as GPT-2 does: after an end-of-text token."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids if text else [self.eos_id]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


class LanguageModelDataModule(L.LightningDataModule):
    preprocessor: GPTPreprocessor

    def __init__(self, tokenizer_dir: str, block_size: int = 128, batch_size: int = 32, eval_batch_size: int = 64,
                 samples_per_epoch: int = 32_000, max_eval_blocks: int | None = None, seed: int = 0,
                 num_workers: int = 0, max_examples: int | None = None):
        """tokenizer_dir: a `train_tokenizers` output folder (tokenizer.json, train.npy, validation.npy).
        samples_per_epoch: random training blocks per epoch (an epoch over a token stream is a
        matter of definition; this fixes the steps per epoch). max_eval_blocks: cap on scored
        validation blocks (None = all). max_examples: caps both, training blocks per epoch and
        validation blocks (debug=smoke)."""
        super().__init__()
        self.tokenizer_dir = Path(tokenizer_dir)
        self.preprocessor = GPTPreprocessor(load_tokenizer(self.tokenizer_dir / "tokenizer.json"))
        self.block_size, self.batch_size, self.eval_batch_size = block_size, batch_size, eval_batch_size
        self.samples_per_epoch = min(samples_per_epoch, max_examples or samples_per_epoch)
        self.max_eval_blocks = min(x for x in (max_eval_blocks, max_examples, float("inf")) if x is not None)
        self.max_eval_blocks = None if self.max_eval_blocks == float("inf") else int(self.max_eval_blocks)
        self.seed, self.num_workers = seed, num_workers
        self.train_set: TokenBlocks | None = None
        self.val_set: TokenBlocks | None = None

    def model_kwargs(self) -> dict:
        return {"vocab_size": self.preprocessor.tokenizer.get_vocab_size(), "eos_id": self.preprocessor.eos_id}

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set = TokenBlocks(load_token_stream(self.tokenizer_dir / "train.npy"), self.block_size)
            validation = load_token_stream(self.tokenizer_dir / "validation.npy")
            starts = torch.arange(0, len(validation) - self.block_size, self.block_size)
            self.val_set = TokenBlocks(validation, self.block_size, starts[:self.max_eval_blocks])

    def train_dataloader(self) -> DataLoader:
        # seeded by the epoch too, so a resumed run draws the blocks an uninterrupted one would
        epoch = self.trainer.current_epoch if self.trainer else 0
        generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        sampler = RandomSampler(self.train_set, replacement=True, num_samples=self.samples_per_epoch,
                                generator=generator)
        return DataLoader(self.train_set, self.batch_size, sampler=sampler, num_workers=self.num_workers,
                          drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, self.eval_batch_size, num_workers=self.num_workers)


# ---------------------------------------------------------------------------------------
# GPT-1 fine-tuning

FORMATS = {"classification": "single", "entailment": "single", "similarity": "sum", "multiple_choice": "choices"}


def next_sentence_choices(documents: list[list[str]], n_choices: int, rng: random.Random) -> list[dict]:
    """A built-in multiple-choice set in the spirit of the Story Cloze test: which of n_choices
    sentences follows the context sentence? Wrong answers come from other documents."""
    sentences = [(d, s) for d, document in enumerate(documents) for s in document]
    examples = []
    for d, document in enumerate(documents):
        for context, answer in zip(document, document[1:]):
            others = [s for other, s in rng.sample(sentences, min(len(sentences), 4 * n_choices)) if other != d]
            if len(others) < n_choices - 1:
                continue
            choices = others[:n_choices - 1]
            label = rng.randrange(n_choices)
            choices.insert(label, answer)
            examples.append({"text_a": context, "choices": choices, "label": str(label)})
    return examples


def read_choices_jsonl(path: Path) -> list[dict]:
    """Multiple choice from a JSON-lines file: {"context": str, "choices": [str, ...], "label": int}."""
    require_file(path, "a JSON-lines file")
    examples = []
    for number, line in enumerate(decode_utf8(path, path.read_bytes()).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            context, choices, label = row["context"], row["choices"], int(row["label"])
        except (ValueError, KeyError, TypeError) as err:
            raise DataError(f"{path}:{number}: expected {{\"context\", \"choices\", \"label\"}} ({err})") from None
        if not 0 <= label < len(choices):
            raise DataError(f"{path}:{number}: label {label} is not an index into its {len(choices)} choices")
        examples.append({"text_a": context, "choices": list(choices), "label": str(label)})
    return examples


@dataclass(eq=False)
class GPTClassificationPreprocessor(TokenizerPreprocessor):
    """Examples in one of the GPT-1 formats -> token sequences ending in the extract token, and
    their right-padded batches. State: tokenizer (its JSON), labels, format, max_len."""

    tokenizer: Tokenizer
    labels: list[str]
    format: str = "classification"
    max_len: int = 128

    def __post_init__(self):
        if self.format not in FORMATS:
            raise DataError(f"data.datamodule.format={self.format!r} is not one of {', '.join(FORMATS)}")
        ids = {token: self.tokenizer.token_to_id(token) for token in (END_OF_TEXT, *GPT_SPECIAL)}
        missing = [token for token, i in ids.items() if i is None]
        if missing:
            raise DataError(f"tokenizer lacks GPT's special tokens {' '.join(missing)}; "
                            "use the bpe or char tokenizer of `train_tokenizers`")
        self.pad_id = ids[END_OF_TEXT]
        self.start_id, self.delimiter_id, self.extract_id = (ids[token] for token in GPT_SPECIAL)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def _sequence(self, a: list[int], b: list[int] | None) -> list[int]:
        """<s> a <e>, or <s> a $ b <e>, cut to max_len (pairs longest-first, like BERT)."""
        if b is None:
            return [self.start_id, *truncate(a, self.max_len - 2), self.extract_id]
        a, b = truncate_pair(a, b, self.max_len - 3)
        return [self.start_id, *a, self.delimiter_id, *b, self.extract_id]

    def encode(self, example: dict) -> list[list[int]]:
        """The example's token sequences in this format."""
        a = self._ids(example["text_a"])
        if self.format == "classification":
            return [self._sequence(a, None)]
        if self.format == "multiple_choice":
            return [self._sequence(a, self._ids(choice)) for choice in example["choices"]]
        if example.get("text_b") is None:
            raise DataError(f"format={self.format} needs sentence pairs; this source gives single sentences")
        b = self._ids(example["text_b"])
        if self.format == "entailment":
            return [self._sequence(a, b)]
        return [self._sequence(a, b), self._sequence(b, a)]

    def collate(self, items: list[dict]) -> dict:
        """input_ids (batch, n_sequences, length); last: the extract token's index; lm_labels: the
        next token at every position (IGNORE_INDEX after the extract token and on padding)."""
        n_sequences = max(len(item["sequences"]) for item in items)
        length = max(len(s) for item in items for s in item["sequences"])
        input_ids = torch.full((len(items), n_sequences, length), self.pad_id)
        lm_labels = torch.full((len(items), n_sequences, length), IGNORE_INDEX)
        last = torch.zeros(len(items), n_sequences, dtype=torch.long)
        for row, item in enumerate(items):
            if len(item["sequences"]) != n_sequences:
                raise DataError(f"examples with {len(item['sequences'])} and {n_sequences} choices in one batch")
            for column, sequence in enumerate(item["sequences"]):
                tokens = torch.tensor(sequence)
                input_ids[row, column, :len(sequence)] = tokens
                lm_labels[row, column, :len(sequence) - 1] = tokens[1:]
                last[row, column] = len(sequence) - 1
        return {"input_ids": input_ids, "last": last, "lm_labels": lm_labels,
                "labels": torch.tensor([item["label"] for item in items])}

    def batch(self, inputs: list) -> dict:
        """Model inputs of raw inputs: texts; (text_a, text_b) pairs (entailment, similarity); or
        (context, [choice, ...]) for multiple_choice."""
        examples = [{"text_a": x} if isinstance(x, str) else
                    {"text_a": x[0], "choices": list(x[1])} if self.format == "multiple_choice" else
                    {"text_a": x[0], "text_b": x[1]} for x in inputs]
        return self.collate([{"sequences": self.encode(e), "label": 0} for e in examples])


class GPTClassificationDataModule(L.LightningDataModule):
    """Examples {"text_a", "text_b" | "choices", "label"} in one of the GPT-1 formats, BPE or char
    tokens, right-padded (the attention is causal, so padding after a sequence never reaches it).

    Sources: sentiment | next_sentence | local | hub as for BERT fine-tuning
    (data.text_classification), and for multiple_choice: next_sentence_choices (built from the
    prepared corpus) | local (.jsonl).
    """

    preprocessor: GPTClassificationPreprocessor

    def __init__(self, source: str, tokenizer_path: str, format: str = "classification", max_len: int = 128,
                 batch_size: int = 16, eval_batch_size: int = 64, seed: int = 0, validation_fraction: float = 0.15,
                 test_fraction: float = 0.15, n_choices: int = 4, local_path: str | None = None,
                 columns: dict | None = None, hub_id: str | None = None, hub_config: str | None = None,
                 prepared_dir: str | None = None, num_workers: int = 0, max_examples: int | None = None):
        super().__init__()
        if format not in FORMATS:
            raise DataError(f"data.datamodule.format={format!r} is not one of {', '.join(FORMATS)}")
        tokenizer = load_tokenizer(tokenizer_path)
        try:
            GPTClassificationPreprocessor(tokenizer, ["?"], format, max_len)  # its checks, before the data is read
        except DataError as err:
            raise DataError(f"{tokenizer_path}: {err}") from None
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.max_examples = max_examples  # examples kept per split (None = all; debug=smoke)
        fractions = (validation_fraction, test_fraction)
        if format == "multiple_choice":
            if source == "next_sentence_choices":
                documents = read_documents(prepared_dir, "validation")
                examples = next_sentence_choices(documents, n_choices, random.Random(seed))
            elif source == "local":
                examples = read_choices_jsonl(Path(local_path or ""))
            else:
                raise DataError(f"data.source={source!r}: multiple_choice reads next_sentence_choices or local (.jsonl)")
            self.splits = split_examples(examples, fractions, seed)
            labels = [str(i) for i in range(max(len(e["choices"]) for e in examples))]  # answer positions
        else:
            self.splits = load_examples(source, seed=seed, fractions=fractions, local_path=local_path,
                                        columns=columns, hub_id=hub_id, hub_config=hub_config,
                                        prepared_dir=prepared_dir)
            labels = training_labels(self.splits, source)
        self.preprocessor = GPTClassificationPreprocessor(tokenizer, labels, format, max_len)
        self.features: dict[str, list[dict]] = {}

    def model_kwargs(self) -> dict:
        p = self.preprocessor
        return {"vocab_size": p.tokenizer.get_vocab_size(), "n_classes": len(p.labels),
                "combine": FORMATS[p.format], "eos_id": p.pad_id}

    def setup(self, stage: str | None = None) -> None:
        label_id = {label: i for i, label in enumerate(self.preprocessor.labels)}
        for split, examples in self.splits.items():
            if split not in self.features:
                self.features[split] = [{"sequences": self.preprocessor.encode(e), "label": label_id[e["label"]]}
                                        for e in examples[: self.max_examples] if e["label"] in label_id]

    def _loader(self, split: str, batch_size: int, shuffle: bool = False) -> DataLoader:
        return DataLoader(self.features[split], batch_size, shuffle=shuffle, collate_fn=self.preprocessor.collate,
                          num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation", self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.eval_batch_size)
