"""GPT as `transformers` reads it: the GPT-2 config, weights and tokenizer of a GPT export
(families.py: Export(..., converter=HF_GPT2)). Imported by name when a model is exported, so that
reading the registry or exporting a BERT runs none of GPT's code."""

from __future__ import annotations

import torch

from transformer_lab.errors import TransformerLabError
from transformer_lab.models.gpt import to_hf_state_dict

ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def config(model_config, labels: list[str] | None, architecture: str):
    """The `transformers.GPT2Config` of the model's config, or one error naming what GPT-2 has not;
    labels: none (a language model has no label head)."""
    from transformers import GPT2Config

    c = model_config
    refused = [why for why, bad in (("post-norm blocks (norm_first=false)", not c.norm_first),
                                    (f"{c.position} positions", c.position != "learned"),
                                    ("mixture-of-experts feed-forward", c.ffn != "dense"),
                                    ("no biases", not c.bias),
                                    (f"{c.activation} activation", c.activation not in ACTIVATIONS))
               if bad]
    if refused:
        raise TransformerLabError(f"this GPT has {', '.join(refused)}: GPT2LMHeadModel has pre-norm blocks, "
                                  "learned positions, a dense GELU feed-forward and biases")
    return GPT2Config(vocab_size=c.vocab_size, n_positions=c.max_len, n_embd=c.d_model, n_layer=c.n_layers,
                      n_head=c.n_heads, n_inner=c.d_ff, activation_function=ACTIVATIONS[c.activation],
                      resid_pdrop=c.dropout, embd_pdrop=c.dropout, attn_pdrop=c.dropout,
                      layer_norm_epsilon=c.layer_norm_eps, bos_token_id=c.eos_id, eos_token_id=c.eos_id,
                      architectures=[architecture])


def state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's weights under `transformers`' GPT-2 names (models/gpt.py's table, q/k/v fused)."""
    return to_hf_state_dict(state)


def tokenizer(preprocessor, max_len: int):
    """A `transformers` fast tokenizer around a copy of the task's own, its end-of-text token the
    beginning and end one; no clean-up of spaces in decoding."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    copy = Tokenizer.from_str(preprocessor.tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    eos = copy.id_to_token(preprocessor.eos_id)
    return PreTrainedTokenizerFast(tokenizer_object=copy, eos_token=eos, bos_token=eos, model_max_length=max_len,
                                   clean_up_tokenization_spaces=False)
