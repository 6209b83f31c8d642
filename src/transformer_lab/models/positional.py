"""Positional information added to token embeddings, shared by every model."""

from __future__ import annotations

import math

import torch
from torch import nn


class LearnedPositionalEmbedding(nn.Module):
    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.embedding = nn.Embedding(max_len, d_model)

    def forward(self, length: int, offset: int = 0) -> torch.Tensor:
        """Vectors of positions offset .. offset + length - 1."""
        return self.embedding(torch.arange(offset, offset + length, device=self.embedding.weight.device))


SINUSOIDAL_LAYOUTS = ("interleaved", "halves")


class SinusoidalPositionalEncoding(nn.Module):
    """The fixed sin/cos table of "Attention Is All You Need" (section 3.5).

    layout="interleaved" is the paper's: dimension 2i holds sin(pos / 10000^(2i/d)), 2i + 1 its
    cosine. layout="halves" puts every sine first and every cosine after them (fairseq's and
    Marian's tables), the same frequencies: what converted Marian checkpoints expect."""

    def __init__(self, max_len: int, d_model: int, layout: str = "interleaved"):
        super().__init__()
        if layout not in SINUSOIDAL_LAYOUTS:
            raise ValueError(f"sinusoidal layout {layout!r}; expected one of {', '.join(SINUSOIDAL_LAYOUTS)}")
        # float64, then rounded once: sin(pos * w) in float32 is off by ~pos * 1e-7 at long positions
        position = torch.arange(max_len, dtype=torch.float64)[:, None]
        frequency = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
        sines, cosines = torch.sin(position * frequency), torch.cos(position * frequency[: d_model // 2])
        table = torch.zeros(max_len, d_model, dtype=torch.float64)
        if layout == "interleaved":
            table[:, 0::2], table[:, 1::2] = sines, cosines
        else:
            half = sines.shape[1]
            table[:, :half], table[:, half:] = sines, cosines
        self.register_buffer("table", table.float(), persistent=False)

    def forward(self, length: int, offset: int = 0) -> torch.Tensor:
        """Vectors of positions offset .. offset + length - 1."""
        return self.table[offset:offset + length]


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al., 2021): instead of adding a position vector to the input, rotate each
    query and key by an angle proportional to its position, a different frequency per pair of
    dimensions. The dot product of a query at m and a key at n then depends only on n - m.

    Dimensions are paired as (i, i + d/2) (the "rotate half" layout of GPT-NeoX and LLaMA).
    Applied to (batch, heads, length, d_head) tensors inside attention; nothing is added to
    the embeddings, so the model has no position table and no maximum length of its own.
    """

    def __init__(self, d_head: int, base: float = 10000.0):
        super().__init__()
        if d_head % 2:
            raise ValueError(f"rotary embeddings need an even head size, got {d_head}")
        inverse_frequency = base ** (-torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)
        self.register_buffer("inverse_frequency", inverse_frequency, persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x: (..., length, d_head) at positions offset .. offset + length - 1."""
        positions = torch.arange(offset, offset + x.shape[-2], device=x.device, dtype=torch.float32)
        angles = positions[:, None] * self.inverse_frequency  # (length, d_head / 2)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        first, second = x.chunk(2, dim=-1)
        return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


# what a model may say about positions: a table added to the embeddings (learned, sinusoidal),
# rotary queries and keys (rope), or nothing at all (none: the encoder is then permutation-equivariant)
POSITIONS = ("learned", "sinusoidal", "rope", "none")


def positional_encoding(kind: str, max_len: int, d_model: int, *, layout: str = "interleaved") -> nn.Module:
    """The table added to the embeddings, kind "learned" or "sinusoidal" (rope and none have none).
    layout: the sinusoidal table's (SinusoidalPositionalEncoding)."""
    if kind == "learned":
        return LearnedPositionalEmbedding(max_len, d_model)
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(max_len, d_model, layout)
    raise ValueError(f"unknown positional encoding {kind!r}; expected 'learned' or 'sinusoidal'")
