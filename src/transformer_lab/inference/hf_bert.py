"""BERT as `transformers` reads it: the config, weights and tokenizer of a BERT family's export
(families.py: Export(..., converter=HF_BERT)). Imported by name when a model is exported, so that
reading the registry or exporting a GPT runs none of BERT's code."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from transformer_lab.models.bert import to_hf_state_dict


def config(model_config, labels: list[str] | None, architecture: str):
    """The `transformers.BertConfig` of the model's config; labels (a head's): its id2label."""
    from transformers import BertConfig

    c = model_config
    return BertConfig(vocab_size=c.vocab_size, hidden_size=c.d_model, num_hidden_layers=c.n_layers,
                      num_attention_heads=c.n_heads, intermediate_size=c.d_ff, hidden_act="gelu",
                      max_position_embeddings=c.max_len, type_vocab_size=c.type_vocab_size,
                      layer_norm_eps=c.layer_norm_eps, pad_token_id=c.pad_id,
                      hidden_dropout_prob=c.dropout, attention_probs_dropout_prob=c.dropout,
                      architectures=[architecture],
                      **({"id2label": dict(enumerate(labels)), "label2id": {l: i for i, l in enumerate(labels)}}
                         if labels else {}))


def state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's weights under `transformers`' BERT names (models/bert.py's table)."""
    return to_hf_state_dict(state)


def tokenizer(preprocessor, max_len: int):
    """A `transformers` fast tokenizer around a copy of the task's own WordPiece: inputs get
    `[CLS] A [SEP] (B [SEP])` from its post-processor, as the preprocessors build them; no clean-up
    of spaces in decoding, so that decoded text is this project's."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    copy = Tokenizer.from_str(preprocessor.tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    ids = {name: copy.token_to_id(name) for name in ("[CLS]", "[SEP]")}
    copy.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                             special_tokens=list(ids.items()))
    return PreTrainedTokenizerFast(tokenizer_object=copy, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=max_len,
                                   clean_up_tokenization_spaces=False,
                                   model_input_names=["input_ids", "token_type_ids", "attention_mask"])


def write_joint_heads(task, folder: Path) -> None:
    """JointBERT's intent and slot heads, which no `transformers` class has, beside its BertModel:
    joint_heads.safetensors and their labels in joint_heads.json."""
    from safetensors.torch import save_file

    model = task.model
    save_file({"intent.weight": model.intent_head.weight.contiguous(), "intent.bias": model.intent_head.bias.contiguous(),
               "slot.weight": model.slot_head.weight.contiguous(), "slot.bias": model.slot_head.bias.contiguous()},
              str(folder / "joint_heads.safetensors"))
    (folder / "joint_heads.json").write_text(json.dumps({
        "intent_labels": task.preprocessor.intent_labels, "slot_labels": task.preprocessor.slot_labels,
        "how": "intent = softmax(intent.weight @ pooler_output + intent.bias); slot of each word = "
               "softmax(slot.weight @ last_hidden_state[first piece of the word] + slot.bias)"}, indent=2))
