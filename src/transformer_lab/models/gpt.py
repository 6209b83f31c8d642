"""GPT (Radford et al., 2018; 2019): the shared TransformerBlock with a causal mask, plus
GPT's own embeddings and a language-model head tied to the token embedding.

    token embedding (+ learned or sinusoidal position embedding, or none) ─► dropout
      ─► L blocks, causal self-attention (optionally RoPE on Q and K), feed-forward 4H, GELU
         norm_first=False: GPT-1's post-norm blocks, no final LayerNorm
         norm_first=True:  GPT-2's pre-norm blocks and a final LayerNorm
      ─► hidden states ─► LM head (the token embedding matrix, tied)   = next-token logits

GPT-2's initialisation: N(0, 0.02), with the two residual projections of every block
(attention output, second feed-forward layer) scaled by 1/sqrt(2L), since 2L of them add
into the residual stream.

Fine-tuning (GPT-1, section 3.3): `GPTForSequenceClassification` reads the hidden state at
each sequence's last token (the extract token) into a linear classifier and keeps the LM
head for the auxiliary language-model loss.

Parameter names convert to Hugging Face `transformers` GPT-2 checkpoints
(`from_hf_state_dict` / `to_hf_state_dict`), so published weights load and the tests can
compare outputs with the reference implementation.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.models.attention import KVCache
from transformer_lab.models.dropout import Dropout
from transformer_lab.models.blocks import MixtureOfExperts, TransformerBlock, check_ablation_options
from transformer_lab.models.interop import WeightsUnavailable, rename
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.models.positional import POSITIONS, RotaryEmbedding, positional_encoding

# name: (layers L, hidden H, heads A, norm_first)
SIZES = {
    "tiny": (2, 128, 4, True),
    "mini": (4, 256, 4, True),
    "gpt1": (12, 768, 12, False),
    "gpt2-small": (12, 768, 12, True),
    "gpt2-medium": (24, 1024, 16, True),
    "gpt2-large": (36, 1280, 20, True),
    "gpt2-xl": (48, 1600, 25, True),
}


@dataclass
class GPTConfig:
    vocab_size: int = 50257
    size: str = "tiny"  # fills n_layers, d_model, n_heads, norm_first left at None
    n_layers: int | None = None
    d_model: int | None = None
    n_heads: int | None = None
    d_ff: int | None = None  # None = 4 * d_model
    norm_first: bool | None = None
    max_len: int = 1024  # context length (block size)
    position: str = "learned"  # learned | sinusoidal | rope | none (no position information at all)
    dropout: float = 0.1
    fast_dropout: bool = True  # cheap CPU dropout masks (models/dropout.py); false: torch's own
    activation: str = "gelu_tanh"
    layer_norm_eps: float = 1e-5
    ffn: str = "dense"  # dense | moe
    n_experts: int = 4
    moe_top_k: int = 2
    bias: bool = True  # False: no biases in linear layers and LayerNorms
    eos_id: int | None = None  # end-of-text: generation stops there
    # ablations (models/blocks.py): fewer attention projections, unscaled scores, no residuals, no LayerNorms
    attention_projections: str = "qkv"  # qkv | qv (K = Q) | kv (Q = K) | v (Q = K = V) | none (softmax(X X^T) X)
    attention_scaled: bool = True  # false: scores Q K^T without the 1/sqrt(d_head)
    residual: bool = True          # false: x = sublayer(x), no skip connections
    layer_norm: bool = True        # false: every LayerNorm (the final one too) an identity

    def __post_init__(self):
        if self.size not in SIZES:
            raise ValueError(f"size={self.size!r}; expected one of {', '.join(SIZES)}")
        if self.position not in POSITIONS:
            raise ValueError(f"position={self.position!r}; expected one of {', '.join(POSITIONS)}")
        check_ablation_options(attention_projections=self.attention_projections,
                               attention_scaled=self.attention_scaled, residual=self.residual,
                               layer_norm=self.layer_norm)
        layers, hidden, heads, norm_first = SIZES[self.size]
        self.n_layers = layers if self.n_layers is None else self.n_layers
        self.d_model = hidden if self.d_model is None else self.d_model
        self.n_heads = heads if self.n_heads is None else self.n_heads
        self.norm_first = norm_first if self.norm_first is None else self.norm_first
        self.d_ff = 4 * self.d_model if self.d_ff is None else self.d_ff
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")

    def to_dict(self) -> dict:
        return asdict(self)


class GPTModel(nn.Module):
    """The decoder stack: token ids -> hidden states (batch, length, d_model)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.token = nn.Embedding(config.vocab_size, config.d_model)
        table = config.position in ("learned", "sinusoidal")
        self.position = positional_encoding(config.position, config.max_len, config.d_model) if table else None
        self.rotary = RotaryEmbedding(config.d_model // config.n_heads) if config.position == "rope" else None
        self.dropout = Dropout(config.dropout, fast=config.fast_dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(config.d_model, config.n_heads, config.d_ff, dropout=config.dropout,
                             activation=config.activation, norm_first=config.norm_first,
                             layer_norm_eps=config.layer_norm_eps, ffn=config.ffn, n_experts=config.n_experts,
                             moe_top_k=config.moe_top_k, bias=config.bias, fast_dropout=config.fast_dropout,
                             attention_projections=config.attention_projections,
                             attention_scaled=config.attention_scaled, residual=config.residual,
                             layer_norm=config.layer_norm)
            for _ in range(config.n_layers)
        )
        self.final_norm = None
        if config.norm_first:
            self.final_norm = (nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, bias=config.bias)
                               if config.layer_norm else nn.Identity())

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding (as Hugging Face models name it): what task.embeddings initialises."""
        return self.token

    def forward(self, input_ids: torch.Tensor, caches: list[KVCache] | None = None, *,
                return_weights: bool = False) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """caches: one KVCache per block holding the earlier positions (generation); input_ids
        are then the positions after them. Returns the hidden states and, if asked, each layer's
        attention weights (else None)."""
        offset = caches[0].length if caches else 0
        length = input_ids.shape[1]
        if self.position is not None and offset + length > self.config.max_len:
            raise ValueError(f"position {offset + length - 1} is beyond max_len={self.config.max_len}")
        x = self.token(input_ids)
        if self.position is not None:
            x = x + self.position(length, offset)  # only the new positions, not the whole prefix
        x = self.dropout(x)
        attentions = []
        for index, block in enumerate(self.blocks):
            x, weights = block(x, is_causal=True, return_weights=return_weights, rotary=self.rotary,
                               cache=caches[index] if caches else None)
            attentions.append(weights)
        x = self.final_norm(x) if self.final_norm is not None else x
        return x, attentions if return_weights else None

    def moe_aux_loss(self) -> torch.Tensor:
        """Sum of the mixture-of-experts load-balancing losses of the last forward (0 without MoE)."""
        losses = [block.mlp.aux_loss for block in self.blocks if isinstance(block.mlp, MixtureOfExperts)]
        return torch.stack(losses).sum() if losses else torch.zeros((), device=self.token.weight.device)


def init_gpt_weights(model: nn.Module, n_layers: int) -> None:
    """GPT-2's initialisation (see the module docstring)."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    for name, parameter in model.named_parameters():
        if name.endswith(("attn.out.weight", "fc_out.weight")):
            nn.init.normal_(parameter, std=0.02 / math.sqrt(2 * n_layers))


