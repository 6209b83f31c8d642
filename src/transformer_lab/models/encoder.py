"""The transformer encoder as the lecture builds it, and the joint intent + slot model.

    token ids ─► token embedding (+ the word's character-CNN vector) + positional encoding
              ─► N TransformerBlocks ─► states
    states[:, 0]  ([CLS]) ─► intent head
    states[:, 1:] (words) ─► slot head (hidden ReLU layer, then linear) [─► CRF: Viterbi decoding]

Options: char_features (ELMo's character encoder, models/elmo.py: a word the vocabulary lacks
is still spelt out, not one shared [UNK] vector), elmo (a frozen pre-trained ELMo biLM whose
layers, mixed by the task's own ScalarMix weights, join each token's embedding: the ELMo paper's
feature-based use), crf (a linear-chain CRF over the slot scores, models/crf.py: BIO
transitions learnt, the best tag sequence decoded).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

from transformer_lab.models.dropout import Dropout
from transformer_lab.models.blocks import TransformerBlock, check_ablation_options
from transformer_lab.models.crf import LinearChainCRF
from transformer_lab.models.elmo import END_OF_SENTENCE, CharacterEncoder, ElmoBiLM, ElmoConfig, ScalarMix, spelling
from transformer_lab.models.elmo import SIZES as CHARACTER_ENCODER_SIZES
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.models.positional import POSITIONS, RotaryEmbedding, positional_encoding


@dataclass
class EncoderConfig:
    vocab_size: int = 1000
    max_len: int = 128
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int | None = None  # None = 4 * d_model, as in the 2017 paper
    dropout: float = 0.1
    fast_dropout: bool = True  # cheap CPU dropout masks (models/dropout.py); false: torch's own
    activation: str = "relu"
    norm_first: bool = False
    positional: str = "learned"  # learned | sinusoidal | rope (rotary, on queries and keys) | none
    pad_id: int = 0
    char_features: bool = False  # each word's character-CNN vector joins its embedding (inputs need `characters`)
    char_combine: str = "add"    # add | concat (concatenated, then projected back to d_model)
    char_size: str = "tiny"      # the character encoder's filters and highway layers (models/elmo.py SIZES)
    elmo: dict | None = None     # a frozen ELMo biLM's ElmoConfig: its mixed layers join each embedding
    # ablations (models/blocks.py): fewer attention projections, unscaled scores, no residuals, no LayerNorms
    attention_projections: str = "qkv"  # qkv | qv (K = Q) | kv (Q = K) | v (Q = K = V) | none (softmax(X X^T) X)
    attention_scaled: bool = True  # false: scores Q K^T without the 1/sqrt(d_head)
    residual: bool = True          # false: x = sublayer(x), no skip connections
    layer_norm: bool = True        # false: every LayerNorm (the final one too) an identity

    def __post_init__(self):
        if self.positional not in POSITIONS:
            raise ValueError(f"model.positional={self.positional!r}: one of {', '.join(POSITIONS)}")
        check_ablation_options(attention_projections=self.attention_projections,
                               attention_scaled=self.attention_scaled, residual=self.residual,
                               layer_norm=self.layer_norm)
        if self.char_combine not in ("add", "concat"):
            raise ValueError(f"model.char_combine={self.char_combine!r}: add or concat")
        if self.char_size not in CHARACTER_ENCODER_SIZES:
            raise ValueError(f"model.char_size={self.char_size!r}: one of {', '.join(CHARACTER_ENCODER_SIZES)}")
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
        self.char_encoder = self.char_merge = None
        if config.char_features:
            filters, n_highway, _, _ = CHARACTER_ENCODER_SIZES[config.char_size]
            self.char_encoder = CharacterEncoder(filters, n_highway, config.d_model)
            if config.char_combine == "concat":
                self.char_merge = nn.Linear(2 * config.d_model, config.d_model)
        self.elmo = self.elmo_mix = self.elmo_projection = None
        if config.elmo is not None:
            elmo_config = ElmoConfig(**config.elmo)
            self.elmo = ElmoBiLM(elmo_config).requires_grad_(False).eval()
            self.elmo_mix = ScalarMix(elmo_config.n_layers + 1)
            width = (2 if elmo_config.bidirectional else 1) * elmo_config.projection_dim
            self.elmo_projection = nn.Linear(width, config.d_model)
        table = config.positional in ("learned", "sinusoidal")
        self.position = positional_encoding(config.positional, config.max_len, config.d_model) if table else None
        self.rotary = RotaryEmbedding(config.d_model // config.n_heads) if config.positional == "rope" else None
        self.dropout = Dropout(config.dropout, fast=config.fast_dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(config.d_model, config.n_heads, config.d_ff, dropout=config.dropout,
                             activation=config.activation, norm_first=config.norm_first,
                             fast_dropout=config.fast_dropout, attention_projections=config.attention_projections,
                             attention_scaled=config.attention_scaled, residual=config.residual,
                             layer_norm=config.layer_norm)
            for _ in range(config.n_layers)
        )
        # Pre-norm blocks leave the residual stream un-normalised; close it with a final LayerNorm.
        final_norm = config.norm_first and config.layer_norm
        self.final_norm = nn.LayerNorm(config.d_model) if final_norm else nn.Identity()

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
        characters: torch.Tensor | None = None, return_weights: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """input_ids, attention_mask: (batch, length); mask True/1 = real token. characters (batch,
        length, max_word_chars): each token's spelling (models/elmo.py), with char_features or elmo.

        Returns hidden states (batch, length, d_model) and, if asked, each layer's attention weights (else None).
        """
        length = input_ids.shape[1]
        if length > self.config.max_len:
            raise ValueError(f"sequence of {length} tokens exceeds max_len={self.config.max_len}")
        # Scaled as in the 2017 paper (section 3.4).
        x = self.token_embedding(input_ids) * math.sqrt(self.config.d_model)
        if self.char_encoder is not None:
            if characters is None:
                raise ValueError("model.char_features=true: the inputs need `characters` (each word's spelling)")
            spelt = self.char_encoder(characters)
            x = x + spelt if self.char_merge is None else self.char_merge(torch.cat([x, spelt], dim=-1))
        if self.elmo is not None:
            if characters is None or attention_mask is None:
                raise ValueError("model.elmo: the inputs need `characters` and `attention_mask`")
            x = x + self.elmo_projection(self.elmo_mix(self.elmo_layers(characters, attention_mask)))
        if self.position is not None:
            x = x + self.position(length)
        x = self.dropout(x)
        all_weights = []
        for block in self.blocks:
            x, weights = block(x, key_padding_mask=attention_mask, return_weights=return_weights, rotary=self.rotary)
            if return_weights:
                all_weights.append(weights)
        return self.final_norm(x), all_weights if return_weights else None

    @torch.no_grad()
    def elmo_layers(self, characters: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The frozen biLM's layers (L + 1, batch, length, width) at the input positions, the
        sequence read as it was trained: the first token's <S> marker, the words, then </S>."""
        batch, length, width = characters.shape
        if width != self.elmo.config.max_word_chars:
            raise ValueError(f"characters are {width} wide; the ELMo model reads {self.elmo.config.max_word_chars}")
        lengths = attention_mask.sum(1)
        end = torch.tensor(spelling([END_OF_SENTENCE], width), dtype=characters.dtype, device=characters.device)
        closed = torch.cat([characters, characters.new_zeros(batch, 1, width)], dim=1)
        closed[torch.arange(batch), lengths] = end
        return self.elmo(closed, lengths + 1).logits[:, :, :length]

    def train(self, mode: bool = True) -> TransformerEncoder:
        super().train(mode)
        if self.elmo is not None:
            self.elmo.eval()  # frozen features: the biLM's dropout stays off
        return self


