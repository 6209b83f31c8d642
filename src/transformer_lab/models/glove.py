"""GloVe (Pennington et al., 2014): word vectors fitted to the logarithm of a corpus's word-word
co-occurrence counts.

Four tables, as in the paper: word vectors w_i, context vectors w~_j and a bias for each, b_i and
b~_j. For every non-zero count X_ij of the (symmetric) co-occurrence matrix the model predicts
log X_ij as w_i . w~_j + b_i + b~_j; the objective is the paper's weighted least squares (eq. 8)

    J = sum over X_ij > 0 of f(X_ij) (w_i . w~_j + b_i + b~_j - log X_ij)^2,
    f(x) = (x / x_max)^alpha if x < x_max else 1   (x_max 100, alpha 3/4),

so that rare pairs (noisy counts) weigh less and the most frequent ones are not over-weighted.
Zero counts (log 0) do not enter: J runs over the non-zero entries only. Training takes AdaGrad
steps on J/2, whose gradient is f(X_ij) times the residual times the other vector, as GloVe's C
code and mittens take it (the 1/2 moves neither the minimum nor, AdaGrad being all but
scale-free, the steps; it makes the loss the number mittens reports). The vectors kept are
w + w~: with a symmetric X the two tables differ only by their random start, and the paper
found that their sum gives a small boost.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from transformer_lab.models.outputs import ModelOutput


@dataclass
class GloVeConfig:
    vocab_size: int = 1000
    dim: int = 100
    x_max: float = 100.0  # counts at or above it weigh 1
    alpha: float = 0.75   # f(x) = (x / x_max)^alpha below x_max
    # How an AdaGrad step is computed. "compiled": the gradient of the batch and AdaGrad on the
    # rows it touches in one loop (glove_kernel.py; float32 tables on the CPU), a pass over the
    # batch's entries with no (entries x dim) copies: full-batch epochs at 2.4x mittens' speed on 2
    # shared cores (benchmarks/glove_vs_reference.py), where autograd's gathers and scatters ran
    # slower than mittens. "autograd": forward(), torch's backward and torch.optim.Adagrad, the path
    # a test checks the compiled one against (and the one for a GPU).
    update: str = "compiled"

    def __post_init__(self):
        if self.update not in ("compiled", "autograd"):
            raise ValueError(f"update={self.update!r}; expected 'compiled' or 'autograd'")
        if self.x_max <= 0 or self.alpha < 0:
            raise ValueError(f"x_max={self.x_max}, alpha={self.alpha}: expected x_max > 0 and alpha >= 0")

    def to_dict(self) -> dict:
        return asdict(self)


def weighting(counts: torch.Tensor, x_max: float = 100.0, alpha: float = 0.75) -> torch.Tensor:
    """The paper's f: (x / x_max)^alpha below x_max, 1 from there on (eq. 9)."""
    return torch.where(counts < x_max, (counts / x_max) ** alpha, torch.ones_like(counts))


class GloVe(nn.Module):
    def __init__(self, config: GloVeConfig):
        super().__init__()
        self.config = config
        vocab, dim = config.vocab_size, config.dim
        self.word_vectors = nn.Embedding(vocab, dim)
        self.context_vectors = nn.Embedding(vocab, dim)
        self.word_biases = nn.Embedding(vocab, 1)
        self.context_biases = nn.Embedding(vocab, 1)
        # GloVe's C code starts all four tables uniform in (-0.5, 0.5) / dim.
        for table in self.tables():
            nn.init.uniform_(table, -0.5 / dim, 0.5 / dim)
        if config.update == "compiled":
            from transformer_lab.models import glove_kernel

            glove_kernel.warm_up()  # compiled (or loaded from numba's cache) here, not in the first step

    def tables(self) -> list[nn.Parameter]:
        """The four tables, in the order the compiled step takes them: w, w~, b, b~."""
        return [self.word_vectors.weight, self.context_vectors.weight, self.word_biases.weight,
                self.context_biases.weight]

    def forward(self, rows: torch.Tensor, cols: torch.Tensor, counts: torch.Tensor) -> ModelOutput:
        """logits: the predicted log X_ij (N,); loss: each entry's term of J, f(X_ij) times the squared
        residual (N,), for the non-zero counts X_ij at (rows, cols)."""
        prediction = ((self.word_vectors(rows) * self.context_vectors(cols)).sum(-1)
                      + self.word_biases(rows)[:, 0] + self.context_biases(cols)[:, 0])
        residual = prediction - counts.log()
        loss = weighting(counts, self.config.x_max, self.config.alpha) * residual**2
        return ModelOutput(logits=prediction, loss=loss)

    @torch.no_grad()
    def entry_losses(self, rows: torch.Tensor, cols: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """forward(...).loss without autograd: in the compiled loop where config.update='compiled' (a
        pass over the entries, no (N, dim) gathers)."""
        if self.config.update == "autograd" or not self._compiled_tables():
            return self(rows, cols, counts).loss
        from transformer_lab.models.glove_kernel import entry_losses

        losses = torch.empty(len(rows))
        entry_losses(*self._arrays(self.tables()), rows.numpy(), cols.numpy(), counts.numpy(), self.config.x_max,
                     self.config.alpha, losses.numpy())
        return losses

    @torch.no_grad()
    def adagrad_step(self, rows: torch.Tensor, cols: torch.Tensor, counts: torch.Tensor, sums: list[torch.Tensor],
                     lr: float, eps: float = 1e-10) -> torch.Tensor:
        """One AdaGrad step on forward(...).loss.sum() / 2, applied in place to the rows it touches, with
        `sums` the running sums of squared gradients of tables() (torch.optim.Adagrad's state 'sum',
        updated here too): sum += g^2, then table -= lr g / (sqrt(sum) + eps), torch's Adagrad rule.
        Returns each entry's term of J before the step (N,). config.update='compiled' only (the
        task steps torch.optim.Adagrad itself otherwise); a test checks the two agree."""
        if not self._compiled_tables():
            raise ValueError(f"update='compiled' steps float32 tables on the CPU, not {self.word_vectors.weight.dtype} "
                             f"on {self.word_vectors.weight.device}; use update='autograd'")
        from transformer_lab.models.glove_kernel import adagrad_step

        losses = torch.empty(len(rows))
        adagrad_step(*self._arrays(self.tables()), *self._arrays(sums), rows.numpy(), cols.numpy(), counts.numpy(),
                     self.config.x_max, self.config.alpha, lr, eps, losses.numpy())
        return losses

    def vectors(self) -> torch.Tensor:
        """The word vectors GloVe keeps: w + w~ (V, dim)."""
        return self.word_vectors.weight + self.context_vectors.weight

    def _compiled_tables(self) -> bool:
        weight = self.word_vectors.weight
        return weight.device.type == "cpu" and weight.dtype == torch.float32

    @staticmethod
    def _arrays(tables: list[torch.Tensor]) -> list:
        """Numpy views (no copy) of w, w~, b, b~ as tables() orders them, the biases as vectors (V,)."""
        return [t.detach().numpy() for t in tables[:2]] + [t.detach()[:, 0].numpy() for t in tables[2:]]
