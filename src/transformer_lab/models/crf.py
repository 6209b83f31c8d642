"""A linear-chain conditional random field over per-token tag scores (Lafferty et al., 2001), the
output layer of neural taggers since Lample et al. (2016):

    score(y | x) = start[y_1] + Σ_t emissions[t, y_t] + Σ_t transitions[y_{t-1}, y_t] + end[y_n]
    log p(y | x) = score(y | x) - log Σ_y' exp score(y' | x)       (forward algorithm)
    best y       = argmax_y score(y | x)                             (Viterbi)

The transitions are learnt: with BIO tags the layer finds out that I-city follows B-city or
I-city, never O, which a per-token softmax cannot express. Sequences are right-padded; `mask`
(batch, time) is True on real positions, every row a prefix of at least one position.
"""

from __future__ import annotations

import torch
from torch import nn


class LinearChainCRF(nn.Module):
    def __init__(self, n_tags: int):
        super().__init__()
        self.start_transitions = nn.Parameter(torch.zeros(n_tags))
        self.end_transitions = nn.Parameter(torch.zeros(n_tags))
        self.transitions = nn.Parameter(torch.zeros(n_tags, n_tags))  # [from, to]

    def log_likelihood(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log p(tags | emissions) per sequence, (batch,). emissions (batch, time, n_tags) in float;
        tags (batch, time), anything on padding."""
        emissions = emissions.float()
        return self.score(emissions, tags, mask) - self.log_partition(emissions, mask)

    def score(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        tags = tags.masked_fill(~mask, 0)
        emitted = emissions.gather(-1, tags[..., None]).squeeze(-1)  # (batch, time)
        moved = self.transitions[tags[:, :-1], tags[:, 1:]]           # (batch, time - 1)
        last = tags.gather(1, (mask.sum(1) - 1)[:, None]).squeeze(1)
        return (self.start_transitions[tags[:, 0]] + (emitted * mask).sum(1) + (moved * mask[:, 1:]).sum(1)
                + self.end_transitions[last])

    def log_partition(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log Σ over every tag sequence of exp(score), (batch,)."""
        alpha = self.start_transitions + emissions[:, 0]  # (batch, n_tags): log-sum of paths ending in each tag
        for t in range(1, emissions.shape[1]):
            step = torch.logsumexp(alpha[:, :, None] + self.transitions, dim=1) + emissions[:, t]
            alpha = torch.where(mask[:, t, None], step, alpha)
        return torch.logsumexp(alpha + self.end_transitions, dim=1)

    @torch.no_grad()
    def decode(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The highest-scoring tag sequence (Viterbi), (batch, time); 0 on padding."""
        emissions = emissions.float()
        best = self.start_transitions + emissions[:, 0]
        backpointers = []  # [t]: for each tag at t + 1, the best tag at t
        for t in range(1, emissions.shape[1]):
            scores, previous = (best[:, :, None] + self.transitions).max(dim=1)
            best = torch.where(mask[:, t, None], scores + emissions[:, t], best)
            backpointers.append(previous)
        current = (best + self.end_transitions).argmax(-1)
        last = mask.sum(1) - 1
        tags = torch.zeros(mask.shape, dtype=torch.long, device=emissions.device)
        for t in range(emissions.shape[1] - 1, -1, -1):
            if t < len(backpointers):  # step back only from a real position t + 1
                stepped = backpointers[t].gather(1, current[:, None]).squeeze(1)
                current = torch.where(t + 1 <= last, stepped, current)
            tags[:, t] = current
        return tags.masked_fill(~mask, 0)
