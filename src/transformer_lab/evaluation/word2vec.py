"""word2vec evaluation: the trained vectors exported in word2vec text format, scored on WordSim-353,
SimLex-999 and the Google analogies (gensim's evaluators), with nearest neighbours and a 2-D map."""

from __future__ import annotations

from omegaconf import DictConfig

from transformer_lab.data import word_vectors
from transformer_lab.tasks.checkpoints import load_task
from transformer_lab.tasks.word2vec import Word2VecTask
from transformer_lab.tracking import runs as tracking
from transformer_lab.tracking.evaluations import log_into_training_run


def evaluate(cfg: DictConfig) -> dict:
    """Export the trained vectors (word2vec text format), score them on WordSim-353, SimLex-999
    and the Google analogies, list nearest neighbours and draw a 2-D map."""
    tracking.check_tracking(cfg)

    task = load_task(cfg.checkpoint, Word2VecTask, "pretrain_word2vec")
    metrics, files = word_vectors.write_evaluation(cfg.paths.output_dir, *task.vectors(), cfg.probe_words,
                                                   cfg.projection_words)
    log_into_training_run(cfg, {f"eval/{k}": v for k, v in metrics.items()}, files)
    return metrics
