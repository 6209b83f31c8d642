"""Multi-head attention: the one attention implementation every model uses, self-attention
and (with a `context`) the encoder-decoder cross-attention.

Each head has its own query, key and value projection. They are stored as one
``d_model x d_model`` matrix per role whose rows are split into heads, which is the
same as ``n_heads`` separate ``d_model x d_head`` projections but costs one matmul.

Two options serve the decoder (GPT): rotary position embeddings applied to queries and
keys, and a key/value cache so that generating one more token attends from one new
position instead of recomputing the whole prefix.

Cross-attention (the 2017 Transformer's encoder-decoder attention): queries come from x, keys
and values from `context` (the encoder's states), masked by the source's padding. While
decoding, the context's keys and values are the same at every step: a cache computes them once
per source and hands them back afterwards.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.models.dropout import dropout as masked_dropout


class KVCache:
    """One layer's keys and values of the positions seen so far, (batch, n_heads, length, d_head)."""

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is not None:
            keys, values = torch.cat([self.keys, keys], dim=2), torch.cat([self.values, values], dim=2)
        self.keys, self.values = keys, values
        return keys, values

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep the rows `rows` of the batch, in that order (beam search: each surviving beam
        takes over its parent's keys and values)."""
        if self.keys is not None:
            self.keys, self.values = self.keys.index_select(0, rows), self.values.index_select(0, rows)


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


# causal attention without a cache computes its first half of queries against the first half of keys only
# from this length on: below it the extra products cost more than the quarter of scores they skip
# (`benchmarks/causal_halves.py`: a width-128 layer's forward and backward 0.89x as fast in halves at 16
# positions, 1.00x at 64, 1.10x at 128, 1.27x at 512)
CAUSAL_HALVES_MIN_LENGTH = 64


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 fast_dropout: bool = True):
        """fast_dropout: cheap dropout masks on CPU (models/dropout.py), False for torch's own."""
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q = nn.Linear(d_model, d_model, bias=bias)
        self.k = nn.Linear(d_model, d_model, bias=bias)
        self.v = nn.Linear(d_model, d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = dropout
        self.fast_dropout = fast_dropout

    def _project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Queries, keys and values of x in one matmul (one wide product runs faster than three
        narrow ones); the weights stay three modules, so state dicts keep their names."""
        weight = torch.cat([self.q.weight, self.k.weight, self.v.weight])
        bias = None if self.q.bias is None else torch.cat([self.q.bias, self.k.bias, self.v.bias])
        return F.linear(x, weight, bias).split(self.q.out_features, dim=-1)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.d_head).transpose(1, 2)

    def _explicit_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                            dropout_p: float, *, causal_halves: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """softmax(q k^T / sqrt(d_head), masked) v with the probabilities in hand, for the cheap dropout
        masks and for inspection: (batch, length, d_model) and the probabilities (None with causal_halves).

        The product scales (alpha) and masks (the bias, beta) as it multiplies, sparing passes over q
        and the scores forward and backward. causal_halves: the first half of the queries sees only
        the first half of the keys, so a quarter of the scores (masked anyway) is never computed,
        softmaxed, dropped out or multiplied."""
        batch, _, length, d_head = q.shape
        heads = batch * self.n_heads
        q, k, v = (t.reshape(heads, -1, d_head) for t in (q, k, v))
        keys = k.shape[1]
        bias = None if mask is None else _score_bias(mask, batch, self.n_heads, q.dtype)
        half = length // 2
        spans = ((0, half, half), (half, length, keys)) if causal_halves else ((0, length, keys),)
        parts = []
        for (start, end, seen), q_part in zip(spans, q.split([end - start for start, end, _ in spans], dim=1)):
            k_seen, v_seen = (k, v) if seen == keys else (k[:, :seen], v[:, :seen])
            if bias is None:  # beta=0: the product alone, its placeholder input never read
                rows, beta = q.new_empty(1, 1), 0
            else:
                rows, beta = (bias[..., start:end, :seen] if bias.shape[-2] > 1 else bias[..., :seen]), 1
            scores = torch.baddbmm(rows, q_part, k_seen.transpose(1, 2), beta=beta, alpha=1 / math.sqrt(d_head))
            probabilities = scores.softmax(dim=-1)
            attended = masked_dropout(probabilities, dropout_p, self.training, fast=self.fast_dropout) @ v_seen
            parts.append(attended.view(batch, self.n_heads, end - start, d_head).transpose(1, 2))
        # heads merged as the parts are joined: one copy, into (batch, length, heads, d_head)
        attended = torch.cat(parts, dim=1).view(batch, length, self.n_heads * d_head)
        return attended, None if causal_halves else probabilities.view(batch, self.n_heads, length, keys)

    def forward(
        self,
        x: torch.Tensor,
        *,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        return_weights: bool = False,
        rotary: nn.Module | None = None,
        cache: KVCache | None = None,
        attn_mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (batch, length, d_model); everything else by name, so that a new option cannot
        shift the callers' arguments. key_padding_mask: (batch, keys), True = real token.
        attn_mask: any other boolean mask broadcastable to (batch, n_heads, length, keys), True =
        may attend (e.g. shifted windows that must not mix wrapped-around regions).

        rotary: a RotaryEmbedding to rotate queries and keys by their positions.
        cache: earlier positions' keys and values; x then holds the positions after them, and
        the new keys and values are appended to it.
        context: (batch, keys, d_model), the sequence the keys and values come from
        (cross-attention); key_padding_mask then masks its positions. With a cache, the context's
        keys and values are computed on the first call and reused on every later one.

        Returns the attended values and, if asked, the attention weights
        (batch, n_heads, length, keys) for inspection and plots.
        """
        batch, length, d_model = x.shape
        offset = 0
        if context is not None:
            q = self._split_heads(self.q(x))
            if is_causal or rotary is not None:
                raise ValueError("cross-attention is neither causal nor rotary: its keys are another sequence")
            if cache is not None and cache.keys is not None:
                k, v = cache.keys, cache.values  # the same source: its keys and values were computed once
            else:
                k, v = self._split_heads(self.k(context)), self._split_heads(self.v(context))
                if cache is not None:
                    cache.append(k, v)
        else:
            if self.training:
                q, k, v = (self._split_heads(part) for part in self._project_qkv(x))
            else:  # decoding a token at a time, copying the weights together would cost more than it saves
                q, k, v = (self._split_heads(role(x)) for role in (self.q, self.k, self.v))
            offset = cache.length if cache is not None else 0
            if rotary is not None:
                q, k = rotary(q, offset), rotary(k, offset)
            if cache is not None:
                k, v = cache.append(k, v)

        mask = None
        if key_padding_mask is not None and not _no_padding(key_padding_mask):
            mask = key_padding_mask[:, None, None, :].to(torch.bool)  # broadcast over heads and queries
        if is_causal and length > 1:  # one new query after a cache may see every key: no mask needed
            # query i sits at position offset + i and sees keys 0 .. offset + i
            causal = torch.ones(length, k.shape[2], dtype=torch.bool, device=x.device).tril(diagonal=offset)
            mask = causal if mask is None else mask & causal
        if attn_mask is not None:
            mask = attn_mask if mask is None else mask & attn_mask

        dropout_p = self.dropout if self.training else 0.0
        # The fused kernel does not expose its probabilities, and on CPU with dropout it takes its
        # math path with torch's costly masks anyway: both are computed explicitly instead.
        cheap_masks = dropout_p > 0 and self.fast_dropout and x.device.type == "cpu"
        if return_weights or cheap_masks:
            causal_halves = is_causal and offset == 0 and not return_weights and length >= CAUSAL_HALVES_MIN_LENGTH
            attended, weights = self._explicit_attention(q, k, v, mask, dropout_p, causal_halves=causal_halves)
            return self.out(attended), weights if return_weights else None
        if is_causal and length > 1 and key_padding_mask is None and attn_mask is None and offset == 0:
            # a plain causal mask: let the kernel build it (its fast path skips the masked half)
            attended = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        else:
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        attended = attended.transpose(1, 2).reshape(batch, length, d_model)
        return self.out(attended), None
