"""Text corpora in one schema, documents -> sentences -> text, for every language model.

Sources: `builtin` (gensim's shipped Lee news corpus, one document per line), `local`
(any text files; documents separated by blank lines, or one per line), `hub`
(Salesforce/wikitext; documents start at its top-level ` = Title = ` headings).
Document boundaries and sentence order are kept: BERT's next-sentence task needs them.
"""

from __future__ import annotations

import json
import random
import re
import unicodedata
from pathlib import Path

from transformer_lab.data.checks import require_file
from transformer_lab.data.hub import load_hub_dataset
from transformer_lab.errors import DataError
from transformer_lab.utils.io import atomic_directory, decode_utf8

SPLITS = ("train", "validation")
# A sentence ends at . ! or ? (plus closing quotes/brackets) followed by space and a capital or digit.
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[\"'(\[]?[A-Z0-9])")
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def builtin_corpus_path() -> Path:
    import logging

    logging.getLogger("gensim").setLevel(logging.WARNING)  # importing its test utilities logs demo objects
    from gensim.test.utils import datapath

    return Path(datapath("lee_background.cor"))


def read_text_file(path: str | Path) -> str:
    path = Path(path)
    require_file(path, "a text file", "text file not found")
    raw = path.read_bytes()
    if not raw.strip():
        raise DataError(f"{path}: file is empty")
    if b"\x00" in raw[:65536]:
        raise DataError(f"{path}: looks binary (NUL byte at offset {raw.index(bytes(1))}), expected UTF-8 text")
    return decode_utf8(path, raw)


def split_documents(text: str, separator: str) -> list[str]:
    if separator == "line":
        parts = text.splitlines()
    elif separator == "blank_line":
        parts = re.split(r"\n\s*\n", text)
    else:
        raise DataError(f"data.document_separator={separator!r} is not 'line' or 'blank_line'")
    return [" ".join(p.split()) for p in parts if p.strip()]


def split_sentences(document: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(document) if s.strip()]


def normalise(text: str, lowercase: bool, unicode_form: str | None) -> str:
    if unicode_form:
        text = unicodedata.normalize(unicode_form, text)
    return text.lower() if lowercase else text


def word_tokens(sentence: str) -> list[str]:
    """Lower-cased words and numbers: the tokenisation word2vec and its benchmarks use."""
    return _WORD.findall(sentence.lower())


def load_hub_documents(hub_id: str, config_name: str) -> list[str]:
    dataset = load_hub_dataset(hub_id, config_name, local_hint="data.local_paths=[FILE]")
    documents, current = [], []
    for split in ("train", "validation", "test"):
        for line in dataset[split]["text"]:
            if re.match(r"^ = [^=].* = $", line.rstrip("\n")):  # a top-level heading starts a new article
                if current:
                    documents.append(" ".join(current))
                current = []
            elif line.strip() and not line.startswith(" = "):
                current.append(line.strip())
    if current:
        documents.append(" ".join(current))
    return documents


def load_documents(source: str, local_paths: list[str] | str | None = None, document_separator: str = "blank_line",
                   hub_id: str = "Salesforce/wikitext", hub_config: str = "wikitext-2-raw-v1") -> list[str]:
    if source == "builtin":
        return split_documents(read_text_file(builtin_corpus_path()), "line")
    if source == "local":
        if isinstance(local_paths, (str, Path)):  # one file given without brackets
            local_paths = [local_paths]
        if not local_paths:
            raise DataError("data.local_paths must list at least one text file when data.source=local")
        return [doc for path in local_paths for doc in split_documents(read_text_file(path), document_separator)]
    if source == "hub":
        return load_hub_documents(hub_id, hub_config)
    raise DataError(f"data.source={source!r} is not one of builtin, local, hub")


def prepare(source: str, output_dir: str, local_paths: list[str] | None = None, document_separator: str = "blank_line",
            hub_id: str = "Salesforce/wikitext", hub_config: str = "wikitext-2-raw-v1", lowercase: bool = False,
            unicode_form: str | None = "NFKC", validation_fraction: float = 0.1, seed: int = 0) -> dict:
    """The `prepare_corpus` stage: {train,validation}.parquet with one row per document
    (doc_id, sentences), split by document with a seeded shuffle, and summary.json."""
    import datasets

    documents = load_documents(source, local_paths, document_separator, hub_id, hub_config)
    rows = [{"doc_id": i, "sentences": [normalise(s, lowercase, unicode_form) for s in split_sentences(doc)]}
            for i, doc in enumerate(documents)]
    rows = [r for r in rows if r["sentences"]]
    if len(rows) < 2:
        raise DataError(f"the {source} corpus has {len(rows)} document(s); need at least 2 to hold one out")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_validation = max(1, round(validation_fraction * len(rows)))
    held_out = set(order[:n_validation])
    splits = {"train": [r for i, r in enumerate(rows) if i not in held_out],
              "validation": [r for i, r in enumerate(rows) if i in held_out]}
    summary = {"source": source, "lowercase": lowercase, "unicode_form": unicode_form}
    for name, docs in splits.items():
        sentences = [s for d in docs for s in d["sentences"]]
        summary[name] = {"documents": len(docs), "sentences": len(sentences),
                         "words": sum(len(word_tokens(s)) for s in sentences), "characters": sum(map(len, sentences))}
    datasets.disable_progress_bars()
    with atomic_directory(output_dir) as tmp:
        for name, docs in splits.items():
            datasets.Dataset.from_list(docs).to_parquet(str(tmp / f"{name}.parquet"))
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def read_documents(prepared_dir: str | Path, split: str) -> list[list[str]]:
    """The prepared split as documents, each a list of sentences."""
    import pyarrow.parquet as pq

    path = Path(prepared_dir) / f"{split}.parquet"
    if not path.is_file():
        raise DataError(f"{path}: prepared corpus not found; run `dvc repro prepare_corpus` or "
                        "`python pipelines/prepare.py data=corpus`")
    return pq.read_table(path, columns=["sentences"]).column("sentences").to_pylist()
