"""ELMo inputs: sentences of the prepared corpus as words, each word as its characters (what the
model reads) and as an id of the output vocabulary (what its softmax predicts).

A sentence is `<S> w_1 ... w_n </S>`: the forward LM predicts w_1 ... w_n, </S> and the backward
LM </S>'s mirror image, <S>, so every word and one end marker per sentence are scored in each
direction (per-word perplexity counts </S> as a word, as WikiText's <eos> is). Words are cut from
the text as runs of letters/digits or single punctuation marks, case kept (the characters see it).
The output vocabulary is the training words seen min_count times, most frequent first; the
others are predicted as <UNK>, but their characters are still read in full.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import lightning as L
import torch
from torch.utils.data import DataLoader, Sampler

from transformer_lab.data.corpus import read_documents
from transformer_lab.data.preprocessing import Preprocessor
from transformer_lab.errors import DataError

BOS, EOS, UNK = "<S>", "</S>", "<UNK>"
_WORD = re.compile(r"\w+|[^\w\s]")


# Character ids: 0 padding, then the markers, then byte b at b + N_MARKERS: what models/elmo.py's
# character encoder reads (data/ does not import models/; tests/test_elmo.py checks that the two agree).
CHAR_PAD, BEGIN_OF_WORD, END_OF_WORD, BEGIN_OF_SENTENCE, END_OF_SENTENCE = range(5)
N_MARKERS = 5
N_CHARS = 256 + N_MARKERS
IGNORE_INDEX = -100


def spelling(inner: list[int], max_word_chars: int) -> list[int]:
    """Character ids of one token as the character encoder reads it: begin-of-word, `inner`
    (cut to fit), end-of-word, padding. A sentence marker's inner is [BEGIN_OF_SENTENCE] or
    [END_OF_SENTENCE]; a word's, its UTF-8 bytes shifted past the markers."""
    ids = [BEGIN_OF_WORD, *inner[: max_word_chars - 2], END_OF_WORD]
    return ids + [CHAR_PAD] * (max_word_chars - len(ids))


def words_of(sentence: str) -> list[str]:
    return _WORD.findall(sentence)


def word_characters(word: str, max_word_chars: int) -> list[int]:
    """A word as the character encoder reads it (models/elmo.spelling); <S> and </S> as their own markers."""
    if word in (BOS, EOS):
        return spelling([BEGIN_OF_SENTENCE if word == BOS else END_OF_SENTENCE], max_word_chars)
    return spelling([b + N_MARKERS for b in word.encode("utf-8")], max_word_chars)


@dataclass(eq=False)
class ElmoPreprocessor(Preprocessor):
    """Sentences -> character ids, output-word ids and lengths. State: words (the output
    vocabulary, specials first), max_word_chars, max_len (words per sentence, markers included)."""

    words: list[str]
    max_word_chars: int = 20
    max_len: int = 64

    def __post_init__(self):
        self.index = {w: i for i, w in enumerate(self.words)}
        self.unk_id = self.index[UNK]

    def characters(self, word: str) -> list[int]:
        return word_characters(word, self.max_word_chars)

    def sequence(self, words: list[str]) -> list[str]:
        """<S> words </S>, cut to max_len (the end marker kept)."""
        return [BOS, *words[: self.max_len - 2], EOS]

    def batch(self, sentences: list[list[str]]) -> dict[str, torch.Tensor]:
        """characters (batch, time, max_word_chars), lengths (batch,), word_ids (batch, time):
        right-padded; word_ids IGNORE_INDEX on padding."""
        sequences = [self.sequence(s) for s in sentences]
        time = max(len(s) for s in sequences)
        characters = torch.full((len(sequences), time, self.max_word_chars), CHAR_PAD)
        word_ids = torch.full((len(sequences), time), IGNORE_INDEX)
        for row, sequence in enumerate(sequences):
            characters[row, : len(sequence)] = torch.tensor([self.characters(w) for w in sequence])
            word_ids[row, : len(sequence)] = torch.tensor([self.index.get(w, self.unk_id) for w in sequence])
        return {"characters": characters, "lengths": torch.tensor([len(s) for s in sequences]), "word_ids": word_ids}


