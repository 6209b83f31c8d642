"""word2vec training examples from a prepared corpus: vocabulary with min_count,
frequent-word subsampling, dynamic windows, and (centre, context) batches."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from transformer_lab.data.corpus import read_documents, word_tokens
from transformer_lab.errors import DataError


def build_vocabulary(sentences: list[list[str]], min_count: int) -> tuple[list[str], np.ndarray]:
    """Words seen at least min_count times, most frequent first (ties alphabetical), and their counts."""
    counts = Counter(w for s in sentences for w in s)
    words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    if not words:
        raise DataError(f"no word occurs min_count={min_count} times; lower data.min_count or use more text")
    return words, np.array([counts[w] for w in words], dtype=np.int64)


def keep_probabilities(counts: np.ndarray, sample: float) -> np.ndarray:
    """Probability of keeping each occurrence of a word (word2vec's and gensim's formula):
    words more frequent than sample x total are down-sampled; rarer words are always kept."""
    if sample <= 0:
        return np.ones(len(counts))
    threshold = sample * counts.sum()
    return np.minimum(1.0, (np.sqrt(counts / threshold) + 1) * threshold / counts)


def encode_sentences(sentences: list[list[str]], words: list[str]) -> list[np.ndarray]:
    index = {w: i for i, w in enumerate(words)}
    encoded = [np.array([index[w] for w in s if w in index], dtype=np.int64) for s in sentences]
    return [e for e in encoded if len(e) > 1]


def training_pairs(sentences: list[np.ndarray], keep: np.ndarray, window: int, architecture: str,
                   rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """One epoch of examples, vectorised over the whole corpus.

    Each kept token is a centre with its own window b ~ U{1..window} (word2vec's dynamic
    window: near words count more). skip-gram: (centre, context) pairs; CBOW: (context
    matrix, mask, centre). Also returns each example's share of an effective word, so
    that a batch knows how many corpus words it covers.
    """
    kept = [s[rng.random(len(s)) < keep[s]] for s in sentences]
    kept = [s for s in kept if len(s) > 1]
    tokens = np.concatenate(kept)
    sentence_id = np.repeat(np.arange(len(kept)), [len(s) for s in kept])
    reach = rng.integers(1, window + 1, size=len(tokens))
    offsets = np.array([d for d in range(-window, window + 1) if d != 0])
    positions = np.arange(len(tokens))[:, None] + offsets[None, :]
    inside = (positions >= 0) & (positions < len(tokens))
    positions = np.clip(positions, 0, len(tokens) - 1)
    valid = inside & (sentence_id[positions] == sentence_id[:, None]) & (np.abs(offsets)[None, :] <= reach[:, None])
    n_context = valid.sum(1)
    has_context = n_context > 0
    if architecture == "cbow":
        centres = tokens[has_context]
        context = np.where(valid, tokens[positions], 0)[has_context]
        return context, valid[has_context], centres, np.ones(len(centres))
    centre_index, slot = np.nonzero(valid)
    weight = 1.0 / n_context[centre_index]
    return tokens[centre_index], tokens[positions[centre_index, slot]], weight


class Word2VecExamples(IterableDataset):
    """A fresh subsample, windows and shuffle every epoch (seeded by epoch), in ready-made batches.
    fixed=True replays the same examples every time (validation)."""

    def __init__(self, sentences: list[np.ndarray], keep: np.ndarray, window: int, architecture: str,
                 batch_size: int, seed: int, fixed: bool = False):
        self.sentences, self.keep, self.window, self.architecture = sentences, keep, window, architecture
        self.batch_size, self.seed, self.fixed, self.epoch = batch_size, seed, fixed, 0

    def __len__(self) -> int:
        """Batches in the first epoch: later epochs differ a little (subsampling and windows are
        redrawn), close enough for progress bars and the learning-rate schedule."""
        if not hasattr(self, "_length"):
            rng = np.random.default_rng([self.seed, 0])
            examples = len(training_pairs(self.sentences, self.keep, self.window, self.architecture, rng)[0])
            self._length = -(-examples // self.batch_size)
        return self._length

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        if not self.fixed:
            self.epoch += 1
        arrays = training_pairs(self.sentences, self.keep, self.window, self.architecture, rng)
        order = np.arange(len(arrays[0])) if self.fixed else rng.permutation(len(arrays[0]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            batch = [torch.from_numpy(np.ascontiguousarray(a[idx])) for a in arrays]
            if self.architecture == "cbow":
                context, mask, centres, words = batch
                yield {"inputs": context, "input_mask": mask, "targets": centres, "words": words.sum().item()}
            else:
                centres, contexts, words = batch
                yield {"inputs": centres, "targets": contexts, "words": words.sum().item()}


class Word2VecDataModule(L.LightningDataModule):
    def __init__(self, prepared_dir: str, min_count: int = 5, sample: float = 1e-3, window: int = 5,
                 architecture: str = "skipgram", batch_size: int = 4096, seed: int = 0,
                 max_documents: int | None = None):
        super().__init__()
        self.prepared_dir, self.min_count, self.sample, self.window = Path(prepared_dir), min_count, sample, window
        self.architecture, self.batch_size, self.seed, self.max_documents = architecture, batch_size, seed, max_documents
        self.train_sentences = self._sentences("train")
        self.words, self.counts = build_vocabulary(self.train_sentences, min_count)

    def _sentences(self, split: str) -> list[list[str]]:
        documents = read_documents(self.prepared_dir, split)[: self.max_documents]
        return [word_tokens(s) for doc in documents for s in doc]

    def model_kwargs(self) -> dict:
        return {"vocab_size": len(self.words)}

    def task_kwargs(self) -> dict:
        return {"words": self.words, "counts": self.counts.tolist()}

    def train_dataloader(self) -> DataLoader:
        examples = Word2VecExamples(encode_sentences(self.train_sentences, self.words),
                                    keep_probabilities(self.counts, self.sample), self.window, self.architecture,
                                    self.batch_size, self.seed)
        return DataLoader(examples, batch_size=None)

    def val_dataloader(self) -> DataLoader:
        # Held-out documents, subsampled like training (hierarchical softmax learns the subsampled
        # word distribution), with the same draw every epoch so that epochs compare.
        examples = Word2VecExamples(encode_sentences(self._sentences("validation"), self.words),
                                    keep_probabilities(self.counts, self.sample), self.window, self.architecture,
                                    8 * self.batch_size, self.seed + 1, fixed=True)
        return DataLoader(examples, batch_size=None)
