"""Trained models out of the project: a Hugging Face folder (config.json, model.safetensors and
the tokenizer's files) that `transformers` loads with its own classes, e.g.

    transformers.pipeline("text-classification", model=DIR)

Each exportable family maps to a `transformers` class; the weights go through the models' name
tables (models/bert.py, models/gpt.py) and are loaded into that class strictly before anything
is written, so a folder that is written is one `transformers` reads whole. JointBERT (intent +
slots) has no `transformers` class: its encoder is exported as a BertModel and the two heads
beside it (joint_heads.safetensors, their labels in joint_heads.json).

`out` is written whole or not at all, and only where nothing is lost: a new or empty folder, or
an earlier export of the same family (its transformer_lab_export.json names the family and the
files written; a folder with files added is refused). A file, a folder of other files, the
model's own folder (or one holding it) and a DVC output (or a folder in or around one) are refused
in one line, untouched. A new folder inside the model's stage folder is fine: DVC tracks that
stage's checkpoints/ and metrics, not the folder.

torch and `transformers` load when the model is exported, not with this module: `pipelines/export.py`
checks out= before the model loads (`check_out_is_a_folder`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from transformer_lab.errors import TransformerLabError
from transformer_lab.utils.dvc_outputs import declared_outputs
from transformer_lab.utils.io import atomic_directory

if TYPE_CHECKING:
    import torch

HF_CLASSES = {
    "sequence_classification": "BertForSequenceClassification",
    "token_classification": "BertForTokenClassification",
    "question_answering": "BertForQuestionAnswering",
    "bert_pretraining": "BertForMaskedLM",
    "bert_joint_intent_slot": "BertModel",
    "gpt_pretraining": "GPT2LMHeadModel",
}
GPT2_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
EXPORT_RECORD = "transformer_lab_export.json"  # what was exported into a folder: a rerun may replace it
DVC_TEMPLATE = re.compile(r"\$\{[^}]*\}")  # ${item.model} in a dvc.yaml path: one path component


def model_paths(source: str) -> list[Path]:
    """The model's own folder (a stage's: the checkpoint's, or the one above its checkpoints/) and
    checkpoint when model= is a local path; none for an MLflow run, whose files are MLflow's copy."""
    from transformer_lab.inference.pipeline import model_path

    path = Path(source)
    if not path.exists():
        return []
    checkpoint = model_path(source).resolve()  # a stage folder's checkpoints/best.ckpt (or last.ckpt)
    if path.is_dir():
        return [path.resolve(), checkpoint]
    return [checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent, checkpoint]


def dvc_output_near(out: Path) -> str | None:
    """How `out` (resolved) meets a DVC output, which `dvc repro` deletes before rerunning its stage
    and `dvc commit` takes whole: 'inside X, an output of DVC stage S (dvc.yaml)'; None if it does not."""
    for project in (out, *out.parents):
        if (project / "dvc.yaml").is_file():
            where = out.relative_to(project).parts
            for stage, declared in declared_outputs(project):
                parts = Path(declared).parts
                if all(re.fullmatch("[^/]+".join(map(re.escape, DVC_TEMPLATE.split(part))), name)
                       for part, name in zip(parts, where)):
                    how = "is" if len(where) == len(parts) else "inside" if len(where) > len(parts) else "holds"
                    return f"{how} {declared}, an output of DVC stage {stage} ({project / 'dvc.yaml'})"
        if (project / ".dvc").is_dir():  # the DVC project's root
            return None
    return None


def check_out_is_a_folder(out: str | Path) -> None:
    """What check_out refuses first, and without the model: an `out` that is a file."""
    if Path(out).exists() and not Path(out).is_dir():
        raise TransformerLabError(f"out={out}: a file, not a folder; name a new folder (or an earlier export "
                                  "to replace)")


