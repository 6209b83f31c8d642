"""TabTransformer (Huang et al., 2020) and FT-Transformer (Gorishniy et al., 2021): the shared
TransformerBlock over a row's columns, one model with the layout chosen by config.

numeric="concat" (the TabTransformer):
    categorical column i, value v ─► embedding table i (+ the column's own embedding, optional)
      ─► L blocks over the C column tokens, no positional encoding: the columns are a set
      ─► contextual embeddings, flattened (C x d)
                                                   ├─► concatenate ─► MLP ─► class logits
    continuous columns (+ missing indicators) ─► LayerNorm (or their numeric encoding, flattened)

numeric="tokens" (the FT-Transformer): every continuous input is a token too, so attention
runs over all columns:
    categorical tokens + one token per continuous input (its numeric encoding, then a linear
    map of that column's own: its own direction and offset tell the column apart)
      [+ a [CLS] token] ─► L blocks ─► readout="flatten": every token ─► MLP ─► logits
                                       readout="cls": [CLS] ─► LayerNorm, ReLU, linear ─► logits

Numeric encodings (Gorishniy et al., 2022), each a per-column map of the standardised value x:
    linear     x                                         (FT-Transformer's "feature tokenizer")
    piecewise  piecewise-linear encoding over bins whose edges are quantiles of the training
               rows: component t is 0 left of bin t, 1 right of it, the position inside it
               in between (the first bin extends left, the last right)
    periodic   sin and cos of 2π c_k x for learned frequencies c_k (N(0, frequency_scale) at
               the start), then linear and ReLU ("PLR")
each followed by the column's linear map to d_model.

Column embedding (the paper's "shared" variant): the first column_embedding_dim of the d
dimensions of every categorical token are a learned vector of its column, the remaining d - that
are the value's own embedding; 0 switches it off, and then nothing tells the encoder which column
a categorical token came from (a test checks that permuting the columns permutes the outputs).

architecture="mlp" is the ablation the paper compares against: the same embeddings, flattened
into the same MLP head, with no transformer in between.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from transformer_lab.models.dropout import Dropout
from transformer_lab.models.blocks import TransformerBlock
from transformer_lab.models.outputs import ModelOutput

NUMERIC_LAYOUTS = ("concat", "tokens")
NUMERIC_ENCODINGS = ("linear", "piecewise", "periodic")
READOUTS = ("flatten", "cls")


@dataclass
class TabTransformerConfig:
    cardinalities: list[int] = field(default_factory=list)  # embedding rows per categorical column
    n_continuous: int = 0
    n_classes: int = 2
    architecture: str = "transformer"  # transformer | mlp (no encoder: the ablation)
    numeric: str = "concat"  # concat: continuous inputs beside the encoder (TabTransformer) | tokens (FT-Transformer)
    numeric_encoding: str = "linear"  # linear | piecewise | periodic
    numeric_bins: list[list[float]] = field(default_factory=list)  # piecewise: bin edges per continuous input
    n_frequencies: int = 16  # periodic: frequencies per column
    frequency_scale: float = 1.0  # periodic: standard deviation of the initial frequencies
    readout: str = "flatten"  # flatten: every token into the MLP | cls: a [CLS] token's final state
    d_model: int = 32
    n_layers: int = 6
    n_heads: int = 8
    d_ff: int | None = None  # None = 4 * d_model
    dropout: float = 0.1  # attention and feed-forward dropout
    fast_dropout: bool = True  # cheap CPU dropout masks (models/dropout.py); false: torch's own
    activation: str = "gelu"
    norm_first: bool = False  # the TabTransformer paper uses the post-norm block of the 2017 transformer
    column_embedding_dim: int | None = None  # None = d_model // 8 (the paper's choice); 0 = off
    mlp_hidden: list[float] = field(default_factory=lambda: [4, 2])  # multiples of the MLP's input width
    mlp_dropout: float = 0.1

    def __post_init__(self):
        for name, value, allowed in (("architecture", self.architecture, ("transformer", "mlp")),
                                     ("numeric", self.numeric, NUMERIC_LAYOUTS),
                                     ("numeric_encoding", self.numeric_encoding, NUMERIC_ENCODINGS),
                                     ("readout", self.readout, READOUTS)):
            if value not in allowed:
                raise ValueError(f"{name}={value!r}; expected one of {', '.join(allowed)}")
        if self.readout == "cls" and self.architecture == "mlp":
            raise ValueError("readout='cls' needs the transformer (architecture='mlp' has no [CLS] to read)")
        if self.numeric_encoding == "piecewise" and self.n_continuous and len(self.numeric_bins) != self.n_continuous:
            raise ValueError(f"numeric_encoding='piecewise' needs bin edges for each of the {self.n_continuous} "
                             f"continuous inputs (numeric_bins has {len(self.numeric_bins)})")
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


class PiecewiseLinearEncoding(nn.Module):
    """(batch, columns) standardised values -> (batch, columns, max bins): each column's
    piecewise-linear encoding over its own bins (columns with fewer bins are padded with zeros)."""

    def __init__(self, bin_edges: list[list[float]]):
        super().__init__()
        n_bins = max((len(edges) - 1 for edges in bin_edges), default=1)
        left = torch.zeros(len(bin_edges), n_bins)
        width = torch.ones(len(bin_edges), n_bins)
        used = torch.zeros(len(bin_edges), n_bins, dtype=torch.bool)
        for j, edges in enumerate(bin_edges):
            edges = torch.tensor(edges, dtype=torch.float32)
            if len(edges) < 2 or not bool((edges[1:] > edges[:-1]).all()):
                raise ValueError(f"numeric_bins[{j}]: needs at least 2 strictly increasing edges, got {edges.tolist()}")
            k = len(edges) - 1
            left[j, :k], width[j, :k], used[j, :k] = edges[:-1], edges[1:] - edges[:-1], True
        last = used.sum(1, keepdim=True) - 1  # each column's last bin: open to the right
        index = torch.arange(n_bins)
        self.register_buffer("left", left)
        self.register_buffer("width", width)
        self.register_buffer("used", used)
        self.register_buffer("open_left", (index == 0).expand_as(used).clone())
        self.register_buffer("open_right", index == last)
        self.n_bins = n_bins

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        position = (x[..., None] - self.left) / self.width
        position = torch.where(self.open_left, position, position.clamp(min=0))
        position = torch.where(self.open_right, position, position.clamp(max=1))
        return position * self.used


class NumericEmbedding(nn.Module):
    """(batch, columns) standardised continuous inputs -> one d_model token per column: the
    column's numeric encoding, then a linear map of that column's own (weight and bias per column)."""

    def __init__(self, c: TabTransformerConfig):
        super().__init__()
        n, d = c.n_continuous, c.d_model
        self.encoding = c.numeric_encoding
        if self.encoding == "linear":
            width = 1
        elif self.encoding == "piecewise":
            self.piecewise = PiecewiseLinearEncoding(c.numeric_bins)
            width = self.piecewise.n_bins
        else:
            self.frequencies = nn.Parameter(torch.randn(n, c.n_frequencies) * c.frequency_scale)
            width = 2 * c.n_frequencies
        self.weight = nn.Parameter(torch.randn(n, width, d) / math.sqrt(width))
        self.bias = nn.Parameter(torch.randn(n, d) * 0.02)

    def forward(self, continuous: torch.Tensor) -> torch.Tensor:
        if self.encoding == "linear":
            features = continuous[..., None]
        elif self.encoding == "piecewise":
            features = self.piecewise(continuous)
        else:
            angles = 2 * math.pi * self.frequencies * continuous[..., None]
            features = torch.cat([angles.sin(), angles.cos()], dim=-1)
        tokens = torch.einsum("bnw,nwd->bnd", features, self.weight) + self.bias
        return tokens.relu() if self.encoding == "periodic" else tokens


class TabTransformer(nn.Module):
    def __init__(self, config: TabTransformerConfig):
        super().__init__()
        self.config = c = config
        self.embedding = CategoricalEmbedding(c.cardinalities, c.d_model, c.column_embedding_dim)
        # concat + linear is the TabTransformer's own input: the raw standardised values, layer-normed
        raw_continuous = c.numeric == "concat" and c.numeric_encoding == "linear"
        self.numeric_embedding = NumericEmbedding(c) if c.n_continuous and not raw_continuous else None
        self.continuous_norm = nn.LayerNorm(c.n_continuous) if c.n_continuous and raw_continuous else nn.Identity()
        self.cls_token = nn.Parameter(torch.randn(1, 1, c.d_model) * 0.02) if c.readout == "cls" else None
        n_blocks = c.n_layers if c.architecture == "transformer" else 0
        self.blocks = nn.ModuleList(
            TransformerBlock(c.d_model, c.n_heads, c.d_ff, dropout=c.dropout, activation=c.activation,
                             norm_first=c.norm_first, fast_dropout=c.fast_dropout)
            for _ in range(n_blocks))
        n_tokens = len(c.cardinalities) + (c.n_continuous if c.numeric == "tokens" else 0)
        if c.readout == "cls":  # the FT-Transformer's head: its pre-norm blocks leave the last output un-normed
            self.head = nn.Sequential(nn.LayerNorm(c.d_model), nn.ReLU(), nn.Linear(c.d_model, c.n_classes))
            return
        width = n_tokens * c.d_model
        if c.numeric == "concat":
            width += c.n_continuous * (1 if raw_continuous else c.d_model)
        layers: list[nn.Module] = []
        for multiple in c.mlp_hidden:
            hidden = max(1, int(multiple * width))
            layers += [nn.Linear(width, hidden), nn.ReLU(), Dropout(c.mlp_dropout, fast=c.fast_dropout)]
            width = hidden
        self.head = nn.Sequential(*layers, nn.Linear(width, c.n_classes))

    def tokens(self, categorical: torch.Tensor, continuous: torch.Tensor | None = None) -> torch.Tensor:
        """The input tokens (batch, tokens, d_model): categorical columns, then (numeric="tokens")
        the continuous ones."""
        x = self.embedding(categorical)
        if self.config.numeric == "tokens" and self.numeric_embedding is not None:
            x = torch.cat([x, self.numeric_embedding(continuous)], dim=1)
        return x

    def contextualize(self, categorical: torch.Tensor, continuous: torch.Tensor | None = None, *,
                      return_weights: bool = False) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """The contextual embeddings (batch, tokens, d_model) of the column tokens (see tokens; the
        [CLS] token, when there is one, first) and, with return_weights, every block's attention
        weights (which tokens each token reads; else None)."""
        x = self.tokens(categorical, continuous)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1)
        weights = []
        for block in self.blocks:
            x, w = block(x, return_weights=return_weights)
            weights.append(w)
        return x, weights if return_weights else None

    def forward(self, categorical: torch.Tensor, continuous: torch.Tensor, *, return_weights: bool = False
                ) -> ModelOutput:
        """categorical (batch, columns) int, continuous (batch, n_continuous) -> logits (batch, n_classes);
        hidden_states: the column tokens' contextual embeddings (batch, tokens, d_model), [CLS] left out."""
        x, attentions = self.contextualize(categorical, continuous, return_weights=return_weights)
        if self.cls_token is not None:
            return ModelOutput(logits=self.head(x[:, 0]), hidden_states=x[:, 1:], attentions=attentions)
        features = [x.flatten(1)]
        if self.config.numeric == "concat" and self.config.n_continuous:
            encoded = self.continuous_norm(continuous) if self.numeric_embedding is None \
                else self.numeric_embedding(continuous).flatten(1)
            features.append(encoded)
        return ModelOutput(logits=self.head(torch.cat(features, dim=-1)), hidden_states=x, attentions=attentions)