class GPTLMHeadModel(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.gpt = GPTModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.gpt.token.weight  # tied: one parameter
        init_gpt_weights(self, config.n_layers)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.gpt.token

    def forward(self, input_ids: torch.Tensor, caches: list[KVCache] | None = None, *,
                return_weights: bool = False) -> ModelOutput:
        """logits: next-token logits (batch, length, vocab); aux_loss: the MoE load-balancing loss."""
        hidden, attentions = self.gpt(input_ids, caches, return_weights=return_weights)
        return ModelOutput(logits=self.lm_head(hidden), aux_loss=self._aux_loss(), hidden_states=hidden,
                           attentions=attentions)

    def _aux_loss(self) -> torch.Tensor | None:
        """The load-balancing loss of the forward just run with ffn=moe; None with dense blocks."""
        return self.gpt.moe_aux_loss() if self.config.ffn == "moe" else None

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, strategy: str = "greedy",
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 eos_id: int | None = None, generator: torch.Generator | None = None,
                 use_cache: bool = True) -> torch.Tensor:
        """Continue input_ids (batch, length); returns the new tokens (batch, <= max_new_tokens).

        strategy: greedy (argmax) or sample (from softmax(logits / temperature), optionally
        restricted to the top_k tokens and/or the smallest set with probability >= top_p).
        Generation stops once every row has produced eos_id (a row that ended early is
        padded with eos_id). With use_cache each step feeds only the newest token and reuses
        the earlier positions' keys and values; once the context would exceed max_len
        (learned or sinusoidal positions, a table of max_len rows) the cache restarts from the last
        max_len tokens.
        """
        if strategy not in ("greedy", "sample"):
            raise ValueError(f"strategy={strategy!r}; expected 'greedy' or 'sample'")
        if strategy == "sample" and temperature <= 0:
            raise ValueError(f"temperature={temperature} must be > 0 (use strategy=greedy for argmax)")
        window = self.config.max_len if self.gpt.position is not None else None  # RoPE and none have no length bound
        ids, caches, step_input = input_ids, None, input_ids
        finished = torch.zeros(len(ids), dtype=torch.bool, device=ids.device)
        for _ in range(max_new_tokens):
            if not use_cache:
                hidden, _ = self.gpt(ids[:, -window:] if window else ids)
            else:
                if caches is None or (window and caches[0].length + step_input.shape[1] > window):
                    caches = [KVCache() for _ in self.gpt.blocks]
                    step_input = ids[:, -window:] if window else ids
                hidden, _ = self.gpt(step_input, caches)
            logits = self.lm_head(hidden[:, -1])  # only the last position: the vocabulary matmul is the largest
            token = _choose(logits.float(), strategy, temperature, top_k, top_p, generator)
            if eos_id is not None:
                token = torch.where(finished, torch.full_like(token, eos_id), token)
                finished |= token == eos_id
            ids, step_input = torch.cat([ids, token[:, None]], dim=1), token[:, None]
            if eos_id is not None and bool(finished.all()):
                break
        return ids[:, input_ids.shape[1]:]

    @classmethod
    def from_pretrained(cls, name: str) -> GPTLMHeadModel:
        """Published GPT-2 weights (e.g. "gpt2", "gpt2-medium", or a local `transformers` folder)
        through `transformers`, converted by the name table below. Offline, one clear error."""
        from transformers import GPT2LMHeadModel

        try:
            reference = GPT2LMHeadModel.from_pretrained(name)
        except Exception as err:  # the hub client raises many types when offline
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise WeightsUnavailable(f"could not load GPT-2 weights {name!r} ({reason}); offline? "
                                      "pretrain with `dvc repro pretrain_gpt` or pass a local checkpoint") from None
        model = cls(config_from_hf(reference.config))
        model.load_state_dict(from_hf_state_dict(reference.state_dict()))
        return model


