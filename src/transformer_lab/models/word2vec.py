"""word2vec (Mikolov et al., 2013): skip-gram or CBOW, trained by negative sampling or by
hierarchical softmax over a Huffman tree.

Two tables, as in the paper: `input_vectors` (the word vectors one keeps) and
`output_vectors` (words for negative sampling, inner tree nodes for hierarchical softmax).
Both are sparse embeddings, so an optimiser step touches only the rows in the batch.

An example is one centre word with its window of context words. CBOW scores the averaged
context against the centre's output rows. Skip-gram scores each context word against them,
the way word2vec's C code and gensim pair the roles: over a corpus every (centre, context)
pair also occurs reversed, so this is the centre -> context objective, and it lets the
window's pairs share one gather of the centre's output rows and, for negative sampling,
one draw of K noise words (Ji et al., 2016, "Parallelizing Word2Vec in Shared and
Distributed Memory"): per pair still the target and K noise words, but a window's update
becomes small matrix products instead of one vector product per pair.
"""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.models.outputs import ModelOutput

NOISE_TABLE_SIZE = 1_000_000

@dataclass
class Word2VecConfig:
    vocab_size: int = 1000
    dim: int = 100
    architecture: str = "skipgram"  # skipgram: centre -> context; cbow: averaged context -> centre
    objective: str = "negative"  # negative sampling | hierarchical softmax
    negatives: int = 5
    noise_power: float = 0.75  # noise distribution = unigram^0.75
    # How sgd_update steps through an update's examples. "batched": all of them read the same
    # tables and their steps are summed, as torch operations. "per_word": one after another,
    # as word2vec's C and gensim do, in a compiled loop (word2vec_kernel.py; CBOW with negative
    # sampling only, on the CPU). None: per_word for CBOW with negative sampling (1.3x the
    # batched update's words/s end to end on 2 cores, on one of them), batched otherwise.
    update: str | None = None
    # The batched CBOW update with negative sampling: one draw of K noise words per group of
    # this many examples (Ji et al., 2016), scored as small matrix products; 1 = a draw per
    # example. None: 16 there (1.2x the words/s of 1, agreement with gensim within noise), else 1.
    shared_negatives: int | None = None

    def __post_init__(self):
        if self.architecture not in ("skipgram", "cbow"):
            raise ValueError(f"architecture={self.architecture!r}; expected 'skipgram' or 'cbow'")
        if self.objective not in ("negative", "hierarchical"):
            raise ValueError(f"objective={self.objective!r}; expected 'negative' or 'hierarchical'")
        cbow_negative = (self.architecture, self.objective) == ("cbow", "negative")
        if self.update is None:
            self.update = "per_word" if cbow_negative else "batched"
        if self.update not in ("batched", "per_word"):
            raise ValueError(f"update={self.update!r}; expected 'batched' or 'per_word'")
        if self.update == "per_word" and not cbow_negative:
            raise ValueError("update='per_word' is CBOW with negative sampling only; use update='batched'")
        if self.shared_negatives is None:
            self.shared_negatives = 16 if cbow_negative and self.update == "batched" else 1
        if self.shared_negatives < 1 or (self.shared_negatives > 1 and (not cbow_negative or self.update != "batched")):
            raise ValueError(f"shared_negatives={self.shared_negatives}: the batched CBOW update with negative "
                             "sampling only, and >= 1 (skip-gram already shares one draw across a window; the "
                             "per-word update draws for each word)")

    def to_dict(self) -> dict:
        return asdict(self)


def huffman_tree(counts: np.ndarray) -> tuple[list[list[int]], list[list[int]]]:
    """Binary Huffman codes over the vocabulary: frequent words get short codes.

    Returns, per word, its code bits (0/1 from the root down) and the inner nodes on its
    path (numbered 0..V-2, root = V-2), as the original word2vec builds them.
    """
    vocab_size = len(counts)
    heap = [(int(c), i) for i, c in enumerate(counts)]
    heapq.heapify(heap)
    parent, bit = {}, {}
    next_node = vocab_size
    while len(heap) > 1:
        count_a, a = heapq.heappop(heap)
        count_b, b = heapq.heappop(heap)
        parent[a], bit[a] = next_node, 0
        parent[b], bit[b] = next_node, 1
        heapq.heappush(heap, (count_a + count_b, next_node))
        next_node += 1
    codes, points = [], []
    for word in range(vocab_size):
        code, path, node = [], [], word
        while node in parent:
            code.append(bit[node])
            node = parent[node]
            path.append(node - vocab_size)  # inner node index
        codes.append(code[::-1])
        points.append(path[::-1])
    return codes, points


