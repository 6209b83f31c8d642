"""BERT (Devlin et al., 2019): the shared post-norm TransformerBlock with GELU, plus BERT's
own embeddings and heads.

    token + segment (A/B) + learned position embeddings ─► LayerNorm, dropout
      ─► L post-norm blocks (H wide, A heads, feed-forward 4H, GELU)   = hidden states
    hidden[:, 0] ([CLS]) ─► dense + tanh                               = pooled
    pre-training heads: masked-LM (dense, GELU, LayerNorm, decoder tied to the token
    embedding + own bias) on hidden states; next-sentence (2-way) on pooled
    (is_causal: the same blocks attending left to right only, the head predicting the next
    token: the paper's left-to-right ablation, section 5.1)
    fine-tuning heads: sequence / pair classification on pooled (or, pool=mean, the same dense +
    tanh over the mean of the real tokens' states), token labelling (tags, or
    tags + intent) on hidden states, extractive QA (start/end logits) on hidden states

Parameter names convert one-to-one to Hugging Face `transformers` BERT checkpoints
(`from_hf_state_dict` / `to_hf_state_dict`), so published weights load and the tests can
compare outputs with the reference implementation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.models.dropout import Dropout
from transformer_lab.models.blocks import TransformerBlock
from transformer_lab.models.interop import WeightsUnavailable, rename
from transformer_lab.models.outputs import ModelOutput

# name: (layers L, hidden H, heads A). tiny/mini/small: the compact BERTs of Turc et al. (2019).
SIZES = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


@dataclass
class BertConfig:
    vocab_size: int = 30522
    size: str = "tiny"  # fills n_layers, d_model, n_heads left at None
    n_layers: int | None = None
    d_model: int | None = None
    n_heads: int | None = None
    d_ff: int | None = None  # None = 4 * d_model
    max_len: int = 512
    type_vocab_size: int = 2
    dropout: float = 0.1
    fast_dropout: bool = True  # cheap CPU dropout masks (models/dropout.py); false: torch's own
    layer_norm_eps: float = 1e-12
    pad_id: int = 0

    def __post_init__(self):
        if self.size not in SIZES:
            raise ValueError(f"size={self.size!r}; expected one of {', '.join(SIZES)}")
        layers, hidden, heads = SIZES[self.size]
        self.n_layers = layers if self.n_layers is None else self.n_layers
        self.d_model = hidden if self.d_model is None else self.d_model
        self.n_heads = heads if self.n_heads is None else self.n_heads
        self.d_ff = 4 * self.d_model if self.d_ff is None else self.d_ff
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")

    def to_dict(self) -> dict:
        return asdict(self)


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.token = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_id)
        self.segment = nn.Embedding(config.type_vocab_size, config.d_model)
        self.position = nn.Embedding(config.max_len, config.d_model)
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.dropout, fast=config.fast_dropout)

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        length = input_ids.shape[1]
        if length > self.position.num_embeddings:
            raise ValueError(f"sequence of {length} tokens exceeds max_len={self.position.num_embeddings}")
        if segment_ids is None:
            segment_ids = torch.zeros_like(input_ids)
        positions = torch.arange(length, device=input_ids.device)
        x = self.token(input_ids) + self.segment(segment_ids) + self.position(positions)
        return self.dropout(self.norm(x))


class BertModel(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.blocks = nn.ModuleList(
            TransformerBlock(config.d_model, config.n_heads, config.d_ff, dropout=config.dropout, activation="gelu",
                             norm_first=False, layer_norm_eps=config.layer_norm_eps, fast_dropout=config.fast_dropout)
            for _ in range(config.n_layers)
        )
        self.pooler = nn.Linear(config.d_model, config.d_model)
        self.apply(_init_weights)

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding (as Hugging Face models name it): what task.embeddings initialises."""
        return self.embeddings.token

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, *, return_weights: bool = False,
                positions: torch.Tensor | None = None,
                is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor] | None]:
        """input_ids, segment_ids, attention_mask: (batch, length); mask True/1 = real token.
        is_causal: every position attends to itself and the positions before it only (left-to-right
        language-model pre-training, an ablation of BERT's bidirectional one; fine-tuning never sets it).

        Returns hidden states (batch, length, d_model), the pooled [CLS] state (batch, d_model) and,
        if asked, each layer's attention weights (else None). The heads below wrap these in a ModelOutput.

        positions: (batch, rows) indices of the only positions whose final states are wanted; the
        hidden states are then (batch, rows, d_model), and the last layer computes just those rows
        and [CLS] (its keys and values still come from every position): the same numbers for a
        fraction of the last layer's work.
        """
        if is_causal and positions is not None:
            raise ValueError("positions (the last layer at chosen rows) is for the bidirectional encoder only")
        x = self.embeddings(input_ids, segment_ids)
        attentions = []
        for index, block in enumerate(self.blocks):
            if positions is not None and index == len(self.blocks) - 1:
                rows = torch.cat([positions.new_zeros(len(positions), 1), positions], dim=1)  # [CLS] first
                chosen = x.gather(1, rows[..., None].expand(-1, -1, x.shape[-1]))
                x, weights = block(chosen, key_padding_mask=attention_mask, return_weights=return_weights, keys_from=x)
            else:
                x, weights = block(x, key_padding_mask=attention_mask, return_weights=return_weights,
                                   is_causal=is_causal)
            attentions.append(weights)
        return x if positions is None else x[:, 1:], self.pool(x[:, 0]), attentions if return_weights else None

    def pool(self, state: torch.Tensor) -> torch.Tensor:
        """The pooler, dense + tanh, on one state per sequence (batch, d_model): [CLS]'s, or another summary."""
        return torch.tanh(self.pooler(state))