def _choose(logits: torch.Tensor, strategy: str, temperature: float, top_k: int | None, top_p: float | None,
            generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from next-token logits (batch, vocab)."""
    if strategy == "greedy":
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ordered, order = logits.sort(dim=-1, descending=True)
        probabilities = ordered.softmax(dim=-1)
        # drop a token once the ones before it already cover top_p (the first token always stays)
        drop = probabilities.cumsum(dim=-1) - probabilities >= top_p
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]


# ---------------------------------------------------------------------------------------
# Fine-tuning (GPT-1)

@dataclass
class GPTClassifierConfig(GPTConfig):
    n_classes: int = 2
    combine: str = "single"  # how the sequences of one example meet: single | sum | choices


class GPTForSequenceClassification(GPTLMHeadModel):
    """GPT-1's task head. input_ids (batch, n_sequences, length), one or more sequences per example,
    each ending in the extract token at `last` (batch, n_sequences):

        combine=single   classification / entailment: one sequence -> n_classes logits
        combine=sum      similarity: both orders, their final hidden states summed -> n_classes logits
        combine=choices  multiple choice: one sequence per answer -> one score each, softmax over answers

    Returns class logits (`logits`) and LM logits over every input position (`lm_logits`) for
    L_task + lambda * L_lm. The LM head and `generate` are inherited: a fine-tuned model still
    continues text.
    """

    def __init__(self, config: GPTClassifierConfig):
        if config.combine not in ("single", "sum", "choices"):
            raise ValueError(f"combine={config.combine!r}; expected single, sum or choices")
        super().__init__(config)
        self.dropout = Dropout(config.dropout, fast=config.fast_dropout)
        self.classifier = nn.Linear(config.d_model, 1 if config.combine == "choices" else config.n_classes)
        init_gpt_weights(self.classifier, config.n_layers)

    def forward(self, input_ids: torch.Tensor, last: torch.Tensor, *, return_weights: bool = False) -> ModelOutput:
        batch, n_sequences, length = input_ids.shape
        hidden, attentions = self.gpt(input_ids.reshape(batch * n_sequences, length), return_weights=return_weights)
        final = hidden[torch.arange(batch * n_sequences, device=hidden.device), last.reshape(-1)]
        final = self.dropout(final).view(batch, n_sequences, -1)
        if self.config.combine == "choices":
            logits = self.classifier(final).squeeze(-1)  # (batch, n_choices)
        else:
            logits = self.classifier(final.sum(dim=1))
        return ModelOutput(logits=logits, lm_logits=self.lm_head(hidden).view(batch, n_sequences, length, -1),
                           aux_loss=self._aux_loss(), hidden_states=hidden.view(batch, n_sequences, length, -1),
                           attentions=attentions)


# ---------------------------------------------------------------------------------------
# Hugging Face `transformers` GPT-2 interop: its Conv1D layers store weights as (in, out), and
# one c_attn holds query, key and value side by side.

_HF_NAMES = [  # (ours, theirs) as prefixes; {i} is the layer
    ("gpt.token.", "transformer.wte."),
    ("gpt.position.embedding.", "transformer.wpe."),
    ("gpt.blocks.{i}.ln1.", "transformer.h.{i}.ln_1."),
    ("gpt.blocks.{i}.attn.out.", "transformer.h.{i}.attn.c_proj."),
    ("gpt.blocks.{i}.ln2.", "transformer.h.{i}.ln_2."),
    ("gpt.blocks.{i}.mlp.fc_in.", "transformer.h.{i}.mlp.c_fc."),
    ("gpt.blocks.{i}.mlp.fc_out.", "transformer.h.{i}.mlp.c_proj."),
    ("gpt.final_norm.", "transformer.ln_f."),
]
_FUSED_QKV = re.compile(r"^transformer\.h\.(\d+)\.attn\.c_attn\.(weight|bias)$")
_TIED = "lm_head.weight"


def _is_conv1d_weight(hf_name: str) -> bool:
    return hf_name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))


def from_hf_state_dict(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A `transformers` GPT2LMHeadModel (or GPT2Model, keys without "transformer.") state dict
    -> GPTLMHeadModel names. Causal-mask buffers some versions store are skipped."""
    if not any(k.startswith("transformer.") for k in hf_state):
        hf_state = {f"transformer.{k}": v for k, v in hf_state.items()}
    reverse = [(theirs, ours) for ours, theirs in _HF_NAMES]
    state = {}
    for name, tensor in hf_state.items():
        fused = _FUSED_QKV.match(name)
        if fused:
            layer, kind = fused.groups()
            parts = (tensor.t() if kind == "weight" else tensor).chunk(3, dim=0)
            for role, part in zip("qkv", parts):
                state[f"gpt.blocks.{layer}.attn.{role}.{kind}"] = part.contiguous()
            continue
        ours = rename(name, reverse)
        if ours is not None:
            state[ours] = tensor.t().contiguous() if _is_conv1d_weight(name) else tensor
    state[_TIED] = state["gpt.token.weight"]
    return state


def to_hf_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """GPTLMHeadModel names -> `transformers` GPT2LMHeadModel names (lm_head tied)."""
    hf, qkv = {}, {}
    for name, tensor in state.items():
        match = re.match(r"^gpt\.blocks\.(\d+)\.attn\.([qkv])\.(weight|bias)$", name)
        if match:
            qkv[(match.group(1), match.group(3), match.group(2))] = tensor
            continue
        if name == _TIED:
            continue
        theirs = rename(name, _HF_NAMES)
        if theirs is None:
            raise KeyError(f"{name}: no Hugging Face GPT-2 name for this parameter")
        hf[theirs] = tensor.t().contiguous() if _is_conv1d_weight(theirs) else tensor
    for layer, kind in sorted({(layer, kind) for layer, kind, _ in qkv}):
        fused = torch.cat([qkv[(layer, kind, role)] for role in "qkv"], dim=0)
        hf[f"transformer.h.{layer}.attn.c_attn.{kind}"] = fused.t().contiguous() if kind == "weight" else fused
    hf["lm_head.weight"] = hf["transformer.wte.weight"]
    return hf


def config_from_hf(hf_config) -> GPTConfig:
    """A `transformers.GPT2Config` -> GPTConfig (GPT-2: pre-norm, learned positions, tanh GELU)."""
    activations = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
    if hf_config.activation_function not in activations:
        raise ValueError(f"activation_function={hf_config.activation_function!r} is not implemented")
    return GPTConfig(vocab_size=hf_config.vocab_size, n_layers=hf_config.n_layer, d_model=hf_config.n_embd,
                     n_heads=hf_config.n_head, d_ff=hf_config.n_inner or 4 * hf_config.n_embd, norm_first=True,
                     max_len=hf_config.n_positions, position="learned", dropout=hf_config.resid_pdrop,
                     activation=activations[hf_config.activation_function],
                     layer_norm_eps=hf_config.layer_norm_epsilon, eos_id=hf_config.eos_token_id)
