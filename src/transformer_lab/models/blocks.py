"""The transformer block every model is built from: attention + feed-forward, each
wrapped in a residual connection and LayerNorm (both of which an ablation can leave out)."""

from __future__ import annotations

import torch
from torch import nn

from transformer_lab.models.attention import PROJECTIONS, KVCache, MultiHeadAttention
from transformer_lab.models.dropout import Dropout

# gelu_tanh: the tanh approximation that GPT-1 and GPT-2 were trained with ("gelu_new" in transformers)
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "gelu_tanh": lambda: nn.GELU(approximate="tanh")}


def check_ablation_options(*, attention_projections: str, attention_scaled: bool, residual: bool,
                           layer_norm: bool) -> None:
    """The block options a model config passes on (EncoderConfig, GPTConfig), checked as the config is
    made: one clear error naming the field, rather than a failure deep inside the model."""
    if attention_projections not in PROJECTIONS:
        raise ValueError(f"attention_projections={attention_projections!r}; expected one of {', '.join(PROJECTIONS)}")
    for name, value in (("attention_scaled", attention_scaled), ("residual", residual), ("layer_norm", layer_norm)):
        if not isinstance(value, bool):
            raise ValueError(f"{name}={value!r}; expected true or false")  # noqa: TRY004 (a config value)


