"""ELMo evaluation: the forward LM's per-word perplexity on the held-out sentences, and whether its
vectors are contextual, the paper's "play" example (Peters et al., 2018, table 4) on this corpus.

For each probe word, every occurrence in the held-out sentences gets its nearest neighbour among
all the other words of those sentences, by cosine, once with the top biLM layer and once with
the character layer (layer 0). Layer 0 knows no context: a word's nearest neighbour is the same
word, at cosine 1, wherever it appears. The top layer's neighbours depend on the sentence; the
mean cosine between a word's occurrences says how much (1.0 = no context at all).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from transformer_lab.data.corpus import read_documents
from transformer_lab.data.elmo import words_of
from transformer_lab.tasks.checkpoints import load_task
from transformer_lab.tasks.elmo import ElmoPretrainingTask
from transformer_lab.tracking import runs as tracking
from transformer_lab.tracking.evaluations import log_into_training_run
from transformer_lab.utils.io import atomic_write_json, atomic_write_text


def contextual_neighbours(task: ElmoPretrainingTask, sentences: list[list[str]], probes: list[str],
                          per_probe: int = 3) -> tuple[list[dict], dict[str, float]]:
    """(neighbour rows, summary metrics) for the probe words' occurrences in `sentences`."""
    layers = task.features(sentences)
    where = [(s, i) for s, sentence in enumerate(sentences) for i in range(len(sentence))]
    # Centred before the cosine: every state of a small LM shares one large common direction, which
    # would make every pair look alike (cosine ~0.99) and hide what differs.
    by_layer = {}
    for name, index in (("token", 0), ("top", -1)):
        states = torch.cat([layer[index] for layer in layers])
        by_layer[name] = F.normalize(states - states.mean(0), dim=-1)
    rows, same_word, within = [], {"token": [], "top": []}, {"token": [], "top": []}
    for probe in probes:
        occurrences = [k for k, (s, i) in enumerate(where) if sentences[s][i] == probe]
        for name, vectors in by_layer.items():
            if len(occurrences) > 1:
                pair = vectors[occurrences] @ vectors[occurrences].T
                within[name].append(float(pair[~torch.eye(len(occurrences), dtype=torch.bool)].mean()))
        for k in occurrences[:per_probe]:
            s, i = where[k]
            row = {"word": probe, "sentence": in_context(sentences[s], i)}
            for name, vectors in by_layer.items():
                similarity = vectors @ vectors[k]
                similarity[[j for j, (t, _) in enumerate(where) if t == s]] = -2.0  # other sentences only
                best = int(similarity.argmax())
                t, j = where[best]
                same_word[name].append(sentences[t][j] == probe)
                row[f"{name}_neighbour"] = sentences[t][j]
                row[f"{name}_neighbour_sentence"] = in_context(sentences[t], j)
                row[f"{name}_cosine"] = round(float(similarity[best]), 4)
            rows.append(row)
    summary = {}
    for name in by_layer:
        if same_word[name]:
            summary[f"{name}_neighbour_same_word"] = sum(same_word[name]) / len(same_word[name])
        if within[name]:
            summary[f"{name}_same_word_cosine"] = sum(within[name]) / len(within[name])
    return rows, summary


def in_context(words: list[str], i: int, reach: int = 6) -> str:
    """Up to `reach` words either side of words[i], which is marked [like this]."""
    left, right = words[max(0, i - reach):i], words[i + 1:i + 1 + reach]
    return " ".join(["..."] * (i > reach) + left + [f"[{words[i]}]"] + right + ["..."] * (i + 1 + reach < len(words)))


def neighbours_markdown(rows: list[dict]) -> str:
    lines = ["| word in its sentence | top layer: nearest word in another sentence (cosine) | layer 0 |", "|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['sentence']} | {r['top_neighbour_sentence']} ({r['top_cosine']:.2f}) | "
                     f"{r['token_neighbour']} ({r['token_cosine']:.2f}) |")
    return "\n".join(lines) + "\n"


def evaluate(cfg: DictConfig) -> dict:
    """Per-word perplexity of the forward LM on the held-out split, and the contextual neighbours."""
    tracking.check_tracking(cfg)
    task = load_task(cfg.checkpoint, ElmoPretrainingTask, "pretrain_elmo")
    documents = read_documents(cfg.data.prepared_dir, "validation")
    sentences = [s for s in (words_of(sentence) for document in documents for sentence in document) if s]
    total, words = task.forward_word_nll(sentences)
    metrics = {"val_word_ppl": math.exp(total / words), "val_words": words}
    pool = [s for s in sentences if len(s) <= task.preprocessor.max_len - 2][: cfg.neighbour_sentences]
    rows, summary = contextual_neighbours(task, pool, list(cfg.probe_words))
    metrics.update(summary)

    output_dir = Path(cfg.paths.output_dir)
    atomic_write_json(output_dir / "metrics.json", metrics)
    atomic_write_text(output_dir / "neighbours.json", json.dumps(rows, indent=1) + "\n")
    atomic_write_text(output_dir / "neighbours.md", neighbours_markdown(rows))
    log_into_training_run(cfg, {f"eval/{k}": v for k, v in metrics.items()},
                          [output_dir / "metrics.json", output_dir / "neighbours.json", output_dir / "neighbours.md"])
    return metrics
