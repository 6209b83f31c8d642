"""Word vectors after training: export in word2vec text format, and the standard intrinsic
evaluations run by gensim (WordSim-353, SimLex-999, the Google analogy set)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from transformer_lab.utils.io import atomic_write_json, atomic_write_text, write_csv

ANALOGY_QUESTIONS = 19544  # questions in gensim's questions-words.txt


def save_word2vec_format(path: str | Path, words: list[str], vectors: np.ndarray) -> None:
    """The text format of the original word2vec: a 'count dim' header, then 'word v1 v2 ...' per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f"{len(words)} {vectors.shape[1]}\n")
        for word, vector in zip(words, vectors):
            f.write(word + " " + " ".join(f"{x:.6f}" for x in vector) + "\n")
    os.replace(tmp, path)


def load_word2vec_format(path: str | Path) -> tuple[list[str], np.ndarray]:
    """Read vectors in word2vec text format (this project's export, gensim's, the original tool's)."""
    from transformer_lab.errors import DataError

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: word vectors not found; run `dvc repro evaluate_word2vec` (it exports them)")
    with path.open(encoding="utf-8") as f:
        header = f.readline().split()
        if len(header) != 2 or not all(h.isdigit() for h in header):
            raise DataError(f"{path}:1: expected a 'count dim' header, found {' '.join(header)[:40]!r}")
        count, dim = map(int, header)
        words, rows = [], []
        for number, line in enumerate(f, 2):
            parts = line.rstrip("\n").split(" ")
            if len(parts) != dim + 1:
                raise DataError(f"{path}:{number}: {len(parts) - 1} values, expected {dim}")
            words.append(parts[0])
            rows.append(np.asarray(parts[1:], dtype=np.float32))
    if len(words) != count:
        raise DataError(f"{path}: header says {count} words, file has {len(words)}")
    return words, np.stack(rows)


def keyed_vectors(words: list[str], vectors: np.ndarray):
    from gensim.models import KeyedVectors

    kv = KeyedVectors(vectors.shape[1])
    kv.add_vectors(words, vectors.astype(np.float32))
    return kv


def intrinsic_scores(kv) -> dict[str, float]:
    """Spearman correlations with human similarity judgements, analogy accuracy, and how much
    of each benchmark the vocabulary covers (oov_* = fraction skipped)."""
    import logging

    logging.getLogger("gensim").setLevel(logging.ERROR)  # it logs every skipped pair
    from gensim.test.utils import datapath
    scores = {}
    for name, file in (("wordsim", "wordsim353.tsv"), ("simlex", "simlex999.txt")):
        _, spearman, oov_percent = kv.evaluate_word_pairs(datapath(file))
        scores[f"{name}_spearman"] = float(spearman.statistic) if not np.isnan(spearman.statistic) else 0.0
        scores[f"{name}_oov"] = oov_percent / 100
    accuracy, sections = kv.evaluate_word_analogies(datapath("questions-words.txt"))
    total = sections[-1]
    answered = len(total["correct"]) + len(total["incorrect"])
    scores["analogy_acc"] = float(accuracy) if answered else 0.0
    scores["analogy_oov"] = 1 - answered / ANALOGY_QUESTIONS
    return scores


def nearest_neighbours(kv, probes: list[str], topn: int = 8) -> dict[str, list[tuple[str, float]]]:
    return {w: [(n, round(float(s), 4)) for n, s in kv.most_similar(w, topn=topn)] for w in probes if w in kv}


def projection(kv, n_words: int = 300) -> list[dict]:
    """The most frequent words projected on their first two principal components."""
    words = kv.index_to_key[:n_words]
    vectors = kv[words] / np.linalg.norm(kv[words], axis=1, keepdims=True).clip(min=1e-8)
    centred = vectors - vectors.mean(0)
    _, _, axes = np.linalg.svd(centred, full_matrices=False)
    xy = centred @ axes[:2].T
    return [{"word": w, "x": round(float(x), 4), "y": round(float(y), 4)} for w, (x, y) in zip(words, xy)]


def write_evaluation(output_dir: str | Path, words: list[str], vectors: np.ndarray, probe_words: list[str],
                     projection_words: int) -> tuple[dict, list[Path]]:
    """What every word-vector evaluation writes (word2vec's, GloVe's): vectors.txt in word2vec text
    format, metrics.json (the intrinsic scores and vocab_size), neighbours.json of the probe words,
    projection.csv and its 2-D map. Returns the metrics and the files to log with them."""
    from transformer_lab.utils import plots  # matplotlib: only where a map is drawn, not for every reader of vectors

    output_dir = Path(output_dir)
    save_word2vec_format(output_dir / "vectors.txt", words, vectors)
    kv = keyed_vectors(words, vectors)
    metrics = intrinsic_scores(kv)
    metrics["vocab_size"] = len(words)
    rows = projection(kv, projection_words)
    atomic_write_json(output_dir / "metrics.json", metrics)
    atomic_write_text(output_dir / "neighbours.json",
                      json.dumps(nearest_neighbours(kv, list(probe_words)), indent=1) + "\n")
    write_csv(output_dir / "projection.csv", rows)
    figure = plots.word_map(rows, output_dir / "projection.png")
    return metrics, [output_dir / "metrics.json", output_dir / "neighbours.json", figure]
