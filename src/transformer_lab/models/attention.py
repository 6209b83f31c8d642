"""Multi-head attention: the one attention implementation every model uses, self-attention
and (with a `context`) the encoder-decoder cross-attention.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_head), masked) V,   per head, then one output projection

Each head has its own query, key and value projection. They are stored as one
``d_model x d_model`` matrix per role whose rows are split into heads, which is the
same as ``n_heads`` separate ``d_model x d_head`` projections but costs one matmul.

Two options serve ablations. `projections` keeps fewer of the three projections, a kept one
standing in for a dropped one: "qv" (K = Q), "kv" (Q = K), "v" (Q = K = V), or "none", the
parameter-free softmax(X X^T) X with no output projection either. `scaled=False` leaves out the
1/sqrt(d_head) factor.

Two options serve the decoder (GPT): rotary position embeddings applied to queries and
keys, and a key/value cache so that generating one more token attends from one new
position instead of recomputing the whole prefix.

Cross-attention (the 2017 Transformer's encoder-decoder attention): queries come from x, keys
and values from `context` (the encoder's states), masked by the source's padding. While
decoding, the context's keys and values are the same at every step: a cache computes them once
per source and hands them back afterwards.

`MultiHeadAttention.forward` below is the reading copy: the formula, step by step. By default
every call takes the CPU-tuned path of `attention_fast.py` instead, which computes the same thing
(tested equal) in fewer passes; `MultiHeadAttention.fast_path = False` switches it off.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.models import attention_fast


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


# projections: the projection that gives the queries, the keys and the values (None: x itself)
PROJECTIONS = {
    "qkv": ("q", "k", "v"),
    "qv": ("q", "q", "v"),       # K = Q
    "kv": ("k", "k", "v"),       # Q = K
    "v": ("v", "v", "v"),        # Q = K = V
    "none": (None, None, None),  # softmax(X X^T) X: no parameters at all
}


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention in n_heads heads: self-attention, or cross-attention given a context."""

    # False: every call takes the reading path of forward (same results to float rounding, slower on CPU)
    fast_path = True

    def __init__(self, d_model: int, n_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 fast_dropout: bool = True, projections: str = "qkv", scaled: bool = True):
        """fast_dropout: cheap dropout masks on CPU (models/dropout.py), False for torch's own;
        the fast path's choice (the reading path always draws torch's own).
        projections: which of the query, key and value projections exist (PROJECTIONS); the others
        are None, so that the parameter count shows the difference. scaled=False: scores are
        Q K^T, not divided by sqrt(d_head)."""
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if projections not in PROJECTIONS:
            raise ValueError(f"projections={projections!r}; expected one of {', '.join(PROJECTIONS)}")
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.projections = projections
        self.scaled = scaled
        kept = set(PROJECTIONS[projections]) - {None}
        for role in "qkv":  # in this order, so that state dicts keep today's order of names
            setattr(self, role, nn.Linear(d_model, d_model, bias=bias) if role in kept else None)
        self.out = None if projections == "none" else nn.Linear(d_model, d_model, bias=bias)
        self.dropout = dropout
        self.fast_dropout = fast_dropout

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
        if context is not None and (is_causal or rotary is not None):
            raise ValueError("cross-attention is neither causal nor rotary: its keys are another sequence")
        if self.fast_path:
            return attention_fast.forward(self, x, key_padding_mask=key_padding_mask, is_causal=is_causal,
                                          return_weights=return_weights, rotary=rotary, cache=cache,
                                          attn_mask=attn_mask, context=context)
        batch, length, d_model = x.shape
        q, k, v, offset = self._queries_keys_values(x, context=context, rotary=rotary, cache=cache)
        scores = q @ k.transpose(-2, -1)  # (batch, n_heads, length, keys)
        if self.scaled:
            scores = scores / math.sqrt(self.d_head)
        mask = self._mask(key_padding_mask, attn_mask, is_causal, length, k.shape[2], offset, x.device)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))  # weight 0 after the softmax
        weights = scores.softmax(dim=-1)
        attended = F.dropout(weights, self.dropout, self.training) @ v  # (batch, n_heads, length, d_head)
        attended = attended.transpose(1, 2).reshape(batch, length, d_model)  # the heads side by side
        return self.project_out(attended), weights if return_weights else None

    @property
    def scale(self) -> float:
        """What the scores Q K^T are multiplied by."""
        return 1 / math.sqrt(self.d_head) if self.scaled else 1.0

    def project_out(self, attended: torch.Tensor) -> torch.Tensor:
        """The heads side by side (batch, length, d_model) through the output projection, if there is one."""
        return attended if self.out is None else self.out(attended)

    def _project(self, x: torch.Tensor, roles: str) -> tuple[torch.Tensor, ...]:
        """x's queries, keys and/or values (roles: some of "qkv", in order) by their projections; a
        projection shared by two roles is computed once."""
        sources = dict(zip("qkv", PROJECTIONS[self.projections]))
        projected = {}
        for role in roles:
            name = sources[role]
            if name not in projected:
                projected[name] = x if name is None else getattr(self, name)(x)
        return tuple(projected[sources[role]] for role in roles)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, length, d_model) -> (batch, n_heads, length, d_head)."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.d_head).transpose(1, 2)

    def _queries_keys_values(self, x: torch.Tensor, *, context: torch.Tensor | None = None,
                             rotary: nn.Module | None = None, cache: KVCache | None = None,
                             projected: tuple[torch.Tensor, ...] | None = None) -> tuple:
        """Queries from x, keys and values from x (or from context), each split into heads, and
        the position of x's first row. projected: x's queries, keys and values already computed
        (the fast path computes them in one product). With fewer projections, the context's keys
        come by the projection that stands in for the key one (with "qv", the query projection)."""
        if context is not None:
            (q,) = self._project(x, "q")
            q = self._split_heads(q)
            if cache is not None and cache.keys is not None:
                return q, cache.keys, cache.values, 0  # the same source at every step: projected once
            k, v = (self._split_heads(part) for part in self._project(context, "kv"))
            if cache is not None:
                cache.append(k, v)
            return q, k, v, 0
        if projected is None:
            projected = self._project(x, "qkv")
        q, k, v = (self._split_heads(part) for part in projected)
        offset = cache.length if cache is not None else 0  # x follows the cached positions
        if rotary is not None:
            q, k = rotary(q, offset), rotary(k, offset)
        if cache is not None:
            k, v = cache.append(k, v)
        return q, k, v, offset

    @staticmethod
    def _mask(key_padding_mask: torch.Tensor | None, attn_mask: torch.Tensor | None, is_causal: bool,
              length: int, keys: int, offset: int, device: torch.device) -> torch.Tensor | None:
        """Every mask given as one boolean mask (True = may attend) that broadcasts against the
        scores (batch, n_heads, length, keys), or None when nothing is masked."""
        mask = None
        if key_padding_mask is not None:
            mask = key_padding_mask[:, None, None, :].to(torch.bool)  # the same for every head and query
        if is_causal:
            # query i sits at position offset + i and sees keys 0 .. offset + i
            causal = torch.ones(length, keys, dtype=torch.bool, device=device).tril(diagonal=offset)
            mask = causal if mask is None else mask & causal
        if attn_mask is not None:
            mask = attn_mask if mask is None else mask & attn_mask
        return mask
