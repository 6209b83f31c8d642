"""ELMo (Peters et al., 2018, "Deep contextualized word representations"): a bidirectional
language model whose every layer, mixed with learned weights, is a word's contextual vector.

    characters of each word -> char CNN (several widths, max-pooled) -> highway -> projection  (layer 0)
    -> forward LSTM stack  (predicts the next word)       \\  2 layers, projected, a residual
    -> backward LSTM stack (predicts the previous word)   /  connection between them
    -> one softmax over the word vocabulary, shared by both directions (full or adaptive)

Layer 0 reads characters only, so every word (one never seen in training too) has a vector, and
it is context-free; layers 1..L are [forward; backward] states, contextual. The ELMo
representation of a word is γ · Σ_j s_j · h_j over the L + 1 layers (ScalarMix: s softmax-
normalised, s and γ learnt by the task that uses the frozen features).

Two options make the same model the baselines it is measured against: `bidirectional=False` keeps
the forward LM alone (a left-to-right language model, scored like GPT), and `token_encoder="words"`
puts a word embedding in place of the character encoder (the plain LSTM language model).

Words are given as character ids (`characters`, one row of max_word_chars per word: begin-of-word,
UTF-8 bytes, end-of-word, padding 0) and, for the loss, as word ids of the output vocabulary.
Sequences are right-padded; `lengths` keeps padding out of the backward direction.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.models.outputs import ModelOutput

# Character ids: 0 padding, then the markers, then byte b at b + N_MARKERS. data/elmo.py encodes
# words the same way (it may not import models/); tests/test_elmo.py checks that the two agree.
CHAR_PAD, BEGIN_OF_WORD, END_OF_WORD, BEGIN_OF_SENTENCE, END_OF_SENTENCE = range(5)
N_MARKERS = 5
N_CHARS = 256 + N_MARKERS
IGNORE_INDEX = -100


def spelling(inner: list[int], max_word_chars: int) -> list[int]:
    """Character ids of one token as the character encoder reads it: begin-of-word, `inner`
    (cut to fit), end-of-word, padding. A sentence marker's inner is [BEGIN_OF_SENTENCE] or
    [END_OF_SENTENCE]; a word's, its UTF-8 bytes shifted past the markers."""
    ids = [BEGIN_OF_WORD, *inner[: max_word_chars - 2], END_OF_WORD]
    return ids + [CHAR_PAD] * (max_word_chars - len(ids))


# torch says once that oneDNN has no projected LSTM and it runs its own kernel: expected, not actionable
warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")

SIZES = {  # (filters as (width, count), highway layers, projection, LSTM cell)
    "tiny": (((1, 16), (2, 16), (3, 32), (4, 64)), 1, 64, 256),
    "small": (((1, 32), (2, 32), (3, 64), (4, 128), (5, 256)), 2, 128, 512),
    # The paper's model: 2,048 filters, 2 highway layers, 512-wide projections of 4,096-cell LSTMs
    "original": (((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024)), 2, 512, 4096),
}


@dataclass
class ElmoConfig:
    vocab_size: int                      # the output word vocabulary (the softmax's classes)
    size: str = "tiny"                   # tiny | small | original: the filters, highway, projection, cell below
    filters: list | None = None          # [(width, count), ...]; None = the size's
    n_highway: int | None = None
    projection_dim: int | None = None    # width of layer 0 and of each direction's projected LSTM output
    hidden_dim: int | None = None        # LSTM cell size
    n_layers: int = 2
    char_dim: int = 16
    max_word_chars: int = 20             # begin/end markers included; longer words are cut
    dropout: float = 0.1
    softmax: str = "full"                # full | adaptive (Grave et al.: frequent words cheap, for large vocabularies)
    adaptive_cutoffs: list[int] = field(default_factory=lambda: [2000, 10000])
    bidirectional: bool = True           # False: the forward LM alone
    token_encoder: str = "characters"    # characters | words (a word embedding: the plain LSTM LM, ids in)

    def __post_init__(self):
        if self.size not in SIZES:
            raise ValueError(f"model.size={self.size!r}: choose one of {', '.join(SIZES)}")
        filters, n_highway, projection, hidden = SIZES[self.size]
        self.filters = [tuple(f) for f in (self.filters or filters)]
        self.n_highway = n_highway if self.n_highway is None else self.n_highway
        self.projection_dim = self.projection_dim or projection
        self.hidden_dim = self.hidden_dim or hidden
        if self.token_encoder not in ("characters", "words"):
            raise ValueError(f"model.token_encoder={self.token_encoder!r}: characters or words")
        if self.softmax not in ("full", "adaptive"):
            raise ValueError(f"model.softmax={self.softmax!r}: full or adaptive")
        if max(width for width, _ in self.filters) > self.max_word_chars:
            raise ValueError(f"model.max_word_chars={self.max_word_chars} is narrower than the widest filter")

    def to_dict(self) -> dict:
        return {**asdict(self), "filters": [list(f) for f in self.filters]}


