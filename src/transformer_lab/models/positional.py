"""Positional information added to token embeddings, shared by every model."""

from __future__ import annotations

import math

import torch
from torch import nn


class LearnedPositionalEmbedding(nn.Module):
    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.embedding = nn.Embedding(max_len, d_model)

    def forward(self, length: int) -> torch.Tensor:
        return self.embedding(torch.arange(length, device=self.embedding.weight.device))


class SinusoidalPositionalEncoding(nn.Module):
    """The fixed sin/cos table of "Attention Is All You Need" (section 3.5)."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        position = torch.arange(max_len, dtype=torch.float32)[:, None]
        frequency = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        table = torch.zeros(max_len, d_model)
        table[:, 0::2] = torch.sin(position * frequency)
        table[:, 1::2] = torch.cos(position * frequency[: d_model // 2])
        self.register_buffer("table", table, persistent=False)

    def forward(self, length: int) -> torch.Tensor:
        return self.table[:length]


def positional_encoding(kind: str, max_len: int, d_model: int) -> nn.Module:
    if kind == "learned":
        return LearnedPositionalEmbedding(max_len, d_model)
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(max_len, d_model)
    raise ValueError(f"unknown positional encoding {kind!r}; expected 'learned' or 'sinusoidal'")