def check_out(out: str | Path, family: str, source: str) -> None:
    """Refuses, in one line and before anything is written, an `out` whose replacing would lose
    something (see the module docstring)."""
    check_out_is_a_folder(out)
    folder = Path(out).resolve()
    for held in model_paths(source):
        if folder == held:
            raise TransformerLabError(f"out={out}: the folder of model={source} (its checkpoints, metrics and "
                                      "history); export to another folder")
        if folder in held.parents:
            raise TransformerLabError(f"out={out}: holds model={source}; export to another folder")
    dvc = dvc_output_near(folder)
    if dvc:
        raise TransformerLabError(f"out={out}: {dvc}, which `dvc repro` deletes; export to a folder outside "
                                  "DVC's outputs")
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if not names:
        return
    try:
        record = json.loads((folder / EXPORT_RECORD).read_text())
        exported, files = (record["format"], record["family"]), set(record["files"])
    except (OSError, ValueError, TypeError, KeyError):
        listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise TransformerLabError(f"out={out}: holds files that are not an export ({listed}); name a new or "
                                  "empty folder, or an earlier export to replace") from None
    if exported != ("hf", family):
        raise TransformerLabError(f"out={out}: holds a {exported[1]} export ({exported[0]}), not a {family} one; "
                                  "name another folder")
    added = [name for name in names if name not in files | {EXPORT_RECORD}]
    if added:
        raise TransformerLabError(f"out={out}: an earlier export with files added ({', '.join(added[:3])}), "
                                  "which replacing it would delete; move them out or name another folder")


def bert_config(config, labels: list[str] | None, architecture: str):
    from transformers import BertConfig

    return BertConfig(vocab_size=config.vocab_size, hidden_size=config.d_model, num_hidden_layers=config.n_layers,
                      num_attention_heads=config.n_heads, intermediate_size=config.d_ff, hidden_act="gelu",
                      max_position_embeddings=config.max_len, type_vocab_size=config.type_vocab_size,
                      layer_norm_eps=config.layer_norm_eps, pad_token_id=config.pad_id,
                      hidden_dropout_prob=config.dropout, attention_probs_dropout_prob=config.dropout,
                      architectures=[architecture],
                      **({"id2label": dict(enumerate(labels)), "label2id": {l: i for i, l in enumerate(labels)}}
                         if labels else {}))


def gpt2_config(config):
    from transformers import GPT2Config

    refused = [why for why, bad in (("post-norm blocks (norm_first=false)", not config.norm_first),
                                    (f"{config.position} positions", config.position != "learned"),
                                    ("mixture-of-experts feed-forward", config.ffn != "dense"),
                                    ("no biases", not config.bias),
                                    (f"{config.activation} activation", config.activation not in GPT2_ACTIVATIONS))
               if bad]
    if refused:
        raise TransformerLabError(f"this GPT has {', '.join(refused)}: GPT2LMHeadModel has pre-norm blocks, "
                                  "learned positions, a dense GELU feed-forward and biases")
    return GPT2Config(vocab_size=config.vocab_size, n_positions=config.max_len, n_embd=config.d_model,
                      n_layer=config.n_layers, n_head=config.n_heads, n_inner=config.d_ff,
                      activation_function=GPT2_ACTIVATIONS[config.activation], resid_pdrop=config.dropout,
                      embd_pdrop=config.dropout, attn_pdrop=config.dropout, layer_norm_epsilon=config.layer_norm_eps,
                      bos_token_id=config.eos_id, eos_token_id=config.eos_id, architectures=["GPT2LMHeadModel"])


