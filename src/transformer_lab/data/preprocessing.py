"""What every family's preprocessor shares: its whole encoding state as plain data.

A preprocessor turns raw inputs (words, texts, images, table rows) into model features. The
datamodule builds one and encodes its splits with it; the task keeps `to_state()` in its
hyper-parameters, so that a checkpoint alone predicts from raw inputs. The state holds only
JSON-able values (a checkpoint is read with `torch.load(weights_only=True)`): a tokenizer travels
as its JSON text (`Tokenizer.to_str()`), not as the path of a file that may move.
"""

from __future__ import annotations

import dataclasses

from tokenizers import Tokenizer

from transformer_lab.errors import TransformerLabError


class Preprocessor:
    """Base of the dataclass preprocessors: the fields are the state; a `tokenizer` field travels as JSON."""

    def to_state(self) -> dict:
        state = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if isinstance(state.get("tokenizer"), Tokenizer):
            state["tokenizer"] = state["tokenizer"].to_str()
        return state

    @classmethod
    def from_state(cls, state: dict):
        fields = dataclasses.fields(cls)
        required = [f.name for f in fields
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        check_state(state, required, cls.__name__)
        values = {f.name: state[f.name] for f in fields if f.name in state}
        if isinstance(values.get("tokenizer"), str):
            values["tokenizer"] = Tokenizer.from_str(values["tokenizer"])
        return cls(**values)


class TokenizerPreprocessor(Preprocessor):
    """Base of the preprocessors that encode with a Hugging Face `tokenizers` Tokenizer (their `tokenizer` field)."""

    @property
    def tokens(self) -> list[str]:
        """Token strings by id: what maps pre-trained word vectors onto embedding rows (tasks/embeddings.py)."""
        return tokenizer_tokens(self.tokenizer)


def check_state(state, keys: list[str], owner: str) -> None:
    """One line for a state that is not a dict or lacks a key (a checkpoint of another version)."""
    if not isinstance(state, dict):
        raise TransformerLabError(f"{owner}: its saved state is a {type(state).__name__}, not a dict")
    missing = [key for key in keys if key not in state]
    if missing:
        raise TransformerLabError(f"{owner}: its saved state lacks {', '.join(missing)}; retrain the checkpoint")


def tokenizer_tokens(tokenizer: Tokenizer) -> list[str]:
    """Token strings by id (id -> token): what maps pre-trained word vectors onto embedding rows."""
    tokens = [""] * tokenizer.get_vocab_size()
    for token, index in tokenizer.get_vocab().items():
        tokens[index] = token
    return tokens
