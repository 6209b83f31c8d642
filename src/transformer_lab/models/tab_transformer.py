"""TabTransformer (Huang et al., 2020): the shared TransformerBlock over a row's categorical
columns, with the continuous columns joining after it.

    categorical column i, value v ─► embedding table i (+ the column's own embedding, optional)
      ─► L blocks over the C column tokens, no positional encoding: the columns are a set
      ─► contextual embeddings, flattened (C x d)
                                                   ├─► concatenate ─► MLP ─► class logits
    continuous columns (+ missing indicators) ─► LayerNorm

Column embedding (the paper's "shared" variant): the first column_embedding_dim of the d
dimensions of every token are a learned vector of its column, the remaining d - that are the
value's own embedding; 0 switches it off, and then nothing tells the encoder which column a
token came from (a test checks that permuting the columns permutes the outputs).

architecture="mlp" is the ablation the paper compares against: the same embeddings, flattened
into the same MLP head, with no transformer in between.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from transformer_lab.models.blocks import TransformerBlock
from transformer_lab.models.outputs import ModelOutput


@dataclass
class TabTransformerConfig:
    cardinalities: list[int] = field(default_factory=list)  # embedding rows per categorical column
    n_continuous: int = 0
    n_classes: int = 2
    architecture: str = "transformer"  # transformer | mlp (no encoder: the ablation)
    d_model: int = 32
    n_layers: int = 6
    n_heads: int = 8
    d_ff: int | None = None  # None = 4 * d_model
    dropout: float = 0.1  # attention and feed-forward dropout
    activation: str = "gelu"
    norm_first: bool = False  # the paper uses the post-norm block of the 2017 transformer
    column_embedding_dim: int | None = None  # None = d_model // 8 (the paper's choice); 0 = off
    mlp_hidden: list[float] = field(default_factory=lambda: [4, 2])  # multiples of the MLP's input width
    mlp_dropout: float = 0.1

    def __post_init__(self):
        if self.architecture not in ("transformer", "mlp"):
            raise ValueError(f"architecture={self.architecture!r}; expected 'transformer' or 'mlp'")
        self.d_ff = 4 * self.d_model if self.d_ff is None else self.d_ff
        self.column_embedding_dim = self.d_model // 8 if self.column_embedding_dim is None else self.column_embedding_dim
        if not 0 <= self.column_embedding_dim < self.d_model:
            raise ValueError(f"column_embedding_dim={self.column_embedding_dim} must be in [0, d_model)")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")

    def to_dict(self) -> dict:
        return asdict(self)


class CategoricalEmbedding(nn.Module):
    """One embedding table per column (stored as one matrix with per-column row offsets, so the
    lookup is a single gather), plus the optional per-column embedding."""

    def __init__(self, cardinalities: list[int], d_model: int, column_embedding_dim: int):
        super().__init__()
        offsets = torch.tensor([0, *cardinalities[:-1]]).cumsum(0) if cardinalities else torch.zeros(0)
        self.register_buffer("offsets", offsets.long(), persistent=False)
        self.values = nn.Embedding(max(sum(cardinalities), 1), d_model - column_embedding_dim)
        self.columns = nn.Parameter(torch.randn(len(cardinalities), column_embedding_dim) * 0.02) \
            if column_embedding_dim else None

    def forward(self, categorical: torch.Tensor) -> torch.Tensor:
        """(batch, columns) indices -> (batch, columns, d_model)."""
        tokens = self.values(categorical + self.offsets)
        if self.columns is None:
            return tokens
        return torch.cat([self.columns.expand(len(tokens), -1, -1), tokens], dim=-1)


class TabTransformer(nn.Module):
    def __init__(self, config: TabTransformerConfig):
        super().__init__()
        self.config = c = config
        n_columns = len(c.cardinalities)
        self.embedding = CategoricalEmbedding(c.cardinalities, c.d_model, c.column_embedding_dim)
        n_blocks = c.n_layers if c.architecture == "transformer" else 0
        self.blocks = nn.ModuleList(
            TransformerBlock(c.d_model, c.n_heads, c.d_ff, dropout=c.dropout, activation=c.activation,
                             norm_first=c.norm_first)
            for _ in range(n_blocks))
        self.continuous_norm = nn.LayerNorm(c.n_continuous) if c.n_continuous else nn.Identity()
        width = n_columns * c.d_model + c.n_continuous
        layers: list[nn.Module] = []
        for multiple in c.mlp_hidden:
            hidden = max(1, int(multiple * width))
            layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(c.mlp_dropout)]
            width = hidden
        self.head = nn.Sequential(*layers, nn.Linear(width, c.n_classes))

    def contextualize(self, categorical: torch.Tensor, *, return_weights: bool = False
                      ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """(batch, columns) indices -> the contextual embeddings (batch, columns, d_model) and, with
        return_weights, every block's attention weights (which columns each column reads; else None)."""
        x = self.embedding(categorical)
        weights = []
        for block in self.blocks:
            x, w = block(x, return_weights=return_weights)
            weights.append(w)
        return x, weights if return_weights else None

    def forward(self, categorical: torch.Tensor, continuous: torch.Tensor, *, return_weights: bool = False
                ) -> ModelOutput:
        """categorical (batch, columns) int, continuous (batch, n_continuous) -> logits (batch, n_classes);
        hidden_states: the contextual embeddings (batch, columns, d_model)."""
        contextual, attentions = self.contextualize(categorical, return_weights=return_weights)
        features = torch.cat([contextual.flatten(1), self.continuous_norm(continuous)], dim=-1)
        return ModelOutput(logits=self.head(features), hidden_states=contextual, attentions=attentions)