def _init_weights(module: nn.Module) -> None:
    """BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class MaskedLMHead(nn.Module):
    """dense + GELU + LayerNorm, then a decoder that shares the token embedding matrix (one
    parameter, not a copy) and has its own output bias."""

    def __init__(self, config: BertConfig, token_embedding: nn.Embedding):
        super().__init__()
        self.transform = nn.Linear(config.d_model, config.d_model)
        self.act = nn.GELU()
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.decoder.weight = token_embedding.weight  # tied
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # the tied matrix and the head's own bias in one addmm
        return F.linear(self.norm(self.act(self.transform(hidden))), self.decoder.weight, self.bias)


def padded_positions(chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A boolean (batch, length) mask as indices: (batch, rows) with each row's chosen positions
    first, in order, then filler up to the largest count in the batch; and (batch, rows), which are
    chosen. indices[real] lists the chosen positions in the order of a boolean index, chosen[...]."""
    rows = int(chosen.sum(dim=1).max()) if chosen.numel() else 0
    order = torch.argsort((~chosen).to(torch.uint8), dim=1, stable=True)[:, :rows]
    return order, chosen.gather(1, order)


class BertForPreTraining(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.mlm = MaskedLMHead(config, self.bert.embeddings.token)
        self.nsp = nn.Linear(config.d_model, 2)
        for module in (self.mlm.transform, self.mlm.norm, self.nsp):
            _init_weights(module)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.bert.embeddings.token

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, mlm_positions: torch.Tensor | None = None, *,
                return_weights: bool = False, is_causal: bool = False) -> ModelOutput:
        """logits: MLM logits; nsp_logits (batch, 2); hidden_states (batch, length, d_model).

        MLM logits are (batch, length, vocab), or only at mlm_positions (a boolean
        (batch, length) mask) as (n_positions, vocab): the loss needs the ~15% masked
        positions, and the vocabulary projection is the largest matmul in a small BERT. The
        last layer then computes only those positions and [CLS] as well, and hidden_states are
        theirs, (n_positions, d_model) (unless return_weights: every layer is computed in full).

        is_causal: left-to-right attention (BertModel.forward), the same head then predicting the
        next token at mlm_positions (every layer computed in full: a causal loss reads most rows).
        """
        if mlm_positions is None or return_weights or is_causal:
            hidden, pooled, attentions = self.bert(input_ids, segment_ids, attention_mask,
                                                   return_weights=return_weights, is_causal=is_causal)
            mlm_input = hidden if mlm_positions is None else hidden[mlm_positions]
        else:
            positions, real = padded_positions(mlm_positions)
            hidden, pooled, attentions = self.bert(input_ids, segment_ids, attention_mask, positions=positions)
            mlm_input = hidden = hidden[real]  # row by row, in position order: hidden[mlm_positions]'s order
        return ModelOutput(logits=self.mlm(mlm_input), nsp_logits=self.nsp(pooled), hidden_states=hidden,
                           attentions=attentions)

    @classmethod
    def from_pretrained(cls, name: str) -> BertForPreTraining:
        """Published weights (e.g. "bert-base-uncased", or a local `transformers` folder) through
        `transformers`, converted by the name table below. Offline, one clear error."""
        from transformers import BertForPreTraining as HFBertForPreTraining

        try:
            reference = HFBertForPreTraining.from_pretrained(name)
        except Exception as err:  # the hub client raises many types when offline
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise WeightsUnavailable(f"could not load BERT weights {name!r} ({reason}); offline? "
                                      "pretrain with `dvc repro pretrain_bert` or pass a local checkpoint") from None
        model = cls(config_from_hf(reference.config))
        model.load_state_dict(from_hf_state_dict(reference.state_dict()))
        return model


