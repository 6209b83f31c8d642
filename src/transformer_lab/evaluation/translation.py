"""Translation evaluation: sacreBLEU's BLEU and chrF of beam-search translations on every
prepared test split (and the validation split), sample translations, and the cross-attention
heads of the last decoder layer over one source as a plot."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from transformer_lab.data.translation import VALIDATION, local_splits, read_pairs
from transformer_lab.tasks.checkpoints import load_task
from transformer_lab.tasks.translation import TranslationTask, corpus_scores
from transformer_lab.tracking import runs as tracking
from transformer_lab.tracking.evaluations import log_into_training_run
from transformer_lab.utils import plots
from transformer_lab.utils.io import atomic_write_json, atomic_write_text


def evaluate(cfg: DictConfig) -> dict:
    """`bleu_<split>` and `chrf_<split>` for the validation split and every test_* split of the
    prepared data, translated with cfg.num_beams beams; samples.md, translations_<split>.txt and
    cross_attention.png beside metrics.json, all logged into the training run."""
    tracking.check_tracking(cfg)
    torch.manual_seed(cfg.seed)
    output_dir = Path(cfg.paths.output_dir)
    task = load_task(cfg.checkpoint, TranslationTask, "train_translation")
    p = task.preprocessor
    splits = [s for s in local_splits(cfg.data.prepared_dir, p.source_lang) if s == VALIDATION or s.startswith("test")]
    metrics, files, samples = {}, [], []
    for split in tqdm(splits, desc="translating", unit="split", disable=None):
        pairs = read_pairs(cfg.data.prepared_dir, split, p.source_lang, p.target_lang)
        if cfg.max_sentences:
            pairs = pairs[:cfg.max_sentences]
        hypotheses = task.predict([s for s, _ in pairs], num_beams=cfg.num_beams, length_penalty=cfg.length_penalty,
                                  batch_size=cfg.batch_size)
        scores = corpus_scores(hypotheses, [t for _, t in pairs])
        metrics[f"bleu_{split}"], metrics[f"chrf_{split}"] = round(scores["bleu"], 2), round(scores["chrf"], 2)
        metrics[f"sentences_{split}"] = len(pairs)
        path = output_dir / f"translations_{split}.txt"
        atomic_write_text(path, "".join(h + "\n" for h in hypotheses))
        files.append(path)
        if split != VALIDATION or len(splits) == 1:
            samples += [(split, source, reference, hypothesis)
                        for (source, reference), hypothesis in list(zip(pairs, hypotheses))[:cfg.samples]]
    lines = [f"# Sample translations ({p.source_lang} → {p.target_lang}, beam {cfg.num_beams})", ""]
    for split, source, reference, hypothesis in samples:
        lines += [f"- **{split}** source: {source}", f"  - reference: {reference}", f"  - model: {hypothesis}"]
    samples_path = output_dir / "samples.md"
    atomic_write_text(samples_path, "\n".join(lines) + "\n")

    # the last decoder layer's heads over the first sample's source, reading the model's own translation
    _, source, _, hypothesis = samples[0]
    source_tokens, target_tokens, weights = task.cross_attention(source, hypothesis or source)
    figure = plots.cross_attention_heads(weights[-1].numpy(), source_tokens, target_tokens,
                                         output_dir / "cross_attention.png",
                                         f"decoder layer {len(weights) - 1}: attention over the source, per head")
    metrics_path = output_dir / "metrics.json"
    atomic_write_json(metrics_path, metrics)
    log_into_training_run(cfg, metrics, [metrics_path, samples_path, figure, *files])
    return metrics