class FeedForward(nn.Module):
    """Position-wise feed-forward: the same two-layer MLP applied to every position."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0, bias: bool = True,
                 fast_dropout: bool = True):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; expected one of {sorted(ACTIVATIONS)}")
        self.fc_in = nn.Linear(d_model, d_ff, bias=bias)
        self.act = ACTIVATIONS[activation]()
        self.fc_out = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = Dropout(dropout, fast=fast_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc_out(self.act(self.fc_in(x))))


class MixtureOfExperts(nn.Module):
    """A sparse feed-forward (Shazeer et al., 2017; Switch Transformer, Fedus et al., 2021): E
    expert feed-forwards and a learned router that sends every token to its top-k experts.

    The output is the router-weighted sum of the chosen experts' outputs: with k = 1 the
    weight is the router probability itself (Switch), with k = 2 the two probabilities
    renormalised to sum to 1. After each forward `aux_loss` holds the load-balancing loss
    E * sum_e f_e * P_e (f_e: share of assignments to expert e, P_e: mean router probability),
    which is 1 when the load is uniform; the task adds it to the loss with a small weight.
    """

    def __init__(self, d_model: int, d_ff: int, n_experts: int = 4, top_k: int = 2, activation: str = "relu",
                 dropout: float = 0.0, bias: bool = True, fast_dropout: bool = True):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"moe_top_k={top_k} must be between 1 and n_experts={n_experts}")
        self.top_k = top_k
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(d_model, d_ff, activation, dropout, bias, fast_dropout)
                                     for _ in range(n_experts))
        self.aux_loss = torch.zeros(())
        self.last_choice: torch.Tensor | None = None  # (tokens, top_k) expert ids, for inspection

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        probabilities = self.router(tokens).softmax(dim=-1)
        gate, chosen = probabilities.topk(self.top_k, dim=-1)
        if self.top_k > 1:
            gate = gate / gate.sum(dim=-1, keepdim=True)
        n_experts = len(self.experts)
        assignments = torch.zeros_like(probabilities).scatter_(1, chosen, 1.0)
        self.aux_loss = n_experts * (assignments.mean(0) / self.top_k * probabilities.mean(0)).sum()
        self.last_choice = chosen.detach()

        out = torch.zeros_like(tokens)
        for index, expert in enumerate(self.experts):
            rows, slot = (chosen == index).nonzero(as_tuple=True)
            if rows.numel():
                out.index_add_(0, rows, gate[rows, slot, None] * expert(tokens[rows]))
        return out.view_as(x)


class TransformerBlock(nn.Module):
    """norm_first=False is the post-norm block of the 2017 paper (and BERT);
    norm_first=True is the pre-norm block of GPT-2 and ViT, which trains more stably deep.

    cross_attention=True makes it the 2017 paper's decoder block: masked self-attention, then
    attention over the encoder's states (`context`), then the feed-forward, each a residual
    sub-layer normalised the same way (post- or pre-norm).

    Ablations: residual=False drops the skip connections (x = sublayer(x)), layer_norm=False makes
    every LayerNorm an identity; attention_projections and attention_scaled are MultiHeadAttention's
    projections and scaled."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        ffn: str = "dense",
        n_experts: int = 4,
        moe_top_k: int = 2,
        bias: bool = True,
        cross_attention: bool = False,
        fast_dropout: bool = True,
        attention_projections: str = "qkv",
        attention_scaled: bool = True,
        residual: bool = True,
        layer_norm: bool = True,
    ):
        """The three sizes by position, every option by name (so that adding one shifts no caller).
        ffn: "dense" (one feed-forward) or "moe" (n_experts of them, each token routed to moe_top_k).
        bias=False drops the additive biases of every linear layer and LayerNorm.
        fast_dropout: cheap dropout masks on CPU (models/dropout.py); False for torch's own."""
        super().__init__()
        self.norm_first = norm_first
        self.residual = residual
        attention = {"dropout": dropout, "bias": bias, "fast_dropout": fast_dropout,
                     "projections": attention_projections, "scaled": attention_scaled}

        def norm() -> nn.Module:
            return nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias) if layer_norm else nn.Identity()

        self.attn = MultiHeadAttention(d_model, n_heads, **attention)
        self.ln1 = norm()
        if ffn == "dense":
            self.mlp = FeedForward(d_model, d_ff, activation, dropout, bias, fast_dropout)
        elif ffn == "moe":
            self.mlp = MixtureOfExperts(d_model, d_ff, n_experts, moe_top_k, activation, dropout, bias, fast_dropout)
        else:
            raise ValueError(f"ffn={ffn!r}; expected 'dense' or 'moe'")
        self.ln2 = norm()
        self.cross_attn = self.ln_cross = None
        if cross_attention:
            self.cross_attn = MultiHeadAttention(d_model, n_heads, **attention)
            self.ln_cross = norm()
        self.dropout = Dropout(dropout, fast=fast_dropout)

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
        context_padding_mask: torch.Tensor | None = None,
        cross_cache: KVCache | None = None,
        keys_from: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None]:
        """x: (batch, length, d_model); the other arguments are MultiHeadAttention's, by name.
        context, context_padding_mask, cross_cache (cross-attention blocks only): the encoder's
        states (batch, source length, d_model), its padding (True = real token) and the cache
        that keeps their keys and values between decoding steps.
        keys_from: the whole sequence (batch, length, d_model) when x holds only some of its
        positions (batch, rows, d_model): those rows' queries attend over every position of
        keys_from (key_padding_mask masks its keys), and only those rows are computed, the rest
        of the block being per position. A last layer whose other positions no loss reads.
        Returns the new states and the attention weights (None unless return_weights); a block
        with cross-attention returns the pair (self-attention weights, cross-attention weights)."""
        if (context is None) != (self.cross_attn is None):
            raise ValueError("a context goes with a cross-attention block, and only with one")
        options = dict(key_padding_mask=key_padding_mask, is_causal=is_causal, return_weights=return_weights,
                       rotary=rotary, cache=cache, attn_mask=attn_mask)
        if keys_from is not None:  # the same projections, keys and values from the whole sequence
            options["context"] = self.ln1(keys_from) if self.norm_first else keys_from
        cross_options = dict(key_padding_mask=context_padding_mask, return_weights=return_weights,
                             cache=cross_cache, context=context)
        cross_weights = None
        if self.norm_first:
            attended, weights = self.attn(self.ln1(x), **options)
            x = self._add(x, self.dropout(attended))
            if context is not None:
                attended, cross_weights = self.cross_attn(self.ln_cross(x), **cross_options)
                x = self._add(x, self.dropout(attended))
            x = self._add(x, self.mlp(self.ln2(x)))
        else:
            attended, weights = self.attn(x, **options)
            x = self.ln1(self._add(x, self.dropout(attended)))
            if context is not None:
                attended, cross_weights = self.cross_attn(x, **cross_options)
                x = self.ln_cross(self._add(x, self.dropout(attended)))
            x = self.ln2(self._add(x, self.mlp(x)))
        if context is not None and return_weights:
            return x, (weights, cross_weights)
        return x, weights

    def _add(self, x: torch.Tensor, sublayer_output: torch.Tensor) -> torch.Tensor:
        """The residual connection x + sublayer(x), or the sub-layer's output alone without one."""
        return x + sublayer_output if self.residual else sublayer_output