class BertForReplacedTokenDetection(nn.Module):
    """ELECTRA's pre-training (Clark et al., 2020) of the same encoder: a smaller masked-LM generator
    fills the masked positions with tokens sampled from its own predictions, and the encoder (the
    discriminator, `bert`, the part fine-tuning keeps) tells every token replaced or original. Every
    position is a label, not only the 15 % the masked LM predicts: the paper's argument for its
    sample efficiency at small sizes.

    The generator is `generator_layers` blocks of the same width, sharing the embeddings (token,
    segment, position: one module) and tying its decoder to the token matrix; the paper's best
    generators are a quarter to a half of the discriminator. The discriminator head is dense +
    GELU + a 1-wide projection, as in the paper's code.
    """

    def __init__(self, config: BertConfig, generator_layers: int = 1):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.discriminator = nn.Sequential(nn.Linear(config.d_model, config.d_model), nn.GELU(),
                                           nn.Linear(config.d_model, 1))
        self.generator = BertForPreTraining(BertConfig(**{**config.to_dict(), "n_layers": generator_layers}))
        self.generator.bert.embeddings = self.bert.embeddings  # one set of embeddings, trained by both
        self.generator.mlm.decoder.weight = self.bert.embeddings.token.weight
        self.discriminator.apply(_init_weights)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.bert.embeddings.token

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, mlm_positions: torch.Tensor | None = None,
                original_ids: torch.Tensor | None = None) -> ModelOutput:
        """input_ids: the masked sentences (the masked LM's input); mlm_positions: (batch, length)
        bool, the positions the generator fills; original_ids: the sentences as written.

        logits: the discriminator's score that each token was replaced, (batch, length);
        generator_logits: the generator's masked-LM logits at mlm_positions, (n_positions, vocab);
        replaced: (batch, length) bool, the discriminator's labels (a sampled token equal to the
        original counts as original, as in the paper); hidden_states: the discriminator's."""
        generated = self.generator(input_ids, segment_ids, attention_mask, mlm_positions)
        with torch.no_grad():  # sampling is not differentiated: the generator learns from its own loss
            sampled = torch.multinomial(generated.logits.detach().float().softmax(-1), 1).squeeze(-1)
        corrupted = original_ids.masked_scatter(mlm_positions, sampled)
        hidden, _, _ = self.bert(corrupted, segment_ids, attention_mask)
        return ModelOutput(logits=self.discriminator(hidden).squeeze(-1), generator_logits=generated.logits,
                           replaced=corrupted != original_ids, hidden_states=hidden)


# ---------------------------------------------------------------------------------------
# Fine-tuning heads (the four uses in the BERT paper)

POOLINGS = ("cls", "mean")


@dataclass
class BertClassifierConfig(BertConfig):
    n_classes: int = 2
    pool: str = "cls"  # cls: the [CLS] state | mean: the mean of the real tokens' states; then the pooler either way

    def __post_init__(self):
        super().__post_init__()
        if self.pool not in POOLINGS:
            raise ValueError(f"pool={self.pool!r}; expected one of {', '.join(POOLINGS)}")