class Highway(nn.Module):
    """y = g ⊙ relu(W_h x) + (1 - g) ⊙ x with the gate g = σ(W_g x) (Srivastava et al., 2015)."""

    def __init__(self, dim: int):
        super().__init__()
        self.transform, self.gate = nn.Linear(dim, dim), nn.Linear(dim, dim)
        nn.init.constant_(self.gate.bias, -1.0)  # start close to carrying x through, as ELMo does

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.gate(x))
        return gate * F.relu(self.transform(x)) + (1 - gate) * x


class CharacterEncoder(nn.Module):
    """A word's characters -> one vector: embeddings, a convolution per width max-pooled over the
    word, highway layers, a linear projection. No word vocabulary: every word has a vector."""

    def __init__(self, filters: list[tuple[int, int]], n_highway: int, projection_dim: int, char_dim: int = 16):
        """filters: (width, count) of each convolution; the vector is projection_dim wide."""
        super().__init__()
        self.char_embeddings = nn.Embedding(N_CHARS, char_dim, padding_idx=CHAR_PAD)
        self.convolutions = nn.ModuleList(nn.Conv1d(char_dim, count, width) for width, count in filters)
        width = sum(count for _, count in filters)
        self.highways = nn.ModuleList(Highway(width) for _ in range(n_highway))
        self.projection = nn.Linear(width, projection_dim)

    def forward(self, characters: torch.Tensor) -> torch.Tensor:
        """characters (..., max_word_chars) -> (..., projection_dim)."""
        shape = characters.shape[:-1]
        x = self.char_embeddings(characters.reshape(-1, characters.shape[-1])).transpose(1, 2)  # (words, dim, chars)
        x = torch.cat([F.relu(conv(x)).max(dim=-1).values for conv in self.convolutions], dim=-1)
        for highway in self.highways:
            x = highway(x)
        return self.projection(x).reshape(*shape, -1)


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each sequence of x (batch, time, ...) reversed within its length; padding stays at the end."""
    time = torch.arange(x.shape[1], device=x.device)
    index = (lengths[:, None] - 1 - time).where(time < lengths[:, None], time)  # (batch, time)
    return x.gather(1, index.reshape(*index.shape, *[1] * (x.dim() - 2)).expand_as(x))


class LSTMStack(nn.Module):
    """One direction: n_layers projected LSTMs (LSTMP: cell hidden_dim, output projection_dim),
    the second layer's output plus its input (ELMo's residual connection)."""

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.LSTM(config.projection_dim, config.hidden_dim, proj_size=config.projection_dim, batch_first=True)
            for _ in range(config.n_layers))
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x (batch, time, projection_dim), in this direction's reading order -> each layer's output."""
        outputs = []
        for i, layer in enumerate(self.layers):
            y, _ = layer(self.dropout(x))
            x = y if i == 0 else y + x
            outputs.append(x)
        return outputs


