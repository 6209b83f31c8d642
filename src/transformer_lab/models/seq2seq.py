"""The encoder-decoder Transformer (Vaswani et al., 2017): the shared TransformerBlock as the
encoder's layers, and with cross-attention as the decoder's.

    source ids ─► shared embedding x sqrt(d) + sinusoidal positions ─► dropout
               ─► N encoder blocks (self-attention over the source, its padding masked)
               ─► memory (batch, source length, d)
    target ids, shifted right (start token first)
               ─► shared embedding x sqrt(d) + sinusoidal positions ─► dropout
               ─► N decoder blocks: masked self-attention, attention over the memory, feed-forward
               ─► output projection (the shared embedding matrix, tied)   = next-token logits

The base recipe of the paper by config: post-norm blocks, sinusoidal positions, embeddings
scaled by sqrt(d_model), one vocabulary for both languages whose embedding is also the output
projection (section 3.4); label smoothing and the inverse-square-root warm-up live in the task.
norm_first=True gives the pre-norm variant (a final LayerNorm after each stack).

Decoding (`generate`): greedy or beam search with a length penalty. Each decoder block keeps
two caches: its self-attention keys and values grow by one position a step, its cross-attention
keys and values are computed once per source.

Parameter names convert to Hugging Face `transformers` MarianMTModel (the same post-norm,
sinusoidal, tied layout) by the table at the end of this file.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.models.attention import KVCache
from transformer_lab.models.dropout import Dropout
from transformer_lab.models.blocks import TransformerBlock
from transformer_lab.models.interop import rename
from transformer_lab.models.outputs import ModelOutput
from transformer_lab.models.positional import SINUSOIDAL_LAYOUTS, positional_encoding

# name: (encoder layers, decoder layers, d_model, heads, d_ff); base and big are the paper's Table 3
SIZES = {
    "tiny": (2, 2, 128, 4, 512),
    "small": (3, 3, 256, 4, 1024),
    "base": (6, 6, 512, 8, 2048),
    "big": (6, 6, 1024, 16, 4096),
}


@dataclass
class Seq2SeqConfig:
    vocab_size: int = 8000  # one vocabulary for source and target
    size: str = "tiny"  # fills the layer counts and widths left at None
    n_encoder_layers: int | None = None
    n_decoder_layers: int | None = None
    d_model: int | None = None
    n_heads: int | None = None
    d_ff: int | None = None
    max_len: int = 256  # longest source or target, in tokens
    dropout: float = 0.1
    fast_dropout: bool = True  # cheap CPU dropout masks (models/dropout.py); false: torch's own
    activation: str = "relu"
    norm_first: bool = False  # False: the paper's post-norm blocks
    position: str = "sinusoidal"  # sinusoidal | learned
    sinusoidal_layout: str = "interleaved"  # interleaved (the paper) | halves (Marian, fairseq)
    scale_embeddings: bool = True  # embeddings x sqrt(d_model) (section 3.4)
    tie_embeddings: bool = True  # one matrix: source embedding, target embedding, output projection
    layer_norm_eps: float = 1e-5
    pad_id: int = 0
    bos_id: int = 1  # the decoder's start token (shifted-right targets begin with it)
    eos_id: int = 2

    def __post_init__(self):
        if self.size not in SIZES:
            raise ValueError(f"size={self.size!r}; expected one of {', '.join(SIZES)}")
        if self.position not in ("sinusoidal", "learned"):
            raise ValueError(f"position={self.position!r}; expected sinusoidal or learned")
        if self.sinusoidal_layout not in SINUSOIDAL_LAYOUTS:
            raise ValueError(f"sinusoidal_layout={self.sinusoidal_layout!r}; expected one of "
                             f"{', '.join(SINUSOIDAL_LAYOUTS)}")
        encoder_layers, decoder_layers, d_model, n_heads, d_ff = SIZES[self.size]
        self.n_encoder_layers = encoder_layers if self.n_encoder_layers is None else self.n_encoder_layers
        self.n_decoder_layers = decoder_layers if self.n_decoder_layers is None else self.n_decoder_layers
        self.d_model = d_model if self.d_model is None else self.d_model
        self.n_heads = n_heads if self.n_heads is None else self.n_heads
        self.d_ff = d_ff if self.d_ff is None else self.d_ff
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")

    def to_dict(self) -> dict:
        return asdict(self)


class DecoderCache:
    """Everything one source's decoding keeps between steps: per decoder block, the
    self-attention cache (grows a position a step) and the cross-attention cache (filled once)."""

    def __init__(self, n_layers: int):
        self.self_attention = [KVCache() for _ in range(n_layers)]
        self.cross_attention = [KVCache() for _ in range(n_layers)]

    @property
    def length(self) -> int:
        return self.self_attention[0].length

    def reorder(self, rows: torch.Tensor) -> None:
        for cache in self.self_attention + self.cross_attention:
            cache.reorder(rows)


class TransformerSeq2Seq(nn.Module):
    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.config = config
        c = config
        self.source_embedding = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        self.target_embedding = (self.source_embedding if c.tie_embeddings
                                 else nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id))
        self.position = positional_encoding(c.position, c.max_len, c.d_model, layout=c.sinusoidal_layout)
        self.embedding_scale = math.sqrt(c.d_model) if c.scale_embeddings else 1.0
        self.dropout = Dropout(c.dropout, fast=c.fast_dropout)

        def block(cross_attention: bool) -> TransformerBlock:
            return TransformerBlock(c.d_model, c.n_heads, c.d_ff, dropout=c.dropout, activation=c.activation,
                                    norm_first=c.norm_first, layer_norm_eps=c.layer_norm_eps,
                                    cross_attention=cross_attention, fast_dropout=c.fast_dropout)

        self.encoder_blocks = nn.ModuleList(block(False) for _ in range(c.n_encoder_layers))
        self.decoder_blocks = nn.ModuleList(block(True) for _ in range(c.n_decoder_layers))
        self.encoder_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.norm_first else None
        self.decoder_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.norm_first else None
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self._init_weights()
        if c.tie_embeddings:
            self.lm_head.weight = self.source_embedding.weight  # one parameter for all three roles

    def _init_weights(self) -> None:
        """Xavier-uniform linear layers (as in the paper's tensor2tensor code) and embeddings
        N(0, d^-1/2), so that embedding x sqrt(d) has unit scale like the positions."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=self.config.d_model ** -0.5)
                with torch.no_grad():
                    module.weight[self.config.pad_id].zero_()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.source_embedding

    def _embed(self, embedding: nn.Embedding, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        if offset + ids.shape[1] > self.config.max_len:
            raise ValueError(f"position {offset + ids.shape[1] - 1} is beyond max_len={self.config.max_len}")
        return self.dropout(embedding(ids) * self.embedding_scale + self.position(ids.shape[1], offset))

    def encode(self, input_ids: torch.Tensor, *, return_weights: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor] | None]:
        """Source ids (batch, source length) -> memory (batch, source length, d), the source's
        padding mask (True = real token) and, if asked, each layer's attention weights."""
        source_mask = input_ids != self.config.pad_id
        x = self._embed(self.source_embedding, input_ids)
        attentions = []
        for block in self.encoder_blocks:
            x, weights = block(x, key_padding_mask=source_mask, return_weights=return_weights)
            attentions.append(weights)
        x = self.encoder_norm(x) if self.encoder_norm is not None else x
        return x, source_mask, attentions if return_weights else None

    def decode(self, decoder_input_ids: torch.Tensor, memory: torch.Tensor, source_mask: torch.Tensor,
               cache: DecoderCache | None = None, *, return_weights: bool = False
               ) -> tuple[torch.Tensor, tuple[list[torch.Tensor] | None, list[torch.Tensor] | None]]:
        """Target ids so far (batch, length; with a cache, only the positions after it) ->
        the decoder's states and, if asked, the pair (self-attention weights per layer,
        cross-attention weights per layer), else (None, None)."""
        offset = cache.length if cache is not None else 0
        x = self._embed(self.target_embedding, decoder_input_ids, offset)
        self_attentions, cross_attentions = [], []
        for index, block in enumerate(self.decoder_blocks):
            x, weights = block(x, is_causal=True, return_weights=return_weights,
                               cache=cache.self_attention[index] if cache else None,
                               context=memory, context_padding_mask=source_mask,
                               cross_cache=cache.cross_attention[index] if cache else None)
            if return_weights:
                self_attentions.append(weights[0])
                cross_attentions.append(weights[1])
        x = self.decoder_norm(x) if self.decoder_norm is not None else x
        return x, (self_attentions, cross_attentions) if return_weights else (None, None)

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor, *,
                return_weights: bool = False) -> ModelOutput:
        """Teacher forcing: source ids (batch, S) and the shifted-right target (batch, T), start
        token first -> logits (batch, T, vocab), position t predicting target token t."""
        memory, source_mask, encoder_attentions = self.encode(input_ids, return_weights=return_weights)
        hidden, (self_attentions, cross_attentions) = self.decode(decoder_input_ids, memory, source_mask,
                                                                  return_weights=return_weights)
        return ModelOutput(logits=self.lm_head(hidden), hidden_states=hidden, attentions=self_attentions,
                           encoder_hidden_states=memory, encoder_attentions=encoder_attentions,
                           cross_attentions=cross_attentions)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int = 64, *, num_beams: int = 1,
                 length_penalty: float = 1.0, use_cache: bool = True) -> torch.Tensor:
        """Translate source ids (batch, S): the target tokens after the start token, end token
        included, (batch, <= max_new_tokens), padded with pad_id after a row's end token.

        num_beams=1 is greedy decoding. Beam search keeps the num_beams best prefixes of every
        source; a prefix that ends scores sum(log p) / length^length_penalty (length counts its
        tokens, end token included; length_penalty > 0 favours longer translations). A source is
        done once it holds num_beams ended prefixes and its best open prefix, scored at the
        current length, cannot beat the worst of them. Beam size 1 is therefore exactly greedy.
        use_cache=False recomputes every prefix from scratch (the reference for the cache)."""
        if num_beams < 1:
            raise ValueError(f"num_beams={num_beams} must be >= 1")
        max_new_tokens = min(max_new_tokens, self.config.max_len - 1)  # the start token takes position 0
        if num_beams == 1:
            return self._greedy(input_ids, max_new_tokens, use_cache)
        return self._beam_search(input_ids, max_new_tokens, num_beams, length_penalty, use_cache)

    def _next_logits(self, prefix: torch.Tensor, memory: torch.Tensor, source_mask: torch.Tensor,
                     cache: DecoderCache | None) -> torch.Tensor:
        """Next-token logits (rows, vocab) after each row of `prefix` (start token first); the
        padding and start tokens are never a translation's next token."""
        step_input = prefix[:, cache.length:] if cache is not None else prefix
        hidden, _ = self.decode(step_input, memory, source_mask, cache)
        logits = self.lm_head(hidden[:, -1]).float()
        logits[:, [self.config.pad_id, self.config.bos_id]] = float("-inf")
        return logits

    def _greedy(self, input_ids: torch.Tensor, max_new_tokens: int, use_cache: bool) -> torch.Tensor:
        c = self.config
        memory, source_mask, _ = self.encode(input_ids)
        cache = DecoderCache(len(self.decoder_blocks)) if use_cache else None
        prefix = torch.full((len(input_ids), 1), c.bos_id, dtype=torch.long, device=input_ids.device)
        finished = torch.zeros(len(input_ids), dtype=torch.bool, device=input_ids.device)
        for _ in range(max_new_tokens):
            token = self._next_logits(prefix, memory, source_mask, cache).argmax(dim=-1)
            token = torch.where(finished, torch.full_like(token, c.pad_id), token)
            finished |= token == c.eos_id
            prefix = torch.cat([prefix, token[:, None]], dim=1)
            if bool(finished.all()):
                break
        return prefix[:, 1:]

    def _beam_search(self, input_ids: torch.Tensor, max_new_tokens: int, num_beams: int, length_penalty: float,
                     use_cache: bool) -> torch.Tensor:
        c = self.config
        batch, device = len(input_ids), input_ids.device
        memory, source_mask, _ = self.encode(input_ids)
        # every source's beams side by side: rows b * num_beams .. (b + 1) * num_beams - 1
        memory, source_mask = memory.repeat_interleave(num_beams, 0), source_mask.repeat_interleave(num_beams, 0)
        cache = DecoderCache(len(self.decoder_blocks)) if use_cache else None
        prefix = torch.full((batch * num_beams, 1), c.bos_id, dtype=torch.long, device=device)
        # only the first beam is live at the start, or every beam would pick the same first token
        scores = torch.full((batch, num_beams), float("-inf"), device=device)
        scores[:, 0] = 0.0
        ended: list[list[tuple[float, torch.Tensor]]] = [[] for _ in range(batch)]
        done = [False] * batch
        for step in range(1, max_new_tokens + 1):
            log_probs = F.log_softmax(self._next_logits(prefix, memory, source_mask, cache), dim=-1)
            vocab = log_probs.shape[-1]
            candidates = (scores.view(-1, 1) + log_probs).view(batch, num_beams * vocab)
            # 2 x num_beams candidates: enough that num_beams of them do not end here
            top_scores, top_index = candidates.topk(2 * num_beams, dim=-1)
            next_rows, next_tokens, next_scores = [], [], []
            for b in range(batch):
                kept = 0
                for rank in range(2 * num_beams):
                    score, index = top_scores[b, rank].item(), top_index[b, rank].item()
                    row, token = b * num_beams + index // vocab, index % vocab
                    if done[b]:  # a finished source keeps padding its beams
                        row, token, score = b * num_beams + kept, c.pad_id, float("-inf")
                    elif token == c.eos_id:
                        if rank < num_beams:  # an ending ranked below the beam width is not a contender
                            sequence = torch.cat([prefix[row, 1:], prefix.new_tensor([c.eos_id])])
                            ended[b].append((score / step ** length_penalty, sequence))
                        continue
                    next_rows.append(row)
                    next_tokens.append(token)
                    next_scores.append(score)
                    kept += 1
                    if kept == num_beams:
                        break
                if not done[b] and len(ended[b]) >= num_beams:
                    ended[b] = sorted(ended[b], key=lambda item: item[0], reverse=True)[:num_beams]
                    best_open = max(next_scores[-num_beams:]) / step ** length_penalty
                    done[b] = best_open <= ended[b][-1][0]
            rows = torch.tensor(next_rows, device=device)
            prefix = torch.cat([prefix[rows], torch.tensor(next_tokens, device=device)[:, None]], dim=1)
            scores = torch.tensor(next_scores, device=device).view(batch, num_beams)
            if cache is not None:
                cache.reorder(rows)
            if all(done):
                break
        best = []
        for b in range(batch):
            if not ended[b]:  # nothing ended within max_new_tokens: the best open prefix, unfinished
                best.append(prefix[b * num_beams + int(scores[b].argmax()), 1:])
            else:
                best.append(max(ended[b], key=lambda item: item[0])[1])
        length = max(len(sequence) for sequence in best)
        out = torch.full((batch, length), c.pad_id, dtype=torch.long, device=device)
        for b, sequence in enumerate(best):
            out[b, :len(sequence)] = sequence
        return out