def mean_of_real_tokens(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(batch, length, d_model) -> (batch, d_model): each sequence's mean state over its real tokens
    (attention_mask True/1; None: every position)."""
    if attention_mask is None:
        return hidden.mean(dim=1)
    real = attention_mask.to(hidden.dtype)[..., None]
    return (hidden * real).sum(dim=1) / real.sum(dim=1).clamp(min=1)


class BertForSequenceClassification(nn.Module):
    """One sentence ([CLS] A [SEP]) or a pair ([CLS] A [SEP] B [SEP]) -> class, from the pooled [CLS]
    (pool=cls) or the pooled mean of the real tokens' states (pool=mean: the same pooler, so the same
    parameters and published weights load)."""

    def __init__(self, config: BertClassifierConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.dropout = Dropout(config.dropout, fast=config.fast_dropout)
        self.classifier = nn.Linear(config.d_model, config.n_classes)
        _init_weights(self.classifier)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.bert.embeddings.token

    def forward(self, input_ids, segment_ids=None, attention_mask=None, *, return_weights=False) -> ModelOutput:
        """logits: class logits (batch, n_classes)."""
        hidden, pooled, attentions = self.bert(input_ids, segment_ids, attention_mask, return_weights=return_weights)
        if self.config.pool == "mean":
            pooled = self.bert.pool(mean_of_real_tokens(hidden, attention_mask))
        return ModelOutput(logits=self.classifier(self.dropout(pooled)), hidden_states=hidden, attentions=attentions)


@dataclass
class BertJointConfig(BertConfig):
    n_intents: int = 2
    n_slots: int = 2


class BertForJointIntentSlot(nn.Module):
    """JointBERT (Chen et al., 2019): intent from the pooled [CLS], a slot tag from every
    token's hidden state (the task scores each word's first sub-token)."""

    def __init__(self, config: BertJointConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.dropout = Dropout(config.dropout, fast=config.fast_dropout)
        self.intent_head = nn.Linear(config.d_model, config.n_intents)
        self.slot_head = nn.Linear(config.d_model, config.n_slots)
        for module in (self.intent_head, self.slot_head):
            _init_weights(module)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.bert.embeddings.token

    def forward(self, input_ids, segment_ids=None, attention_mask=None, *, return_weights=False) -> ModelOutput:
        """logits: intent logits (batch, n_intents); slot_logits (batch, length, n_slots)."""
        hidden, pooled, attentions = self.bert(input_ids, segment_ids, attention_mask, return_weights=return_weights)
        intent_logits = self.intent_head(self.dropout(pooled))  # before the slots: the dropout masks' order
        slot_logits = self.slot_head(self.dropout(hidden))
        return ModelOutput(logits=intent_logits, slot_logits=slot_logits, hidden_states=hidden, attentions=attentions)


@dataclass
class BertTaggerConfig(BertConfig):
    n_labels: int = 2


class BertForTokenClassification(nn.Module):
    """A tag for every token from its hidden state (named entities; the task scores each word's first piece)."""

    def __init__(self, config: BertTaggerConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.dropout = Dropout(config.dropout, fast=config.fast_dropout)
        self.classifier = nn.Linear(config.d_model, config.n_labels)
        _init_weights(self.classifier)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.bert.embeddings.token

    def forward(self, input_ids, segment_ids=None, attention_mask=None, *, return_weights=False) -> ModelOutput:
        """logits: tag logits (batch, length, n_labels)."""
        hidden, _, attentions = self.bert(input_ids, segment_ids, attention_mask, return_weights=return_weights)
        return ModelOutput(logits=self.classifier(self.dropout(hidden)), hidden_states=hidden, attentions=attentions)


class BertForQuestionAnswering(nn.Module):
    """[CLS] question [SEP] passage [SEP] -> start and end logits per token (the answer span)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.span = nn.Linear(config.d_model, 2)
        _init_weights(self.span)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.bert.embeddings.token

    def forward(self, input_ids, segment_ids=None, attention_mask=None, *, return_weights=False) -> ModelOutput:
        """logits: span logits (batch, length, 2); start_logits, end_logits: the two halves (batch, length)."""
        hidden, _, attentions = self.bert(input_ids, segment_ids, attention_mask, return_weights=return_weights)
        logits = self.span(hidden)
        start, end = logits.unbind(-1)
        return ModelOutput(logits=logits, start_logits=start, end_logits=end, hidden_states=hidden,
                           attentions=attentions)


# ---------------------------------------------------------------------------------------
# Hugging Face `transformers` interop: a name table, not special cases.

_HF_NAMES = [  # (ours, theirs) as prefixes; {i} is the layer
    ("bert.embeddings.token.", "bert.embeddings.word_embeddings."),
    ("bert.embeddings.segment.", "bert.embeddings.token_type_embeddings."),
    ("bert.embeddings.position.", "bert.embeddings.position_embeddings."),
    ("bert.embeddings.norm.", "bert.embeddings.LayerNorm."),
    ("bert.blocks.{i}.attn.q.", "bert.encoder.layer.{i}.attention.self.query."),
    ("bert.blocks.{i}.attn.k.", "bert.encoder.layer.{i}.attention.self.key."),
    ("bert.blocks.{i}.attn.v.", "bert.encoder.layer.{i}.attention.self.value."),
    ("bert.blocks.{i}.attn.out.", "bert.encoder.layer.{i}.attention.output.dense."),
    ("bert.blocks.{i}.ln1.", "bert.encoder.layer.{i}.attention.output.LayerNorm."),
    ("bert.blocks.{i}.mlp.fc_in.", "bert.encoder.layer.{i}.intermediate.dense."),
    ("bert.blocks.{i}.mlp.fc_out.", "bert.encoder.layer.{i}.output.dense."),
    ("bert.blocks.{i}.ln2.", "bert.encoder.layer.{i}.output.LayerNorm."),
    ("bert.pooler.", "bert.pooler.dense."),
    ("mlm.transform.", "cls.predictions.transform.dense."),
    ("mlm.norm.", "cls.predictions.transform.LayerNorm."),
    ("mlm.bias", "cls.predictions.bias"),
    ("nsp.", "cls.seq_relationship."),
    ("classifier.", "classifier."),  # BertForSequenceClassification, BertForTokenClassification
    ("span.", "qa_outputs."),        # BertForQuestionAnswering
]
_TIED = "mlm.decoder.weight"  # = bert.embeddings.token.weight


def from_hf_state_dict(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A `transformers` BertForPreTraining (or BertModel, keys without "bert.") state dict ->
    this module's names. Heads the checkpoint lacks are simply absent from the result."""
    if not any(k.startswith("bert.") for k in hf_state):
        hf_state = {f"bert.{k}": v for k, v in hf_state.items()}
    reverse = [(theirs, ours) for ours, theirs in _HF_NAMES]
    state = {}
    for name, tensor in hf_state.items():
        ours = rename(name, reverse)
        if ours is not None:
            state[ours] = tensor
    if "bert.embeddings.token.weight" in state and "mlm.bias" in state:
        state[_TIED] = state["bert.embeddings.token.weight"]
    return state


def to_hf_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This module's state dict -> `transformers` BertForPreTraining names (decoder tied)."""
    hf = {}
    for name, tensor in state.items():
        if name == _TIED:
            continue
        theirs = rename(name, _HF_NAMES)
        if theirs is None:
            raise KeyError(f"{name}: no Hugging Face BERT name for this parameter")
        hf[theirs] = tensor
    if "cls.predictions.bias" in hf:
        hf["cls.predictions.decoder.weight"] = hf["bert.embeddings.word_embeddings.weight"]
        hf["cls.predictions.decoder.bias"] = hf["cls.predictions.bias"]
    return hf


def config_from_hf(hf_config) -> BertConfig:
    """A `transformers.BertConfig` -> BertConfig (same sizes, eps and vocabulary)."""
    if getattr(hf_config, "hidden_act", "gelu") != "gelu":
        raise ValueError(f"hidden_act={hf_config.hidden_act!r}: only BERT's exact GELU is implemented")
    return BertConfig(vocab_size=hf_config.vocab_size, n_layers=hf_config.num_hidden_layers,
                      d_model=hf_config.hidden_size, n_heads=hf_config.num_attention_heads,
                      d_ff=hf_config.intermediate_size, max_len=hf_config.max_position_embeddings,
                      type_vocab_size=hf_config.type_vocab_size, dropout=hf_config.hidden_dropout_prob,
                      layer_norm_eps=hf_config.layer_norm_eps, pad_id=hf_config.pad_token_id or 0)
