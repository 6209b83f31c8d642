"""A multimodal transformer: image patches, words and table columns as tokens of one sequence.

A transformer does not care where its tokens come from. Each modality keeps the tokeniser of
its own family and becomes embeddings of one width; a learned modality-type embedding (like
BERT's segment embedding) says which modality a token came from; `[CLS]` goes first and the
shared blocks attend across everything:

    image (C, H, W)  ─► the ViT's P x P patch embedding + patch positions      ─┐
    text  (ids)      ─► token embedding + word positions (padding masked)       ├─► + modality type
    table (columns)  ─► the TabTransformer's per-column embeddings,             │
                        + one projected token per continuous feature            ─┘
      [CLS] + image tokens + text tokens + table tokens ─► L pre-norm blocks ─► LayerNorm
      ─► [CLS] state ─► linear classifier

`modalities` picks any subset, so an image-only model is this same code with one input; a
modality missing in one example (`present`) has all its tokens masked out of attention, not
zero-filled. `fusion="late"` is the baseline: one such encoder per modality (each sees only its
own tokens), their `[CLS]` states concatenated into one MLP classifier, a learned vector standing
in for a missing modality.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import torch
from torch import nn

from transformer_lab.models.dropout import Dropout
from transformer_lab.models.blocks import TransformerBlock
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.models.tab_transformer import CategoricalEmbedding
from transformer_lab.models.vit import PatchEmbedding

MODALITIES = ("image", "text", "table")  # the type-embedding ids, whatever subset a model takes

# name: (layers, hidden, heads); tiny is the CPU default
SIZES = {"tiny": (2, 64, 4), "small": (4, 128, 4), "base": (12, 768, 12)}


@dataclass
class MultimodalConfig:
    modalities: list[str] = field(default_factory=lambda: list(MODALITIES))
    n_classes: int = 2
    fusion: str = "joint"  # joint (one sequence) | late (one encoder per modality, pooled, concatenated)
    size: str = "tiny"  # fills n_layers, d_model, n_heads left at None
    n_layers: int | None = None
    d_model: int | None = None
    n_heads: int | None = None
    d_ff: int | None = None  # None = 4 * d_model
    dropout: float = 0.1
    fast_dropout: bool = True  # cheap CPU dropout masks (models/dropout.py); false: torch's own
    layer_norm_eps: float = 1e-6
    # image: the ViT's patches
    image_size: int = 8
    in_channels: int = 1
    patch_size: int = 2
    # text: word ids, 0 = padding
    vocab_size: int = 2
    max_text_len: int = 16
    pad_id: int = 0
    text_embedding_dim: int | None = None  # None = d_model; a pre-trained start's width (MiniLM 384), projected
    # table: the TabTransformer's categorical indices, continuous features one token each
    cardinalities: list[int] = field(default_factory=list)
    n_continuous: int = 0
    column_embedding_dim: int | None = None  # None = d_model // 8 (the TabTransformer's choice)

    def __post_init__(self):
        self.modalities = [m for m in MODALITIES if m in self.modalities]  # one token order for every subset
        if not self.modalities:
            raise ValueError(f"modalities: choose one or more of {', '.join(MODALITIES)}")
        if self.fusion not in ("joint", "late"):
            raise ValueError(f"fusion={self.fusion!r}; expected 'joint' or 'late'")
        if self.size not in SIZES:
            raise ValueError(f"size={self.size!r}; expected one of {', '.join(SIZES)}")
        layers, hidden, heads = SIZES[self.size]
        self.n_layers = layers if self.n_layers is None else self.n_layers
        self.d_model = hidden if self.d_model is None else self.d_model
        self.n_heads = heads if self.n_heads is None else self.n_heads
        self.d_ff = 4 * self.d_model if self.d_ff is None else self.d_ff
        self.column_embedding_dim = self.d_model // 8 if self.column_embedding_dim is None \
            else self.column_embedding_dim
        self.text_embedding_dim = self.text_embedding_dim or self.d_model
        if "image" in self.modalities and self.image_size % self.patch_size:
            raise ValueError(f"image_size={self.image_size} is not a multiple of patch_size={self.patch_size}")
        if "table" in self.modalities and not (self.cardinalities or self.n_continuous):
            raise ValueError("the table modality needs columns (cardinalities or n_continuous)")

    def token_counts(self) -> dict[str, int]:
        """Tokens per modality (before [CLS]): patches, word positions, table columns."""
        counts = {"image": (self.image_size // self.patch_size) ** 2, "text": self.max_text_len,
                  "table": len(self.cardinalities) + self.n_continuous}
        return {m: counts[m] for m in self.modalities}

    def to_dict(self) -> dict:
        return asdict(self)


class ImageTokens(nn.Module):
    """The ViT's tokenisation: P x P patches, each projected, plus a learned position per patch."""

    def __init__(self, c: MultimodalConfig):
        super().__init__()
        self.patch_embedding = PatchEmbedding(c.patch_size, c.in_channels, c.d_model)
        self.position = nn.Parameter(torch.randn(1, c.token_counts()["image"], c.d_model) * 0.02)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.patch_embedding(images) + self.position
        return tokens, torch.ones(tokens.shape[:2], dtype=torch.bool, device=tokens.device)