def hf_tokenizer(preprocessor, family: str, max_len: int):
    """A `transformers` fast tokenizer around a copy of the task's own: BERT's inputs get
    `[CLS] A [SEP] (B [SEP])` from its post-processor, as the preprocessors build them; no
    clean-up of spaces in decoding, so that decoded text is this project's."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    copy = Tokenizer.from_str(preprocessor.tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    if family == "gpt_pretraining":
        eos = copy.id_to_token(preprocessor.eos_id)
        return PreTrainedTokenizerFast(tokenizer_object=copy, eos_token=eos, bos_token=eos, model_max_length=max_len,
                                       clean_up_tokenization_spaces=False)
    ids = {name: copy.token_to_id(name) for name in ("[CLS]", "[SEP]")}
    copy.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                             special_tokens=list(ids.items()))
    return PreTrainedTokenizerFast(tokenizer_object=copy, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=max_len,
                                   clean_up_tokenization_spaces=False,
                                   model_input_names=["input_ids", "token_type_ids", "attention_mask"])


def hf_state(family: str, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trained model's weights under the `transformers` class's names."""
    if family == "gpt_pretraining":
        from transformer_lab.models.gpt import to_hf_state_dict

        return to_hf_state_dict(model.state_dict())
    from transformer_lab.models.bert import to_hf_state_dict

    state = {k: v for k, v in model.state_dict().items()
             if not k.startswith(("intent_head.", "slot_head.", "nsp."))}  # heads the class has not
    hf = to_hf_state_dict(state)
    if family in ("bert_pretraining", "token_classification", "question_answering"):
        hf = {k: v for k, v in hf.items() if not k.startswith("bert.pooler.")}  # these classes have no pooler
    if family == "bert_joint_intent_slot":  # BertModel: no "bert." prefix
        hf = {k.removeprefix("bert."): v for k, v in hf.items()}
    return hf


def export_hf(loaded, out: str | Path) -> Path:
    """Write the trained model `loaded` (pipelines.LoadedModel) as a Hugging Face folder at `out`;
    nothing is left at `out` if anything fails."""
    import transformers
    from safetensors.torch import save_file

    family, task = loaded.family, loaded.task
    if family not in HF_CLASSES:
        raise TransformerLabError(f"model={loaded.source} is a {family} model: format=hf exports "
                                  f"{', '.join(HF_CLASSES)}")
    check_out(out, family, loaded.source)
    config, architecture = task.model.config, HF_CLASSES[family]
    if family == "gpt_pretraining":
        hf_config = gpt2_config(config)
    else:
        labels = getattr(task.preprocessor, "labels", None) if family != "bert_joint_intent_slot" else None
        hf_config = bert_config(config, labels, architecture)
    model = getattr(transformers, architecture)(hf_config)
    missing, unexpected = model.load_state_dict(hf_state(family, task.model), strict=False)
    missing = [k for k in missing if not k.endswith(("position_ids", "decoder.bias", "masked_bias", "attn.bias"))]
    if missing or unexpected:
        raise TransformerLabError(f"{architecture}: the converted weights do not fit (missing {missing[:3]}, "
                                  f"unexpected {unexpected[:3]})")
    with atomic_directory(out) as folder:
        model.eval().save_pretrained(folder, safe_serialization=True)
        hf_tokenizer(task.preprocessor, family, config.max_len).save_pretrained(folder)
        if family == "bert_joint_intent_slot":
            save_file({"intent.weight": task.model.intent_head.weight.contiguous(),
                       "intent.bias": task.model.intent_head.bias.contiguous(),
                       "slot.weight": task.model.slot_head.weight.contiguous(),
                       "slot.bias": task.model.slot_head.bias.contiguous()}, str(folder / "joint_heads.safetensors"))
            (folder / "joint_heads.json").write_text(json.dumps({
                "intent_labels": task.preprocessor.intent_labels, "slot_labels": task.preprocessor.slot_labels,
                "how": "intent = softmax(intent.weight @ pooler_output + intent.bias); slot of each word = "
                       "softmax(slot.weight @ last_hidden_state[first piece of the word] + slot.bias)"}, indent=2))
        (folder / EXPORT_RECORD).write_text(json.dumps({
            "format": "hf", "family": family, "architecture": architecture, "model": loaded.source,
            "files": sorted(p.name for p in folder.iterdir())}, indent=2) + "\n")
    return Path(out)