@dataclass
class JointIntentSlotConfig(EncoderConfig):
    n_intents: int = 2
    n_slots: int = 2
    slot_hidden: int | None = None  # width of the slot head's hidden ReLU layer; None = d_model
    crf: bool = False  # a linear-chain CRF over the slot scores: learnt tag transitions, Viterbi decoding


class JointIntentSlotModel(nn.Module):
    """Input: [CLS] w1 ... wn. Intent from the [CLS] state, one slot tag per word."""

    def __init__(self, config: JointIntentSlotConfig):
        super().__init__()
        self.config = config
        self.encoder = TransformerEncoder(config)
        hidden = config.slot_hidden or config.d_model
        self.intent_head = nn.Linear(config.d_model, config.n_intents)
        self.slot_head = nn.Sequential(
            nn.Linear(config.d_model, hidden), nn.ReLU(), Dropout(config.dropout, fast=config.fast_dropout),
            nn.Linear(hidden, config.n_slots),
        )
        self.crf = LinearChainCRF(config.n_slots) if config.crf else None

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding (as Hugging Face models name it): what task.embeddings initialises."""
        return self.encoder.token_embedding

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
        characters: torch.Tensor | None = None, return_weights: bool = False
    ) -> ModelOutput:
        """logits: intent logits (batch, n_intents); slot_logits (batch, length - 1, n_slots): the
        per-word tag scores (the CRF's emissions, with crf)."""
        states, attentions = self.encoder(input_ids, attention_mask, characters=characters,
                                          return_weights=return_weights)
        return ModelOutput(logits=self.intent_head(states[:, 0]), slot_logits=self.slot_head(states[:, 1:]),
                           hidden_states=states, attentions=attentions)
