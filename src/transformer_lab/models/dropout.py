"""Dropout with cheap masks on CPU, for every model's blocks and embeddings.

torch's CPU dropout draws one Bernoulli sample per element (`bernoulli_`), which profiles at a
fifth of a BERT training step on two cores. Here one 64-bit random draw makes the masks of four
elements: each 16-bit slice is kept when it is at least the drop threshold, so an element is
dropped with probability round(65536 p) / 65536 (0.100006 for p = 0.1) and the kept ones are
scaled by 65536 / (65536 - threshold) so that the expected value is unchanged.

The masks come from torch's generator, so `torch.manual_seed` makes them repeatable, but they are
a different random stream from `nn.Dropout`'s: a config's `fast_dropout: false` restores torch's
own. On a GPU, torch's fused dropout kernel is already cheap, so the fast path is CPU only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_SLICE = 65536  # values a 16-bit slice of a random draw can take


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device,
              dtype: torch.dtype = torch.bool) -> tuple[torch.Tensor, float]:
    """A mask of `shape` keeping each element with probability 1 - p (to 1/65536): True/False, or
    1/0 in a float dtype (written straight from the comparison, with no conversion pass); and the
    scale that keeps the expected value unchanged."""
    n = math.prod(shape)
    threshold = round(_SLICE * p)
    # random_(from, to) draws uniformly in [from, to): every bit pattern but the largest, which
    # shifts no 16-bit slice's probability by more than 2^-48
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), 2**63 - 1)
    keep = torch.empty(shape, dtype=dtype, device=device)
    torch.ge(bits.view(torch.int16)[:n].view(shape), threshold - _SLICE // 2, out=keep)
    return keep, _SLICE / (_SLICE - threshold)


def dropout(x: torch.Tensor, p: float, training: bool = True, *, fast: bool = True) -> torch.Tensor:
    """F.dropout, with cheap masks when `fast` and x is on the CPU."""
    if not training or p == 0.0:
        return x
    if not fast or x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training)
    if x.dtype in (torch.float32, torch.float64):
        # a mask holding 0 or the scale: one multiply forward and one backward (autograd keeps the
        # mask, not x), where a boolean mask is converted to floats at every use
        keep, scale = keep_mask(x.shape, p, x.device, x.dtype)
        return x * keep.mul_(scale)
    # bf16 and fp16 cannot hold the scale exactly (1/0.9 -> 1.109): scale the product, as torch does
    keep, scale = keep_mask(x.shape, p, x.device)
    return x * keep * scale


class Dropout(nn.Dropout):
    """nn.Dropout with the cheap CPU masks (`fast=True`); no parameters, so state dicts are those
    of nn.Dropout."""

    def __init__(self, p: float = 0.5, *, fast: bool = True):
        super().__init__(p)
        self.fast = fast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training, fast=self.fast)

    def extra_repr(self) -> str:
        return f"p={self.p}, fast={self.fast}"
