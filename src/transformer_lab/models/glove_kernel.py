"""GloVe's AdaGrad step as a compiled loop (numba, compiled on first use and cached beside this file).

As torch operations a batch of N co-occurrence entries is two (N, dim) gathers, their product and
two (N, dim) scatters of the gradient, each a pass over memory, and then AdaGrad over the whole
tables. Here one pass over the entries reads each entry's two rows, adds its gradient into a
compact buffer of the rows the batch touches, and AdaGrad then moves those rows only (a row with
no gradient would not move under AdaGrad anyway: its sum and its step are unchanged by a zero).

Plain numpy arrays in and out, so the model hands it views of its tables (no copy). The tables and
AdaGrad sums are float32; the biases come as vectors (V,).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, fastmath=True)
def _residual(words, contexts, word_biases, context_biases, i, j, count) -> float:
    """w_i . w~_j + b_i + b~_j - log X_ij."""
    word_row, context_row = words[i], contexts[j]
    score = np.float32(0.0)  # float32 products, as the tables: the loop vectorises
    for t in range(len(word_row)):
        score += word_row[t] * context_row[t]
    return score + word_biases[i] + context_biases[j] - np.log(count)


@numba.njit(cache=True, nogil=True, fastmath=True)
def _weight(count, x_max, alpha) -> float:
    return (count / x_max) ** alpha if count < x_max else 1.0


@numba.njit(cache=True, nogil=True, fastmath=True)
def entry_losses(words, contexts, word_biases, context_biases, rows, cols, counts, x_max, alpha, losses) -> None:
    """losses[k] = f(X) (w_i . w~_j + b_i + b~_j - log X)^2 for entry k = (rows[k], cols[k], counts[k])."""
    for k in range(len(rows)):
        residual = _residual(words, contexts, word_biases, context_biases, rows[k], cols[k], counts[k])
        losses[k] = _weight(counts[k], x_max, alpha) * residual * residual


@numba.njit(cache=True, nogil=True, fastmath=True)
def _touched(ids, vocab_size):
    """Each distinct row of `ids` a slot 0..n-1 in order of first appearance: (slot per entry, rows)."""
    slot_of = np.full(vocab_size, -1, dtype=np.int64)
    slots = np.empty(len(ids), dtype=np.int64)
    rows = np.empty(min(len(ids), vocab_size), dtype=np.int64)
    n = 0
    for k in range(len(ids)):
        row = ids[k]
        if slot_of[row] < 0:
            slot_of[row] = n
            rows[n] = row
            n += 1
        slots[k] = slot_of[row]
    return slots, rows[:n]


@numba.njit(cache=True, nogil=True, fastmath=True)
def _adagrad_rows(table, sums, rows, gradient, lr, eps) -> None:
    """table[row] -= lr g / (sqrt(sum) + eps) after sum += g^2, for each row's gradient g (torch's Adagrad)."""
    for slot in range(len(rows)):
        table_row, sums_row, gradient_row = table[rows[slot]], sums[rows[slot]], gradient[slot]
        for t in range(len(table_row)):
            g = gradient_row[t]
            total = sums_row[t] + g * g
            sums_row[t] = total
            table_row[t] -= lr * g / (np.sqrt(total) + eps)


@numba.njit(cache=True, nogil=True, fastmath=True)
def _adagrad_biases(biases, sums, rows, gradient, lr, eps) -> None:
    for slot in range(len(rows)):
        row, g = rows[slot], gradient[slot]
        sums[row] += g * g
        biases[row] -= lr * g / (np.sqrt(sums[row]) + eps)


@numba.njit(cache=True, nogil=True, fastmath=True)
def adagrad_step(words, contexts, word_biases, context_biases, word_sums, context_sums, word_bias_sums,
                 context_bias_sums, rows, cols, counts, x_max, alpha, lr, eps, losses) -> None:
    """One AdaGrad step on half the batch's J, in place on the tables and their sums of squared
    gradients; losses[k] receives entry k's term of J, f(X) residual^2, before the step.

    The gradient first, from the tables as they stand (the step of the whole batch, as
    torch.optim.Adagrad takes it after a backward pass), then the rows move: with g = f(X) residual,
    w_i gets g w~_j, w~_j gets g w_i, and each bias g.
    """
    dim, vocab = words.shape[1], words.shape[0]
    lr, eps = np.float32(lr), np.float32(eps)  # float32 arithmetic throughout, as the tables: the loops vectorise
    word_slots, word_rows = _touched(rows, vocab)
    context_slots, context_rows = _touched(cols, vocab)
    word_grad = np.zeros((len(word_rows), dim), dtype=np.float32)
    context_grad = np.zeros((len(context_rows), dim), dtype=np.float32)
    word_bias_grad = np.zeros(len(word_rows), dtype=np.float32)
    context_bias_grad = np.zeros(len(context_rows), dtype=np.float32)
    for k in range(len(rows)):
        i, j = rows[k], cols[k]
        residual = _residual(words, contexts, word_biases, context_biases, i, j, counts[k])
        g = np.float32(_weight(counts[k], x_max, alpha) * residual)
        losses[k] = g * residual
        a, b = word_slots[k], context_slots[k]
        word_row, context_row = words[i], contexts[j]
        word_grad_row, context_grad_row = word_grad[a], context_grad[b]
        for t in range(dim):
            word_grad_row[t] += g * context_row[t]
            context_grad_row[t] += g * word_row[t]
        word_bias_grad[a] += g
        context_bias_grad[b] += g
    _adagrad_rows(words, word_sums, word_rows, word_grad, lr, eps)
    _adagrad_rows(contexts, context_sums, context_rows, context_grad, lr, eps)
    _adagrad_biases(word_biases, word_bias_sums, word_rows, word_bias_grad, lr, eps)
    _adagrad_biases(context_biases, context_bias_sums, context_rows, context_bias_grad, lr, eps)


def warm_up() -> None:
    """Compile the loops now (or load them from the cache: about a second), not in the first step."""
    table, bias = np.zeros((2, 1), dtype=np.float32), np.zeros(2, dtype=np.float32)
    rows, counts, losses = np.zeros(1, dtype=np.int64), np.ones(1, dtype=np.float32), np.zeros(1, dtype=np.float32)
    entry_losses(table, table, bias, bias, rows, rows, counts, 100.0, 0.75, losses)
    adagrad_step(table, table.copy(), bias, bias.copy(), table.copy(), table.copy(), bias.copy(), bias.copy(),
                 rows, rows, counts, 100.0, 0.75, 0.05, 1e-10, losses)
