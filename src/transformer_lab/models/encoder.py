"""The transformer encoder as the lecture builds it, and the joint intent + slot model.

    token ids ─► token embedding + positional encoding ─► N TransformerBlocks ─► states
    states[:, 0]  ([CLS]) ─► intent head
    states[:, 1:] (words) ─► slot head (hidden ReLU layer, then linear)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

from transformer_lab.models.blocks import TransformerBlock
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.models.positional import RotaryEmbedding, positional_encoding


@dataclass
class EncoderConfig:
    vocab_size: int = 1000
    max_len: int = 128
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int | None = None  # None = 4 * d_model, as in the 2017 paper
    dropout: float = 0.1
    activation: str = "relu"
    norm_first: bool = False
    positional: str = "learned"  # learned | sinusoidal | rope (rotary, on queries and keys)
    pad_id: int = 0

    def __post_init__(self):
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")

    def to_dict(self) -> dict:
        return asdict(self)


class TransformerEncoder(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_id)
        # std d^-1/2, times sqrt(d) in forward: unit-scale tokens, like the unit-scale positions.
        nn.init.normal_(self.token_embedding.weight, std=config.d_model**-0.5)
        with torch.no_grad():
            self.token_embedding.weight[config.pad_id].zero_()
        rope = config.positional == "rope"
        self.position = None if rope else positional_encoding(config.positional, config.max_len, config.d_model)
        self.rotary = RotaryEmbedding(config.d_model // config.n_heads) if rope else None
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(config.d_model, config.n_heads, config.d_ff, dropout=config.dropout,
                             activation=config.activation, norm_first=config.norm_first)
            for _ in range(config.n_layers)
        )
        # Pre-norm blocks leave the residual stream un-normalised; close it with a final LayerNorm.
        self.final_norm = nn.LayerNorm(config.d_model) if config.norm_first else nn.Identity()

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *, return_weights: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """input_ids, attention_mask: (batch, length); mask True/1 = real token.

        Returns hidden states (batch, length, d_model) and, if asked, each layer's attention weights (else None).
        """
        length = input_ids.shape[1]
        if length > self.config.max_len:
            raise ValueError(f"sequence of {length} tokens exceeds max_len={self.config.max_len}")
        # Scaled as in the 2017 paper (section 3.4).
        x = self.token_embedding(input_ids) * math.sqrt(self.config.d_model)
        if self.position is not None:
            x = x + self.position(length)
        x = self.dropout(x)
        all_weights = []
        for block in self.blocks:
            x, weights = block(x, key_padding_mask=attention_mask, return_weights=return_weights, rotary=self.rotary)
            if return_weights:
                all_weights.append(weights)
        return self.final_norm(x), all_weights if return_weights else None


@dataclass
class JointIntentSlotConfig(EncoderConfig):
    n_intents: int = 2
    n_slots: int = 2
    slot_hidden: int | None = None  # width of the slot head's hidden ReLU layer; None = d_model


class JointIntentSlotModel(nn.Module):
    """Input: [CLS] w1 ... wn. Intent from the [CLS] state, one slot tag per word."""

    def __init__(self, config: JointIntentSlotConfig):
        super().__init__()
        self.config = config
        self.encoder = TransformerEncoder(config)
        hidden = config.slot_hidden or config.d_model
        self.intent_head = nn.Linear(config.d_model, config.n_intents)
        self.slot_head = nn.Sequential(
            nn.Linear(config.d_model, hidden), nn.ReLU(), nn.Dropout(config.dropout), nn.Linear(hidden, config.n_slots)
        )

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding (as Hugging Face models name it): what task.embeddings initialises."""
        return self.encoder.token_embedding

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *, return_weights: bool = False
    ) -> ModelOutput:
        """logits: intent logits (batch, n_intents); slot_logits (batch, length - 1, n_slots)."""
        states, attentions = self.encoder(input_ids, attention_mask, return_weights=return_weights)
        return ModelOutput(logits=self.intent_head(states[:, 0]), slot_logits=self.slot_head(states[:, 1:]),
                           hidden_states=states, attentions=attentions)
