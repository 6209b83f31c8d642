"""word2vec's per-word SGD step for CBOW with negative sampling, as a compiled loop.

word2vec's C code and gensim's Cython train one centre word after another: average the
window's input vectors, score the centre and its noise words against that mean, move each
output row and then every context word's input vector. As torch operations on a batch that
takes a dozen gathers, products and scatters per update, each a pass over memory; as one
loop (numba, compiled on first use and cached beside this file) the rows stay in registers
and cache: on one thread, 1.8x the words/s of the batched update on two (the update alone;
1.3x for a whole training run).

Plain numpy arrays in and out, so the model hands it views of its tables (no copy).
"""

from __future__ import annotations

import numba
import numpy as np


# word2vec's linear congruential generator: a noise draw costs a multiply and an add.
_LCG_MULTIPLIER, _LCG_INCREMENT = np.uint64(25214903917), np.uint64(11)


@numba.njit(cache=True, nogil=True, fastmath=True)
def cbow_negative_steps(inputs: np.ndarray, outputs: np.ndarray, context: np.ndarray, context_mask: np.ndarray,
                        targets: np.ndarray, noise_table: np.ndarray, seed: int, lr: float,
                        losses: np.ndarray) -> None:
    """One SGD step per example, in order, applied in place to `inputs` and `outputs` (V, d).

    context, context_mask (B, C). targets (B, 1 + K) holds each example's centre word in
    column 0 (label 1); the K noise words (label 0) are drawn here from `noise_table` (the
    unigram table: each word fills slots in proportion to its noise probability) by word2vec's
    generator started at `seed`, and written into columns 1..K. losses (B,) receives each
    example's loss, -log sigma(centre score) - sum log sigma(-noise score), as it stood just
    before its own step. Each step is the gradient step of that one example's loss, so the
    result equals the batched update applied to one example at a time. Every context word
    receives the full step of the mean (word2vec's CBOW update).
    """
    dim = inputs.shape[1]
    hidden = np.empty(dim, dtype=inputs.dtype)
    hidden_step = np.empty(dim, dtype=inputs.dtype)
    steps = np.empty(targets.shape[1], dtype=inputs.dtype)
    state, table_size = np.uint64(seed), np.uint64(len(noise_table))
    for example in range(targets.shape[0]):
        for k in range(1, targets.shape[1]):
            state = state * _LCG_MULTIPLIER + _LCG_INCREMENT
            targets[example, k] = noise_table[(state >> np.uint64(16)) % table_size]
        hidden[:] = 0
        n_context = 0
        for slot in range(context.shape[1]):
            if context_mask[example, slot]:
                word = context[example, slot]
                for j in range(dim):
                    hidden[j] += inputs[word, j]
                n_context += 1
        for j in range(dim):
            hidden[j] /= max(n_context, 1)  # no context: a zero mean, as the batched update's
        # The example's gradient from the rows as they stand, then its step: SGD on one example
        # (a noise word drawn twice, or equal to the centre, moves by both of its steps).
        hidden_step[:] = 0
        # -log sigma(s) = log(1 + e^-s) and -log sigma(-s) = log(1 + e^-s) + s: the loss is the
        # log of one product plus the noise scores, one exp per score and one log per example
        # (float64: no overflow unless the negative scores of one example add up past -700;
        # the steps use each score's own e^-s and are exact even then).
        product, noise_scores = 1.0, 0.0
        for k in range(targets.shape[1]):
            row = targets[example, k]
            score = np.float32(0.0)  # float32 dot products, as the tables: the loops vectorise
            for j in range(dim):
                score += hidden[j] * outputs[row, j]
            e = np.exp(-np.float64(score))
            product *= 1.0 + e
            if k > 0:
                noise_scores += score
            steps[k] = np.float32(((1.0 if k == 0 else 0.0) - 1.0 / (1.0 + e)) * lr)
            for j in range(dim):
                hidden_step[j] += steps[k] * outputs[row, j]
        for k in range(targets.shape[1]):
            row = targets[example, k]
            for j in range(dim):
                outputs[row, j] += steps[k] * hidden[j]
        losses[example] = np.log(product) + noise_scores
        for slot in range(context.shape[1]):
            if context_mask[example, slot]:
                word = context[example, slot]
                for j in range(dim):
                    inputs[word, j] += hidden_step[j]


def warm_up() -> None:
    """Compile the loop now (or load it from the cache: about a second), not in the first
    training step."""
    table = np.zeros((2, 1), dtype=np.float32)
    cbow_negative_steps(table, table.copy(), np.zeros((1, 1), dtype=np.int64), np.ones((1, 1), dtype=np.bool_),
                        np.zeros((1, 2), dtype=np.int64), np.zeros(1, dtype=np.int64), 1, 0.0,
                        np.zeros(1, dtype=np.float32))
