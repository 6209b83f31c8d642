"""GloVe's input: the word-word co-occurrence matrix of a prepared corpus, counted once, then its
non-zero entries in shuffled batches.

X_ij sums, over every ordered pair of positions (p, q) of one sentence with 0 < |p - q| <= window,
word i at p and word j at q, the weight 1 / |p - q| (the paper's distance weighting: "word pairs
that are d words apart contribute 1/d to the total count"). The window is symmetric, so X is:
X_ij = X_ji, and a word next to itself at distance d adds 2/d to X_ii, both orders, as GloVe's
cooccur.c counts with symmetric=1. Words outside the vocabulary are dropped before windowing
(cooccur.c's and word2vec's way), and windows stay inside sentences, as this project's word2vec's.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import scipy.sparse
import torch
from torch.utils.data import DataLoader, IterableDataset

from transformer_lab.data.corpus import read_documents, word_tokens
from transformer_lab.data.word2vec import Word2VecPreprocessor, build_vocabulary, encode_sentences
from transformer_lab.errors import DataError


def vocabulary(sentences: list[list[str]], min_count: int, max_size: int | None = None) -> tuple[list[str], np.ndarray]:
    """Words seen at least min_count times, most frequent first, at most max_size of them (None: all),
    and their counts."""
    words, counts = build_vocabulary(sentences, min_count)
    return words[:max_size], counts[:max_size]


def cooccurrences(sentences: list[np.ndarray], vocab_size: int, window: int = 10) -> tuple[np.ndarray, ...]:
    """The non-zero entries of X as (rows, cols, values), in row-major order: int64, int64, float64.

    One vectorised pass per distance d = 1..window pairs each token with the token d places on (when
    both are in one sentence), weight 1/d; the sparse sum adds up repeated pairs, and X is that
    one-way count plus its transpose (each pair the other way round)."""
    if window < 1:
        raise DataError(f"data.datamodule.window={window}: a co-occurrence window is at least 1 word")
    if not sentences:
        raise DataError("no sentence has two words of the vocabulary: nothing co-occurs")
    tokens = np.concatenate(sentences)
    sentence = np.repeat(np.arange(len(sentences)), [len(s) for s in sentences])
    left, right, weight = [], [], []
    for distance in range(1, window + 1):
        same = sentence[:-distance] == sentence[distance:]
        left.append(tokens[:-distance][same])
        right.append(tokens[distance:][same])
        weight.append(np.full(len(left[-1]), 1.0 / distance))
    one_way = scipy.sparse.coo_matrix((np.concatenate(weight), (np.concatenate(left), np.concatenate(right))),
                                      shape=(vocab_size, vocab_size)).tocsr()  # repeated pairs summed
    both = (one_way + one_way.T).tocsr()
    both.sort_indices()
    entries = both.tocoo()
    return entries.row.astype(np.int64), entries.col.astype(np.int64), entries.data.astype(np.float64)


class CooccurrenceEntries(IterableDataset):
    """X's non-zero entries in batches of batch_size: {rows, cols, counts}. A fresh order every epoch
    (seeded by epoch), as the paper samples them; fixed=True, or a batch that holds them all (one
    AdaGrad step over the whole matrix, as mittens takes), keeps row-major order, the same every time
    (the compiled step is faster in it: the rows it reads stay in cache)."""

    def __init__(self, rows: np.ndarray, cols: np.ndarray, counts: np.ndarray, batch_size: int, seed: int = 0,
                 fixed: bool = False):
        self.rows, self.cols, self.counts = rows, cols, counts.astype(np.float32)
        self.batch_size, self.seed, self.fixed, self.epoch = batch_size, seed, fixed, 0

    def __len__(self) -> int:
        return -(-len(self.rows) // self.batch_size)

    def __iter__(self):
        epoch = self.epoch
        self.epoch += 1
        n = len(self.rows)
        if self.fixed or self.batch_size >= n:
            batches = (slice(start, start + self.batch_size) for start in range(0, n, self.batch_size))
            take = lambda array, rows: array[rows]  # views
        else:
            order = np.random.default_rng([self.seed, epoch]).permutation(n)
            batches = (order[start : start + self.batch_size] for start in range(0, n, self.batch_size))
            # numpy's gather, on one thread: an epoch of the Lee corpus's 220,000 entries in 0.02 s, where
            # torch's indexing took 0.4 s on 2 busy cores
            take = np.take
        for rows in batches:
            yield {"rows": torch.from_numpy(take(self.rows, rows)), "cols": torch.from_numpy(take(self.cols, rows)),
                   "counts": torch.from_numpy(take(self.counts, rows))}


class GloVeDataModule(L.LightningDataModule):
    """The corpus's co-occurrence matrix, counted from its train split when the datamodule is built.
    GloVe fits that matrix and has no held-out objective: validation scores the fit, J over every
    non-zero entry with the parameters as they are at the epoch's end."""

    preprocessor: Word2VecPreprocessor

    def __init__(self, prepared_dir: str, min_count: int = 5, max_vocab: int | None = None, window: int = 10,
                 batch_size: int = 16384, seed: int = 0, max_documents: int | None = None,
                 max_examples: int | None = None):
        """max_vocab: the most frequent words kept (None: every word seen min_count times).
        batch_size: non-zero entries per AdaGrad step. max_examples: sentences kept (None = all; debug=smoke)."""
        super().__init__()
        self.batch_size, self.seed = batch_size, seed
        documents = read_documents(Path(prepared_dir), "train")[:max_documents]
        sentences = [word_tokens(s) for doc in documents for s in doc][:max_examples]
        words, counts = vocabulary(sentences, min_count, max_vocab)
        self.preprocessor = Word2VecPreprocessor(words, counts.tolist())
        self.rows, self.cols, self.counts = cooccurrences(encode_sentences(sentences, words), len(words), window)

    def model_kwargs(self) -> dict:
        return {"vocab_size": len(self.preprocessor.words)}

    def train_dataloader(self) -> DataLoader:
        return DataLoader(CooccurrenceEntries(self.rows, self.cols, self.counts, self.batch_size, self.seed),
                          batch_size=None)

    def val_dataloader(self) -> DataLoader:
        # Scored in row order, in batches of at least 2^18 entries: a pass, no step.
        entries = CooccurrenceEntries(self.rows, self.cols, self.counts, max(self.batch_size, 2**18), fixed=True)
        return DataLoader(entries, batch_size=None)