def build_vocabulary(sentences: list[list[str]], min_count: int, max_words: int | None) -> list[str]:
    """Specials, then the words seen min_count times, most frequent first (ties alphabetical)."""
    counts = Counter(w for s in sentences for w in s)
    words = sorted((w for w, c in counts.items() if c >= min_count and w not in (BOS, EOS, UNK)),
                   key=lambda w: (-counts[w], w))
    if not words:
        raise DataError(f"no word occurs min_count={min_count} times; lower data.datamodule.min_count or use more text")
    return [BOS, EOS, UNK, *words[:max_words]]


class SimilarLengthBatches(Sampler):
    """Batches of sentences of similar length, in random order: each epoch shuffles the sentences,
    sorts each run of 50 batches' worth by length, cuts it into batches and shuffles the batches.
    The LSTMs step through every padded position, so this halves an epoch's work on a corpus of
    mixed lengths while every batch is still a random draw."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int, epoch: Callable[[], int] = lambda: 0,
                 pool: int = 50):
        """epoch: the current epoch, read at each epoch's start (a resumed run draws the batches an
        uninterrupted one would)."""
        self.lengths, self.batch_size, self.seed, self.epoch, self.pool = lengths, batch_size, seed, epoch, pool

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch())
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        batches = []
        for start in range(0, len(order), self.batch_size * self.pool):
            chunk = sorted(order[start:start + self.batch_size * self.pool], key=self.lengths.__getitem__)
            batches += [chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        for i in torch.randperm(len(batches), generator=generator).tolist():
            yield batches[i]

    def __len__(self) -> int:
        return -(-len(self.lengths) // self.batch_size)


class ElmoDataModule(L.LightningDataModule):
    """Sentences of the prepared corpus (`prepare_corpus`) in batches of similar length
    (SimilarLengthBatches, a new draw each epoch) for training, in order for validation; batches
    padded to their longest sentence."""

    preprocessor: ElmoPreprocessor

    def __init__(self, prepared_dir: str, min_count: int = 2, max_words: int | None = None, max_len: int = 64,
                 max_word_chars: int = 20, batch_size: int = 32, eval_batch_size: int = 128, seed: int = 0,
                 num_workers: int = 0, max_examples: int | None = None):
        """max_words: cap on the output vocabulary (None: every word seen min_count times).
        max_examples: sentences kept per split (None = all; debug=smoke)."""
        super().__init__()
        self.prepared_dir = Path(prepared_dir)
        self.batch_size, self.eval_batch_size, self.seed = batch_size, eval_batch_size, seed
        self.num_workers, self.max_examples = num_workers, max_examples
        self.sentences = {split: self._sentences(split) for split in ("train", "validation")}
        words = build_vocabulary(self.sentences["train"], min_count, max_words)
        self.preprocessor = ElmoPreprocessor(words, max_word_chars, max_len)

    def _sentences(self, split: str) -> list[list[str]]:
        sentences = [words_of(s) for document in read_documents(self.prepared_dir, split) for s in document]
        return [s for s in sentences if s][: self.max_examples]

    def model_kwargs(self) -> dict:
        return {"vocab_size": len(self.preprocessor.words), "max_word_chars": self.preprocessor.max_word_chars}

    def train_dataloader(self) -> DataLoader:
        sentences = self.sentences["train"]
        batches = SimilarLengthBatches([len(s) for s in sentences], self.batch_size, self.seed,
                                       epoch=lambda: self.trainer.current_epoch if self.trainer else 0)
        return DataLoader(sentences, batch_sampler=batches, collate_fn=self.preprocessor.batch,
                          num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.sentences["validation"], self.eval_batch_size, collate_fn=self.preprocessor.batch,
                          num_workers=self.num_workers)
