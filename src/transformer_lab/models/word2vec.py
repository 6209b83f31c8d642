"""word2vec (Mikolov et al., 2013): skip-gram or CBOW, trained by negative sampling or by
hierarchical softmax over a Huffman tree.

Two tables, as in the paper: `input_vectors` (the word vectors one keeps) and
`output_vectors` (context words for negative sampling, inner tree nodes for hierarchical
softmax). Both are sparse embeddings, so an optimiser step touches only the rows in the batch.
"""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

NOISE_TABLE_SIZE = 1_000_000

@dataclass
class Word2VecConfig:
    vocab_size: int = 1000
    dim: int = 100
    architecture: str = "skipgram"  # skipgram: centre -> context; cbow: averaged context -> centre
    objective: str = "negative"  # negative sampling | hierarchical softmax
    negatives: int = 5
    noise_power: float = 0.75  # noise distribution = unigram^0.75

    def __post_init__(self):
        if self.architecture not in ("skipgram", "cbow"):
            raise ValueError(f"architecture={self.architecture!r}; expected 'skipgram' or 'cbow'")
        if self.objective not in ("negative", "hierarchical"):
            raise ValueError(f"objective={self.objective!r}; expected 'negative' or 'hierarchical'")

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

    def hidden(self, inputs: torch.Tensor, input_mask: torch.Tensor | None = None) -> torch.Tensor:
        """skip-gram: inputs (B,) centre words; CBOW: inputs (B, C) context words, averaged over the mask."""
        if self.config.architecture == "skipgram":
            return self.input_vectors(inputs)
        total = (self.input_vectors(inputs) * input_mask[..., None]).sum(1)
        mean = total / input_mask.sum(1, keepdim=True).clamp(min=1)
        # Forward: the mean. Backward: every context word receives the full gradient, as in
        # word2vec's CBOW update (dividing it by the window size would slow learning that much).
        return mean.detach() + (total - total.detach())

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor, input_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Loss per example (B,): -log p(target | inputs) under the chosen objective."""
        h = self.hidden(inputs, input_mask)
        if self.config.objective == "negative":
            draws = torch.randint(len(self.noise_table), (len(targets), self.config.negatives), device=h.device)
            # One lookup for the true word and its K noise words: one sparse gradient, not two to add.
            words = torch.cat([targets[:, None], self.noise_table[draws]], dim=1)
            scores = (self.output_vectors(words) * h[:, None, :]).sum(-1)  # (B, 1 + K); faster than bmm here
            return -F.logsigmoid(scores[:, 0]) - F.logsigmoid(-scores[:, 1:]).sum(-1)
        # Hierarchical softmax: one binary decision per inner node on the target's Huffman path.
        nodes, bits, mask = self.points[targets], self.codes[targets], self.code_mask[targets]
        scores = (self.output_vectors(nodes) * h[:, None, :]).sum(-1)
        return -(F.logsigmoid(scores * (1 - 2 * bits)) * mask).sum(-1)  # bit 0 -> sigma(s), bit 1 -> sigma(-s)