class Word2Vec(nn.Module):
    def __init__(self, config: Word2VecConfig, counts: torch.Tensor):
        super().__init__()
        self.config = config
        vocab, dim = config.vocab_size, config.dim
        self.input_vectors = nn.Embedding(vocab, dim, sparse=True)
        n_outputs = vocab if config.objective == "negative" else max(vocab - 1, 1)
        self.output_vectors = nn.Embedding(n_outputs, dim, sparse=True)
        # word2vec's initialisation: small uniform input vectors, zero output vectors.
        nn.init.uniform_(self.input_vectors.weight, -0.5 / dim, 0.5 / dim)
        nn.init.zeros_(self.output_vectors.weight)

        counts = torch.as_tensor(counts, dtype=torch.float64)
        self.register_buffer("noise", (counts**config.noise_power / (counts**config.noise_power).sum()).float())
        # word2vec's unigram table: each word fills a share of slots equal to its noise probability,
        # so drawing K noise words is K uniform integers (much faster than torch.multinomial).
        slots = torch.round(self.noise.double() * NOISE_TABLE_SIZE).long().clamp(min=1)
        self.register_buffer("noise_table", torch.repeat_interleave(torch.arange(vocab), slots), persistent=False)
        if config.objective == "hierarchical":
            codes, points = huffman_tree(counts.numpy())
            depth = max(len(c) for c in codes)
            pad = lambda rows: torch.tensor([r + [0] * (depth - len(r)) for r in rows])  # noqa: E731
            self.register_buffer("codes", pad(codes).float())
            self.register_buffer("points", pad(points).long())
            self.register_buffer("code_mask", pad([[1] * len(c) for c in codes]).bool())
        if config.update == "per_word":
            from transformer_lab.models import word2vec_kernel

            word2vec_kernel.warm_up()  # compiled (or loaded from numba's cache) here, not in the first step

    def output_rows(self, centres: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The output rows each example scores against (B, M), with the label of each binary
        decision and a 0/1 weight, (B, M) or (1, M) when the same for all.

        Both objectives are a sum of logistic regressions. Negative sampling: the centre word
        (label 1) and K noise words drawn from the unigram table (label 0), one draw per group of
        config.shared_negatives consecutive examples. Hierarchical
        softmax: the inner nodes on the centre's Huffman path, label 1 - code bit, padding
        weighted 0.
        """
        if self.config.objective == "negative":
            k, group = self.config.negatives, self.config.shared_negatives
            draws = torch.randint(len(self.noise_table), (-(-len(centres) // group) * k,), device=centres.device)
            noise = self.noise_table.index_select(0, draws).view(-1, k)
            if group > 1:
                noise = noise.repeat_interleave(group, dim=0)[: len(centres)]
            rows = torch.cat([centres[:, None], noise], dim=1)
            labels = torch.zeros(1, k + 1, device=centres.device)  # the same for every example: broadcast
            labels[0, 0] = 1
            return rows, labels, torch.ones_like(labels)
        return self.points[centres], 1 - self.codes[centres], self.code_mask[centres].float()

    def _hidden(self, context_vectors: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The vectors scored against the output rows, (B, C, d) for skip-gram or (B, 1, d) for
        CBOW (the mean of the window), and the weight of each: (B, C) or (B, 1).

        CBOW's mean has a full-strength backward: every context word receives the whole
        gradient of the mean, as in word2vec's CBOW update (dividing it by the window size
        would slow learning that much). sgd_update applies the same rule by hand.
        """
        if self.config.architecture == "skipgram":
            return context_vectors, mask
        total = (context_vectors * mask[..., None]).sum(1, keepdim=True)
        mean = total / mask.sum(1, keepdim=True)[..., None].clamp(min=1)
        if torch.is_grad_enabled():
            mean = mean.detach() + (total - total.detach())  # forward: the mean; backward: the sum's
        return mean, mask.new_ones(len(mask), 1)

    @staticmethod
    def _loss(scores: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Per example: -sum of log sigma(s) over label-1 decisions and log sigma(-s) over label-0 ones."""
        log_likelihood = F.logsigmoid(scores * (2 * labels - 1)[:, None, :]) * weights[:, None, :]
        return -(log_likelihood * weight[..., None]).sum((1, 2))

    def forward(self, context: torch.Tensor, context_mask: torch.Tensor, centres: torch.Tensor) -> ModelOutput:
        """loss: per example (B,), -log p(centre | context) summed over the window's pairs (skip-gram)
        or for the averaged window (CBOW); logits: the scores of the binary decisions (B, C or 1, M).
        context (B, C) word ids, context_mask (B, C)."""
        mask = context_mask.float()
        vectors = self.input_vectors(context)
        h, weight = self._hidden(vectors, mask)
        rows, labels, weights = self.output_rows(centres)
        scores = h @ self.output_vectors(rows).transpose(1, 2)  # (B, C or 1, M)
        return ModelOutput(logits=scores, loss=self._loss(scores, labels, weights, weight))

    @torch.no_grad()
    def sgd_update(self, context: torch.Tensor, context_mask: torch.Tensor, centres: torch.Tensor,
                   lr: float) -> torch.Tensor:
        """One SGD step on forward(...).sum(), applied in place to the rows it touches, the way
        word2vec's C code and gensim train; returns the loss per example (B,) before the step.

        d(-log sigma(+/-s))/ds = sigma(s) - label, so with g = sigma(s) - label per decision an
        output row moves by -lr * g * h and h by -lr * g * output row. Written out, the step
        skips autograd's graph and the optimiser's per-step work, which cost more than the
        arithmetic at this size; a test checks it against autograd + SGD.
        """
        if self.config.update == "per_word":
            return self._per_word_steps(context, context_mask, centres, lr)[0]
        inputs_table, outputs_table = self.input_vectors.weight, self.output_vectors.weight
        rows, labels, weights = self.output_rows(centres)
        if self.config.architecture == "cbow":
            # The window's mean straight from the table (embedding_bag), without a (B, C, d) copy.
            mask = context_mask.float()
            share = mask / mask.sum(1, keepdim=True).clamp(min=1)
            h = F.embedding_bag(context, inputs_table, per_sample_weights=share, mode="sum")[:, None]  # (B, 1, d)
            weight = mask.new_ones(len(mask), 1)
        else:
            used_columns = context_mask.any(0)
            if not used_columns.all():  # window slots no example here uses: skip their padding
                context, context_mask = context[:, used_columns], context_mask[:, used_columns]
            h = inputs_table.index_select(0, context.flatten()).view(*context.shape, -1)  # (B, C, d)
            weight = context_mask.float()
        if self.config.shared_negatives > 1:
            scores, h_step, out_rows, out_step = self._shared_noise_steps(h[:, 0], rows, labels, lr)
            losses = self._loss(scores, labels, weights, weight)
        else:
            out = outputs_table.index_select(0, rows.flatten()).view(*rows.shape, -1)  # (B, M, d)
            scores = torch.bmm(h, out.transpose(1, 2))  # (B, C or 1, M)
            losses = self._loss(scores, labels, weights, weight)
            # -lr folded into the (B, C, M) decisions, the smallest tensor the step passes through.
            step = (torch.sigmoid(scores) - labels[:, None, :]) * (weights[:, None, :] * weight[..., None] * -lr)
            out_rows, out_step = rows.flatten(), torch.bmm(step.transpose(1, 2), h).flatten(0, 1)  # summed over the window
            h_step = torch.bmm(step, out)  # skip-gram: zero on padding, as the step is
        if self.config.architecture == "cbow":  # every context word receives the full step (see _hidden)
            example, slot = context_mask.nonzero(as_tuple=True)
            in_rows, in_step = context[example, slot], h_step[:, 0].index_select(0, example)
        else:
            in_rows, in_step = context.flatten(), h_step.flatten(0, 1)
        _scatter_add_rows(inputs_table, in_rows, in_step)
        _scatter_add_rows(outputs_table, out_rows, out_step)
        return losses

    def _per_word_steps(self, context: torch.Tensor, context_mask: torch.Tensor, centres: torch.Tensor,
                        lr: float) -> tuple[torch.Tensor, torch.Tensor]:
        """update='per_word': word2vec's order, each example's step applied before the next
        example reads the tables, its K noise words drawn in the loop (word2vec's generator,
        seeded from torch's, so a seeded run repeats). Returns each example's loss just before
        its own step (B,) and the rows it scored (B, 1 + K), centre first."""
        from transformer_lab.models.word2vec_kernel import cbow_negative_steps

        inputs_table, outputs_table = self.input_vectors.weight, self.output_vectors.weight
        if inputs_table.device.type != "cpu" or inputs_table.dtype != torch.float32:
            raise ValueError(f"update='per_word' steps float32 tables on the CPU, not {inputs_table.dtype} on "
                             f"{inputs_table.device}; use update='batched'")
        targets = torch.empty(len(centres), 1 + self.config.negatives, dtype=torch.long)
        targets[:, 0] = centres
        losses = torch.empty(len(centres))
        seed = int(torch.randint(2**62, ()))
        cbow_negative_steps(inputs_table.detach().numpy(), outputs_table.detach().numpy(), context.numpy(),
                            context_mask.numpy(), targets.numpy(), self.noise_table.numpy(), seed, lr, losses.numpy())
        return losses, targets

    def _shared_noise_steps(self, h: torch.Tensor, rows: torch.Tensor, labels: torch.Tensor, lr: float):
        """CBOW's scores and steps when groups of G examples share their K noise words: the
        centre words one row each, the noise as (G, d) x (d, K) products per group, so the
        output rows gathered, stepped and scattered are B + B/G*K instead of B*(K+1).
        Returns scores (B, 1, M), h's step (B, 1, d), the output rows and their steps."""
        group, (batch, dim) = self.config.shared_negatives, h.shape
        groups, outputs_table = -(-batch // group), self.output_vectors.weight
        grouped = lambda x: F.pad(x, (0, 0, 0, groups * group - batch)).view(groups, group, -1)  # noqa: E731
        centre_out = outputs_table.index_select(0, rows[:, 0])  # (B, d)
        noise_rows = rows[::group, 1:]  # (groups, K)
        noise_out = outputs_table.index_select(0, noise_rows.flatten()).view(groups, -1, dim)
        h_grouped = grouped(h)
        noise_scores = torch.bmm(h_grouped, noise_out.transpose(1, 2)).flatten(0, 1)[:batch]
        scores = torch.cat([(h * centre_out).sum(1, keepdim=True), noise_scores], dim=1)  # (B, M)
        step = (torch.sigmoid(scores) - labels) * -lr
        centre_step, noise_step = step[:, :1], grouped(step[:, 1:])  # (B, 1), (groups, G, K)
        h_step = centre_step * centre_out + torch.bmm(noise_step, noise_out).flatten(0, 1)[:batch]
        out_rows = torch.cat([rows[:, 0], noise_rows.flatten()])
        out_step = torch.cat([centre_step * h, torch.bmm(noise_step.transpose(1, 2), h_grouped).flatten(0, 1)])
        return scores[:, None], h_step[:, None], out_rows, out_step


def _scatter_add_rows(table: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> None:
    """table[rows[i]] += values[i], repeated rows summed (a noise word drawn twice moves twice).
    scatter_add_ with a row index expanded over the columns takes PyTorch's sorted, parallel
    CPU path: measured 2.5x faster here than adding a sparse tensor and 3x faster than
    index_add_, with the same sums."""
    table.scatter_add_(0, rows[:, None].expand(-1, table.shape[1]), values)