class ElmoBiLM(nn.Module):
    """The bidirectional language model. forward() returns a ModelOutput whose `logits` are the
    stacked layers (L + 1, batch, time, 2 * projection_dim), the representation ScalarMix mixes;
    `hidden_states` the top layer; given word_ids, `loss`, the mean of `forward_loss` (next word)
    and `backward_loss` (previous word). With bidirectional=False the layers are the forward
    states alone (projection_dim wide) and `loss` is `forward_loss`."""

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.config = config
        self.token_encoder = (CharacterEncoder(config.filters, config.n_highway, config.projection_dim, config.char_dim)
                              if config.token_encoder == "characters"
                              else nn.Embedding(config.vocab_size, config.projection_dim))
        self.forward_lm = LSTMStack(config)
        self.backward_lm = LSTMStack(config) if config.bidirectional else None
        self.dropout = nn.Dropout(config.dropout)
        cutoffs = [c for c in config.adaptive_cutoffs if c < config.vocab_size]
        if config.softmax == "adaptive" and cutoffs:  # a vocabulary under the first cutoff: one cluster, full softmax
            self.softmax = nn.AdaptiveLogSoftmaxWithLoss(config.projection_dim, config.vocab_size, cutoffs, div_value=4.0)
        else:
            self.softmax = nn.Linear(config.projection_dim, config.vocab_size)

    def layers(self, characters: torch.Tensor, lengths: torch.Tensor | None = None) -> tuple[list, list, torch.Tensor]:
        """(forward states per layer, backward states per layer in reading order (none if not
        bidirectional), layer 0). characters: word ids (batch, time) with token_encoder=words."""
        tokens = self.token_encoder(characters)
        forward_states = self.forward_lm(tokens)
        if self.backward_lm is None:
            return forward_states, [], tokens
        lengths = lengths if lengths is not None else torch.full(characters.shape[:1], characters.shape[1],
                                                                   device=characters.device)
        backward_states = [reverse_padded(h, lengths) for h in self.backward_lm(reverse_padded(tokens, lengths))]
        return forward_states, backward_states, tokens

    def forward(self, characters: torch.Tensor, lengths: torch.Tensor | None = None,
                word_ids: torch.Tensor | None = None) -> ModelOutput:
        """characters (batch, time, max_word_chars); lengths (batch,) words per sequence (None: all
        `time`); word_ids (batch, time) output-vocabulary ids, IGNORE_INDEX where not scored."""
        forward_states, backward_states, tokens = self.layers(characters, lengths)
        if self.backward_lm is None:
            stacked = torch.stack([tokens, *forward_states])
        else:
            stacked = torch.stack([torch.cat([tokens, tokens], -1)] +
                                  [torch.cat(pair, -1) for pair in zip(forward_states, backward_states)])
        loss = forward_loss = backward_loss = None
        if word_ids is not None and self.backward_lm is None:
            loss = forward_loss = self.word_loss(forward_states[-1][:, :-1], word_ids[:, 1:])
        elif word_ids is not None:
            # position t's forward state predicts word t + 1, its backward state word t - 1; the
            # backward state of a padding position read nothing of its sequence: not scored
            previous = word_ids[:, :-1]
            if lengths is not None:
                padding = torch.arange(1, word_ids.shape[1], device=word_ids.device) >= lengths[:, None]
                previous = previous.masked_fill(padding, IGNORE_INDEX)
            forward_loss = self.word_loss(forward_states[-1][:, :-1], word_ids[:, 1:])
            backward_loss = self.word_loss(backward_states[-1][:, 1:], previous)
            loss = (forward_loss + backward_loss) / 2
        return ModelOutput(logits=stacked, loss=loss, hidden_states=stacked[-1], forward_loss=forward_loss,
                           backward_loss=backward_loss)

    def word_loss(self, states: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Negative log-likelihood of the target words, their mean or sum (IGNORE_INDEX not counted)."""
        scored = targets.reshape(-1) != IGNORE_INDEX
        states = self.dropout(states).reshape(-1, states.shape[-1])[scored]
        targets = targets.reshape(-1)[scored]
        if isinstance(self.softmax, nn.AdaptiveLogSoftmaxWithLoss):
            with full_precision(states) as states:
                nll = -self.softmax(states, targets).output
            return nll.mean() if reduction == "mean" else nll.sum()
        return F.cross_entropy(self.softmax(states), targets, reduction=reduction)

    def word_log_probabilities(self, states: torch.Tensor) -> torch.Tensor:
        """log p(word | state) over the vocabulary, (..., vocab_size)."""
        if isinstance(self.softmax, nn.AdaptiveLogSoftmaxWithLoss):
            with full_precision(states) as states:
                return self.softmax.log_prob(states.reshape(-1, states.shape[-1])).reshape(*states.shape[:-1], -1)
        return self.softmax(states).log_softmax(-1)


@contextmanager
def full_precision(states: torch.Tensor):
    """The adaptive softmax copies its clusters' log-probabilities into one float tensor, which
    fails on the bfloat16 ones autocast gives it: it runs outside autocast, on float states."""
    with torch.autocast(states.device.type, enabled=False):
        yield states.float() if states.dtype in (torch.bfloat16, torch.float16) else states


class ScalarMix(nn.Module):
    """ELMo_k = γ · Σ_j s_j · h_{k,j}: the task's own softmax-normalised layer weights s and scale γ."""

    def __init__(self, n_layers: int):
        super().__init__()
        self.scalar_parameters = nn.Parameter(torch.zeros(n_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    @property
    def weights(self) -> torch.Tensor:
        return self.scalar_parameters.softmax(0)

    def forward(self, layers: torch.Tensor) -> torch.Tensor:
        """layers (n_layers, ..., dim) -> (..., dim)."""
        return self.gamma * torch.einsum("l,l...->...", self.weights, layers)
