"""The CPU-tuned path of `MultiHeadAttention` (attention.py), taken while
`MultiHeadAttention.fast_path` is True (the default): the same attention as the reading copy in
`MultiHeadAttention.forward`, computed in fewer passes over the scores.

- torch's fused kernel (`F.scaled_dot_product_attention`) whenever nobody asks for the weights,
  and its own causal mask where that is the only mask;
- training's queries, keys and values of x in one wide product instead of three narrow ones
  (with all three projections, projections="qkv");
- an all-real padding mask left out (masking costs a pass over every score);
- with dropout on the CPU, the scores computed explicitly so that the cheap dropout masks of
  models/dropout.py apply (the fused kernel would draw torch's costly ones): the scale and the mask
  added inside the score product (`baddbmm`), and, for long causal sequences, the first half of
  the queries multiplied by the first half of the keys only (causal halves).

`benchmarks/causal_halves.py` measures where causal halves start to pay, which sets
`CAUSAL_HALVES_MIN_LENGTH`. Nothing here changes what is computed, only how: tests/test_attention.py
checks outputs and gradients against the reading path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.models.dropout import dropout as masked_dropout

if TYPE_CHECKING:
    from transformer_lab.models.attention import KVCache, MultiHeadAttention

# causal attention without a cache computes in halves from this length on: below it the extra
# products cost more than the quarter of the scores they skip
CAUSAL_HALVES_MIN_LENGTH = 64


def _no_padding(key_padding_mask: torch.Tensor) -> bool:
    """True where every key is a real token, so the mask can be left out (as `transformers` drops an
    all-ones mask): masking costs a pass over every score. Checked on the CPU only, where the check
    is a few microseconds; on a GPU it would wait for the device."""
    return (key_padding_mask.device.type == "cpu" and not torch.compiler.is_compiling()
            and bool(key_padding_mask.all()))


def _score_bias(mask: torch.Tensor, batch: int, n_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True = may attend) as an additive bias, 0 or -inf, that broadcasts against the
    (batch * n_heads, queries, keys) scores. Added inside their product (baddbmm's beta), it takes no
    pass of its own, where filling the scores in place costs one forward and several backward (autograd
    copies the gradient of an in-place change to a view); masked scores get no gradient either way."""
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    bias = bias[(None,) * (4 - bias.dim())]
    if bias.shape[0] == 1 and bias.shape[1] == 1:
        return bias[0, 0]  # the same for every row and head: (queries or 1, keys or 1)
    queries, keys = bias.shape[2:]
    return bias.broadcast_to(batch, n_heads, queries, keys).reshape(batch * n_heads, queries, keys)


def project_qkv(attn: MultiHeadAttention, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Queries, keys and values of x in one matmul (one wide product runs faster than three
    narrow ones); the weights stay three modules, so state dicts keep their names."""
    weight = torch.cat([attn.q.weight, attn.k.weight, attn.v.weight])
    bias = None if attn.q.bias is None else torch.cat([attn.q.bias, attn.k.bias, attn.v.bias])
    return F.linear(x, weight, bias).split(attn.q.out_features, dim=-1)


def explicit_attention(attn: MultiHeadAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       mask: torch.Tensor | None, dropout_p: float, *,
                       causal_halves: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T * attn.scale, masked) v with the probabilities in hand, for the cheap dropout
    masks and for inspection: (batch, length, d_model) and the probabilities (None with causal_halves).

    The product scales (alpha) and masks (the bias, beta) as it multiplies, sparing passes over q
    and the scores forward and backward. causal_halves: the first half of the queries sees only
    the first half of the keys, so a quarter of the scores (masked anyway) is never computed,
    softmaxed, dropped out or multiplied."""
    batch, _, length, d_head = q.shape
    heads = batch * attn.n_heads
    q, k, v = (t.reshape(heads, -1, d_head) for t in (q, k, v))
    keys = k.shape[1]
    bias = None if mask is None else _score_bias(mask, batch, attn.n_heads, q.dtype)
    half = length // 2
    spans = ((0, half, half), (half, length, keys)) if causal_halves else ((0, length, keys),)
    parts, weights = [], None
    for (start, end, seen), q_part in zip(spans, q.split([end - start for start, end, _ in spans], dim=1)):
        k_seen, v_seen = (k, v) if seen == keys else (k[:, :seen], v[:, :seen])
        if bias is None:  # beta=0: the product alone, its placeholder input never read
            rows, beta = q.new_empty(1, 1), 0
        else:
            rows, beta = (bias[..., start:end, :seen] if bias.shape[-2] > 1 else bias[..., :seen]), 1
        scores = torch.baddbmm(rows, q_part, k_seen.transpose(1, 2), beta=beta, alpha=attn.scale)
        probabilities = scores.softmax(dim=-1)
        if not causal_halves:
            # the weights handed back are the very tensor the values are weighted by, so that a caller
            # who keeps their gradient (studies/probes.py) gets it
            weights = probabilities.view(batch, attn.n_heads, length, keys)
            probabilities = weights.view(heads, length, keys)
        attended = masked_dropout(probabilities, dropout_p, attn.training, fast=attn.fast_dropout) @ v_seen
        parts.append(attended.view(batch, attn.n_heads, end - start, d_head).transpose(1, 2))
    # heads merged as the parts are joined: one copy, into (batch, length, heads, d_head)
    attended = torch.cat(parts, dim=1).view(batch, length, attn.n_heads * d_head)
    return attended, weights


def forward(attn: MultiHeadAttention, x: torch.Tensor, *, key_padding_mask: torch.Tensor | None,
            is_causal: bool, return_weights: bool, rotary: nn.Module | None, cache: KVCache | None,
            attn_mask: torch.Tensor | None, context: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """MultiHeadAttention.forward's result, by the fastest way the arguments allow."""
    batch, length, d_model = x.shape
    # decoding a token at a time (eval), copying the weights together would cost more than it saves
    fused = attn.training and context is None and attn.projections == "qkv"
    projected = project_qkv(attn, x) if fused else None
    q, k, v, offset = attn._queries_keys_values(x, context=context, rotary=rotary, cache=cache, projected=projected)
    padding = None if key_padding_mask is None or _no_padding(key_padding_mask) else key_padding_mask
    # one new query after a cache may see every key: no causal mask needed
    mask = attn._mask(padding, attn_mask, is_causal and length > 1, length, k.shape[2], offset, x.device)

    dropout_p = attn.dropout if attn.training else 0.0
    # The fused kernel does not expose its probabilities, and on CPU with dropout it takes its
    # math path with torch's costly masks anyway: both are computed explicitly instead.
    cheap_masks = dropout_p > 0 and attn.fast_dropout and x.device.type == "cpu"
    if return_weights or cheap_masks:
        causal_halves = is_causal and offset == 0 and not return_weights and length >= CAUSAL_HALVES_MIN_LENGTH
        attended, weights = explicit_attention(attn, q, k, v, mask, dropout_p, causal_halves=causal_halves)
        return attn.project_out(attended), weights if return_weights else None
    scale = None if attn.scaled else 1.0  # None: the kernel's own 1/sqrt(d_head)
    if is_causal and length > 1 and key_padding_mask is None and attn_mask is None and offset == 0:
        # a plain causal mask: let the kernel build it (its fast path skips the masked half)
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale)
    else:
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    attended = attended.transpose(1, 2).reshape(batch, length, d_model)
    return attn.project_out(attended), None
