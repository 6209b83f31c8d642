"""Sub-word and character tokenizers (Hugging Face `tokenizers`) trained on the prepared
corpus, and the corpus encoded once into token-id arrays that language models stream from.

    wordpiece  BERT style: [PAD] [UNK] [CLS] [SEP] [MASK]
    bpe        GPT-2 style byte-level BPE with an end-of-text token
    char       one token per character seen in training

GPT tokenizers (bpe, char) also reserve GPT-1's fine-tuning tokens: start, delimiter and
extract. GPT-1 added them at fine-tuning time; reserving their ids up front keeps pre-trained
checkpoints and fine-tuning inputs on one vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from transformer_lab.data.corpus import read_documents
from transformer_lab.errors import DataError
from transformer_lab.utils.io import atomic_directory

BERT_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
END_OF_TEXT = "<|endoftext|>"
GPT_SPECIAL = ["<|start|>", "<|delimiter|>", "<|extract|>"]


def build_tokenizer(kind: str, lowercase: bool = False) -> tuple[Tokenizer, object]:
    """An untrained tokenizer and its trainer-maker for one of wordpiece | bpe | char."""
    if kind == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        return tokenizer, lambda size, special: trainers.WordPieceTrainer(vocab_size=size, special_tokens=special)
    if kind == "bpe":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.normalizer = normalizers.Lowercase() if lowercase else None
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        return tokenizer, lambda size, special: trainers.BpeTrainer(
            vocab_size=size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    if kind == "char":
        tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.Lowercase() if lowercase else None
        # every character, line breaks included ("." alone would leave runs of "\n" as one token)
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tokenizer.decoder = decoders.Fuse()
        return tokenizer, lambda size, special: trainers.WordLevelTrainer(vocab_size=size, special_tokens=special)
    raise DataError(f"tokenizer kind {kind!r} is not one of wordpiece, bpe, char")


def default_special_tokens(kind: str) -> list[str]:
    if kind == "wordpiece":
        return BERT_SPECIAL
    return [END_OF_TEXT, *GPT_SPECIAL] if kind == "bpe" else ["[UNK]", END_OF_TEXT, *GPT_SPECIAL]


def document_text(sentences: list[str]) -> str:
    return " ".join(sentences)


def train_tokenizer(kind: str, texts: list[str], vocab_size: int, lowercase: bool = False,
                    special_tokens: list[str] | None = None) -> Tokenizer:
    tokenizer, make_trainer = build_tokenizer(kind, lowercase)
    special = list(special_tokens) if special_tokens is not None else default_special_tokens(kind)
    if kind != "wordpiece":
        tokenizer.train_from_iterator(texts, trainer=make_trainer(vocab_size, special))
        return tokenizer
    # The WordPiece trainer numbers the continuing-subword tokens ("##e") in hash-map order, and
    # breaks ties between equally frequent merges by those numbers, so two runs on the same text
    # learn different vocabularies (huggingface/tokenizers#1794). Reserving them up front, sorted,
    # fixes their numbers; they are then ordinary vocabulary entries again, not special tokens.
    continuations = continuing_subwords(tokenizer, texts)
    tokenizer.train_from_iterator(texts, trainer=make_trainer(vocab_size, special + continuations))
    saved = json.loads(tokenizer.to_str())
    saved["added_tokens"] = [token for token in saved["added_tokens"] if token["content"] in special]
    return Tokenizer.from_str(json.dumps(saved))


def continuing_subwords(tokenizer: Tokenizer, texts: list[str]) -> list[str]:
    """"##c" for every character c of the normalised texts that can continue a word (the
    pre-tokenizer does not split it off, as it does spaces and punctuation), sorted."""
    characters = set().union(*(set(tokenizer.normalizer.normalize_str(text)) for text in texts))
    inside_a_word = [c for c in characters
                     if [w for w, _ in tokenizer.pre_tokenizer.pre_tokenize_str("a" + c)] == ["a" + c]]
    return sorted("##" + c for c in inside_a_word)


def encode_documents(tokenizer: Tokenizer, documents: list[list[str]], separator: str | None) -> np.ndarray:
    """All documents as one id stream, each followed by the separator token (if any)."""
    encodings = tokenizer.encode_batch([document_text(d) for d in documents], add_special_tokens=False)
    sep = [tokenizer.token_to_id(separator)] if separator else []
    ids = [i for e in encodings for i in [*e.ids, *sep]]
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 2**16 else np.uint32
    return np.array(ids, dtype=dtype)


def prepare_tokenizers(corpus_dir: str, output_dir: str, tokenizers: dict) -> dict:
    """The `train_tokenizers` stage: for each configured tokenizer, `<name>/tokenizer.json` and
    `<name>/{train,validation}.npy` (the encoded corpus), plus summary.json."""
    train = read_documents(corpus_dir, "train")
    validation = read_documents(corpus_dir, "validation")
    summary = {}
    with atomic_directory(output_dir) as tmp:
        for name, spec in tokenizers.items():
            tokenizer = train_tokenizer(spec["kind"], [document_text(d) for d in train], spec["vocab_size"],
                                        spec.get("lowercase", False), spec.get("special_tokens"))
            (tmp / name).mkdir()
            tokenizer.save(str(tmp / name / "tokenizer.json"))
            separator = spec.get("document_separator")
            counts = {}
            for split, documents in (("train", train), ("validation", validation)):
                ids = encode_documents(tokenizer, documents, separator)
                np.save(tmp / name / f"{split}.npy", ids)
                counts[f"{split}_tokens"] = int(len(ids))
            summary[name] = {"kind": spec["kind"], "vocab_size": tokenizer.get_vocab_size(), **counts}
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer.json, or a Hugging Face model folder's tokenizer (a published start's, published.py)."""
    path = Path(path)
    if path.is_dir():
        from transformer_lab.data.published import folder_tokenizer

        return folder_tokenizer(path)
    if not path.is_file():
        raise DataError(f"{path}: tokenizer not found; run `dvc repro train_tokenizers`")
    return Tokenizer.from_file(str(path))