# ---------------------------------------------------------------------------------------
# Hugging Face `transformers` MarianMTModel interop (post-norm, sinusoidal positions in the
# "halves" layout, shared and tied embeddings, decoding starts from the pad token).

_HF_NAMES = [  # (ours, theirs) as prefixes; {i} is the layer
    ("source_embedding.", "model.shared."),
    ("encoder_blocks.{i}.attn.q.", "model.encoder.layers.{i}.self_attn.q_proj."),
    ("encoder_blocks.{i}.attn.k.", "model.encoder.layers.{i}.self_attn.k_proj."),
    ("encoder_blocks.{i}.attn.v.", "model.encoder.layers.{i}.self_attn.v_proj."),
    ("encoder_blocks.{i}.attn.out.", "model.encoder.layers.{i}.self_attn.out_proj."),
    ("encoder_blocks.{i}.ln1.", "model.encoder.layers.{i}.self_attn_layer_norm."),
    ("encoder_blocks.{i}.mlp.fc_in.", "model.encoder.layers.{i}.fc1."),
    ("encoder_blocks.{i}.mlp.fc_out.", "model.encoder.layers.{i}.fc2."),
    ("encoder_blocks.{i}.ln2.", "model.encoder.layers.{i}.final_layer_norm."),
    ("decoder_blocks.{i}.attn.q.", "model.decoder.layers.{i}.self_attn.q_proj."),
    ("decoder_blocks.{i}.attn.k.", "model.decoder.layers.{i}.self_attn.k_proj."),
    ("decoder_blocks.{i}.attn.v.", "model.decoder.layers.{i}.self_attn.v_proj."),
    ("decoder_blocks.{i}.attn.out.", "model.decoder.layers.{i}.self_attn.out_proj."),
    ("decoder_blocks.{i}.ln1.", "model.decoder.layers.{i}.self_attn_layer_norm."),
    ("decoder_blocks.{i}.cross_attn.q.", "model.decoder.layers.{i}.encoder_attn.q_proj."),
    ("decoder_blocks.{i}.cross_attn.k.", "model.decoder.layers.{i}.encoder_attn.k_proj."),
    ("decoder_blocks.{i}.cross_attn.v.", "model.decoder.layers.{i}.encoder_attn.v_proj."),
    ("decoder_blocks.{i}.cross_attn.out.", "model.decoder.layers.{i}.encoder_attn.out_proj."),
    ("decoder_blocks.{i}.ln_cross.", "model.decoder.layers.{i}.encoder_attn_layer_norm."),
    ("decoder_blocks.{i}.mlp.fc_in.", "model.decoder.layers.{i}.fc1."),
    ("decoder_blocks.{i}.mlp.fc_out.", "model.decoder.layers.{i}.fc2."),
    ("decoder_blocks.{i}.ln2.", "model.decoder.layers.{i}.final_layer_norm."),
]
# the copies of the shared matrix, and the fixed position tables we compute ourselves
_HF_DERIVED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight",
               "model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def config_from_hf(hf_config) -> Seq2SeqConfig:
    """A `transformers.MarianConfig` with shared, tied embeddings -> Seq2SeqConfig."""
    if not (hf_config.share_encoder_decoder_embeddings and hf_config.tie_word_embeddings):
        raise ValueError("only Marian models with one shared, tied embedding convert")
    if hf_config.activation_function not in ("relu", "gelu"):
        raise ValueError(f"activation_function={hf_config.activation_function!r} is not implemented")
    if hf_config.encoder_attention_heads != hf_config.decoder_attention_heads or \
            hf_config.encoder_ffn_dim != hf_config.decoder_ffn_dim:
        raise ValueError("encoder and decoder of different widths do not convert")
    return Seq2SeqConfig(
        vocab_size=hf_config.vocab_size, n_encoder_layers=hf_config.encoder_layers,
        n_decoder_layers=hf_config.decoder_layers, d_model=hf_config.d_model,
        n_heads=hf_config.encoder_attention_heads, d_ff=hf_config.encoder_ffn_dim,
        max_len=hf_config.max_position_embeddings, dropout=hf_config.dropout,
        activation=hf_config.activation_function, norm_first=False, position="sinusoidal",
        sinusoidal_layout="halves", scale_embeddings=hf_config.scale_embedding, tie_embeddings=True,
        pad_id=hf_config.pad_token_id, bos_id=hf_config.decoder_start_token_id, eos_id=hf_config.eos_token_id)


