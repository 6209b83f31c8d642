"""The transformer block every model is built from: attention + feed-forward, each
wrapped in a residual connection and LayerNorm."""

from __future__ import annotations

import torch
from torch import nn

from transformer_lab.models.attention import MultiHeadSelfAttention

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


class FeedForward(nn.Module):
    """Position-wise feed-forward: the same two-layer MLP applied to every position."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; expected one of {sorted(ACTIVATIONS)}")
        self.fc_in = nn.Linear(d_model, d_ff)
        self.act = ACTIVATIONS[activation]()
        self.fc_out = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc_out(self.act(self.fc_in(x))))


class TransformerBlock(nn.Module):
    """norm_first=False is the post-norm block of the 2017 paper (and BERT);
    norm_first=True is the pre-norm block of GPT-2 and ViT, which trains more stably deep."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
    ):
        super().__init__()
        self.norm_first = norm_first
        self.attn = MultiHeadSelfAttention(d_model, n_heads, dropout=dropout)
        self.ln1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.mlp = FeedForward(d_model, d_ff, activation, dropout)
        self.ln2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        return_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.norm_first:
            attended, weights = self.attn(self.ln1(x), key_padding_mask, is_causal, return_weights)
            x = x + self.dropout(attended)
            x = x + self.mlp(self.ln2(x))
        else:
            attended, weights = self.attn(x, key_padding_mask, is_causal, return_weights)
            x = self.ln1(x + self.dropout(attended))
            x = self.ln2(x + self.mlp(x))
        return x, weights
