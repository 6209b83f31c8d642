"""The studies' own data steps (functions that study.prepare names): pre-training text made from a
task's training split, with its labels left out, as a prepared corpus (data/corpus.py's schema)."""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path

from transformer_lab.errors import DataError


def sentence_corpus(source: str, output_dir: str, column: str = "sentence", max_sentences: int | None = None,
                    validation_fraction: float = 0.02, seed: int = 0) -> dict:
    """A corpus of single sentences, one document each: the `column` of a TSV table's rows, the first
    max_sentences of them (SST-2's train.tsv: the sentences without their labels); or, with
    source=builtin, the project's embedded corpus. Returns the corpus' summary."""
    from transformer_lab.data.corpus import prepare

    if source == "builtin":
        return prepare("builtin", output_dir, validation_fraction=validation_fraction, seed=seed)
    path = Path(source)
    if not path.is_file():
        raise DataError(f"{path}: no such table (a TSV file with a {column!r} column)")
    with path.open(encoding="utf-8", newline="") as handle:
        rows = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        if column not in (rows.fieldnames or []):
            raise DataError(f"{path}: no column {column!r} (it has {', '.join(rows.fieldnames or [])})")
        sentences = [text for row in rows if (text := " ".join((row[column] or "").split()))]
    return _prepared(sentences[:max_sentences], output_dir, validation_fraction, seed)


def atis_utterances(prepared_dir: str, output_dir: str, validation_fraction: float = 0.1, seed: int = 0) -> dict:
    """A corpus of the prepared ATIS training utterances, one document each: the words the tagger
    reads (lower-cased as prepared), without their slots or intents. Returns the corpus' summary."""
    from transformer_lab.data.atis import read_prepared_split

    utterances = [" ".join(row["words"]) for row in read_prepared_split(prepared_dir, "train")]
    return _prepared(utterances, output_dir, validation_fraction, seed)


def _prepared(lines: list[str], output_dir: str, validation_fraction: float, seed: int) -> dict:
    """data/corpus.py's prepared corpus of these texts, one document a line."""
    from transformer_lab.data.corpus import prepare

    with tempfile.TemporaryDirectory() as folder:
        text = Path(folder, "corpus.txt")
        text.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return prepare("local", output_dir, local_paths=[str(text)], document_separator="line",
                       validation_fraction=validation_fraction, seed=seed)