def from_hf_state_dict(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A `transformers` MarianMTModel state dict -> TransformerSeq2Seq names."""
    reverse = [(theirs, ours) for ours, theirs in _HF_NAMES]
    state = {}
    for name, tensor in hf_state.items():
        if name == "final_logits_bias":
            if bool(tensor.any()):
                raise ValueError("final_logits_bias is not zero: this model's output projection has no bias")
            continue
        if name in _HF_DERIVED:
            continue
        ours = rename(name, reverse)
        if ours is None:
            raise KeyError(f"{name}: no TransformerSeq2Seq name for this parameter")
        state[ours] = tensor
    state["target_embedding.weight"] = state["lm_head.weight"] = state["source_embedding.weight"]
    return state


def to_hf_state_dict(state: dict[str, torch.Tensor], max_len: int) -> dict[str, torch.Tensor]:
    """TransformerSeq2Seq names (tied embeddings) -> `transformers` MarianMTModel names, with
    Marian's fixed position tables (max_len rows, the "halves" layout) and a zero output bias."""
    from transformer_lab.models.positional import SinusoidalPositionalEncoding

    hf = {}
    for name, tensor in state.items():
        if name in ("target_embedding.weight", "lm_head.weight"):
            continue
        theirs = rename(name, _HF_NAMES)
        if theirs is None:
            raise KeyError(f"{name}: no Marian name for this parameter")
        hf[theirs] = tensor
    shared = hf["model.shared.weight"]
    hf["model.encoder.embed_tokens.weight"] = hf["model.decoder.embed_tokens.weight"] = shared
    hf["lm_head.weight"] = shared
    hf["final_logits_bias"] = torch.zeros(1, shared.shape[0], dtype=shared.dtype)
    positions = SinusoidalPositionalEncoding(max_len, shared.shape[1], "halves").table.to(shared.dtype)
    hf["model.encoder.embed_positions.weight"] = hf["model.decoder.embed_positions.weight"] = positions
    return hf
