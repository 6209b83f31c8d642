"""Figures of a study that need no training: the arguments the course makes on paper, computed."""

from __future__ import annotations

import torch


def dot_product_variance(ax, samples: int = 20_000, seed: int = 0) -> None:
    """The 2017 paper's footnote: for q, k with independent unit-variance components, q.k has mean 0
    and variance d_k, so the softmax of unscaled scores saturates as d_k grows; q.k / sqrt(d_k) has
    variance 1 at every d_k. Sampled variance against d_k, with the two predictions."""
    generator = torch.Generator().manual_seed(seed)
    sizes = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    unscaled, scaled = [], []
    for d_k in sizes:
        q = torch.randn(samples, d_k, generator=generator, dtype=torch.float64)
        k = torch.randn(samples, d_k, generator=generator, dtype=torch.float64)
        dots = (q * k).sum(-1)
        unscaled.append(dots.var().item())
        scaled.append((dots / d_k**0.5).var().item())
    ax.loglog(sizes, unscaled, "o", label="var(q·k), sampled")
    ax.loglog(sizes, sizes, "-", color="grey", linewidth=0.8, label="d_k (prediction)")
    ax.loglog(sizes, scaled, "s", label="var(q·k/√d_k), sampled")
    ax.loglog(sizes, [1.0] * len(sizes), "--", color="grey", linewidth=0.8, label="1 (prediction)")
    ax.set_xlabel("d_k")
    ax.set_ylabel("variance")
    ax.set_title(f"q·k of random unit-variance vectors ({samples:,} pairs each)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
