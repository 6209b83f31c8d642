"""GloVe evaluation: its vectors (w + w~) exported in word2vec text format and scored as word2vec's are
(evaluation/word2vec.py): WordSim-353, SimLex-999 and the Google analogies (gensim's evaluators), with
nearest neighbours and a 2-D map."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from transformer_lab.data import word_vectors
from transformer_lab.tasks.checkpoints import load_task
from transformer_lab.tasks.glove import GloVeTask
from transformer_lab.tracking import runs as tracking
from transformer_lab.tracking.evaluations import log_into_training_run
from transformer_lab.utils import plots
from transformer_lab.utils.io import atomic_write_json, atomic_write_text, write_csv


def evaluate(cfg: DictConfig) -> dict:
    """Export the trained vectors (vectors.txt, which `task.embeddings.init=glove` reads), score them
    on WordSim-353, SimLex-999 and the Google analogies, list nearest neighbours and draw a 2-D map."""
    tracking.check_tracking(cfg)

    task = load_task(cfg.checkpoint, GloVeTask, "pretrain_glove")
    words, vectors = task.vectors()
    output_dir = Path(cfg.paths.output_dir)
    word_vectors.save_word2vec_format(output_dir / "vectors.txt", words, vectors)
    kv = word_vectors.keyed_vectors(words, vectors)
    metrics = word_vectors.intrinsic_scores(kv)
    metrics["vocab_size"] = len(words)
    neighbours = word_vectors.nearest_neighbours(kv, list(cfg.probe_words))
    rows = word_vectors.projection(kv, cfg.projection_words)

    atomic_write_json(output_dir / "metrics.json", metrics)
    atomic_write_text(output_dir / "neighbours.json", json.dumps(neighbours, indent=1) + "\n")
    write_csv(output_dir / "projection.csv", rows)
    figure = plots.word_map(rows, output_dir / "projection.png")
    log_into_training_run(cfg, {f"eval/{k}": v for k, v in metrics.items()},
                          [output_dir / "metrics.json", output_dir / "neighbours.json", figure])
    return metrics