class TextTokens(nn.Module):
    """Word embeddings (projected to the model width when they come from a wider pre-trained
    table) plus learned positions; padding positions are masked."""

    def __init__(self, c: MultimodalConfig):
        super().__init__()
        self.pad_id = c.pad_id
        self.word_embeddings = nn.Embedding(c.vocab_size, c.text_embedding_dim)
        self.word_projection = nn.Linear(c.text_embedding_dim, c.d_model) \
            if c.text_embedding_dim != c.d_model else nn.Identity()
        self.position_embeddings = nn.Embedding(c.max_text_len, c.d_model)

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        words = self.word_projection(self.word_embeddings(input_ids))
        return words + self.position_embeddings(positions), input_ids != self.pad_id


class TableTokens(nn.Module):
    """The TabTransformer's per-column embeddings for the categorical cells, and for every
    continuous feature x_j one token x_j * w_j + b_j (its own direction and offset, so each
    column is told apart without a position)."""

    def __init__(self, c: MultimodalConfig):
        super().__init__()
        self.categorical = CategoricalEmbedding(c.cardinalities, c.d_model, c.column_embedding_dim)
        self.continuous_weight = nn.Parameter(torch.randn(c.n_continuous, c.d_model) * 0.02)
        self.continuous_bias = nn.Parameter(torch.zeros(c.n_continuous, c.d_model))

    def forward(self, categorical: torch.Tensor, continuous: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.cat([self.categorical(categorical),
                            continuous[..., None] * self.continuous_weight + self.continuous_bias], dim=1)
        return tokens, torch.ones(tokens.shape[:2], dtype=torch.bool, device=tokens.device)


TOKENIZERS = {"image": ImageTokens, "text": TextTokens, "table": TableTokens}


def modality_inputs(modality: str, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    names = {"image": ("images",), "text": ("input_ids",), "table": ("categorical", "continuous")}[modality]
    missing = [name for name in names if inputs.get(name) is None]
    if missing:
        raise ValueError(f"the {modality} modality needs {' and '.join(missing)}")
    return tuple(inputs[name] for name in names)


class MultimodalEncoder(nn.Module):
    """[CLS] + every configured modality's tokens, typed, through the shared pre-norm blocks."""

    def __init__(self, c: MultimodalConfig):
        super().__init__()
        self.config = c
        self.tokenizers = nn.ModuleDict({m: TOKENIZERS[m](c) for m in c.modalities})
        self.modality_embeddings = nn.Embedding(len(MODALITIES), c.d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model))
        self.dropout = Dropout(c.dropout, fast=c.fast_dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(c.d_model, c.n_heads, c.d_ff, dropout=c.dropout, activation="gelu", norm_first=True,
                             layer_norm_eps=c.layer_norm_eps, fast_dropout=c.fast_dropout)
            for _ in range(c.n_layers))
        self.final_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)

    def forward(self, inputs: dict[str, torch.Tensor], present: torch.Tensor | None = None,
                return_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """inputs: the modalities' tensors by name; present: (batch, len(MODALITIES)) bool or None
        (all present). Returns the states (batch, 1 + tokens, d), the attention mask (batch, 1 +
        tokens; True = attended) and, with return_weights, every block's weights."""
        parts, masks = [], []
        for modality, tokenizer in self.tokenizers.items():
            tokens, mask = tokenizer(*modality_inputs(modality, inputs))
            type_id = MODALITIES.index(modality)
            parts.append(tokens + self.modality_embeddings.weight[type_id])
            if present is not None:
                mask = mask & present[:, type_id, None]
            masks.append(mask)
        batch = len(parts[0])
        cls_mask = torch.ones(batch, 1, dtype=torch.bool, device=parts[0].device)
        x = self.dropout(torch.cat([self.cls_token.expand(batch, -1, -1), *parts], dim=1))
        mask = torch.cat([cls_mask, *masks], dim=1)
        weights = []
        for block in self.blocks:
            x, w = block(x, key_padding_mask=mask, return_weights=return_weights)
            weights.append(w)
        return self.final_norm(x), mask, weights if return_weights else []

    def token_spans(self, inputs: dict[str, torch.Tensor]) -> dict[str, slice]:
        """Where each modality's tokens sit in the sequence ([CLS] is position 0)."""
        spans, start = {}, 1
        for modality in self.tokenizers:
            first = modality_inputs(modality, inputs)
            length = {"image": self.config.token_counts()["image"], "text": first[0].shape[1],
                      "table": first[0].shape[1] + first[-1].shape[1]}[modality]
            spans[modality] = slice(start, start + length)
            start += length
        return spans


class MultimodalTransformer(nn.Module):
    def __init__(self, config: MultimodalConfig):
        super().__init__()
        self.config = c = config
        if c.fusion == "joint":
            self.encoders = nn.ModuleDict({"joint": MultimodalEncoder(c)})
            self.head = nn.Linear(c.d_model, c.n_classes)
            self.absent = None
        else:
            self.encoders = nn.ModuleDict({m: MultimodalEncoder(replace(c, modalities=[m])) for m in c.modalities})
            self.absent = nn.Parameter(torch.zeros(len(c.modalities), c.d_model))
            width = len(c.modalities) * c.d_model
            self.head = nn.Sequential(nn.Linear(width, width), nn.GELU(), Dropout(c.dropout, fast=c.fast_dropout),
                                      nn.Linear(width, c.n_classes))
        self.apply(_init_weights)

    def forward(self, images: torch.Tensor | None = None, input_ids: torch.Tensor | None = None,
                categorical: torch.Tensor | None = None, continuous: torch.Tensor | None = None,
                present: torch.Tensor | None = None, *, return_weights: bool = False) -> ModelOutput:
        """images (batch, C, H, W) float, input_ids (batch, T) long, categorical (batch, columns) long,
        continuous (batch, n_continuous): the configured modalities' inputs (others are ignored);
        present (batch, 3) bool in MODALITIES order, None = every modality present.
        logits (batch, n_classes); joint fusion: hidden_states (batch, 1 + tokens, d) and with
        return_weights attentions, every block's (batch, heads, 1 + tokens, 1 + tokens)."""
        inputs = {"images": images, "input_ids": input_ids, "categorical": categorical, "continuous": continuous}
        if self.absent is None:
            states, _, weights = self.encoders["joint"](inputs, present, return_weights)
            return ModelOutput(logits=self.head(states[:, 0]), hidden_states=states,
                               attentions=weights if return_weights else None)
        pooled = []
        for index, (modality, encoder) in enumerate(self.encoders.items()):
            cls = encoder(inputs, present)[0][:, 0]
            if present is not None:
                cls = torch.where(present[:, MODALITIES.index(modality), None], cls, self.absent[index])
            pooled.append(cls)
        return ModelOutput(logits=self.head(torch.cat(pooled, dim=-1)))

    def token_spans(self, **inputs: torch.Tensor) -> dict[str, slice]:
        """Joint fusion: each modality's positions in hidden_states and attentions."""
        if self.absent is not None:
            raise ValueError("late fusion has no joint sequence: each modality has its own encoder")
        return self.encoders["joint"].token_spans(inputs)

    def load_word_embeddings(self, weights: torch.Tensor) -> None:
        """Start every text encoder's word embeddings from a pre-trained table (vocab, width), e.g.
        a BERT's; the tokenizer of the data must be that model's."""
        tables = [m.word_embeddings for m in self.modules() if isinstance(m, TextTokens)]
        if not tables:
            raise ValueError("the model has no text modality to start word embeddings for")
        if tuple(weights.shape) != tuple(tables[0].weight.shape):
            raise ValueError(f"pre-trained word embeddings {tuple(weights.shape)} do not fit the model's "
                             f"{tuple(tables[0].weight.shape)} (vocab_size, text_embedding_dim): prepare the "
                             "data with that model's tokenizer and set model.text_embedding_dim to its width")
        with torch.no_grad():
            for table in tables:
                table.weight.copy_(weights)


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
