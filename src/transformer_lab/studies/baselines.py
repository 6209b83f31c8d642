"""Study variants that are no transformer: what a score means only beside them. Each runner takes
the job's seed and folder and returns {"metrics", "params", "seconds"} (studies/jobs.py)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path


def constant_tagger(prepared_dir: str, seed: int, output_dir: str, split: str = "dev") -> dict:
    """Tags every ATIS word O and gives every utterance the most common training intent: the score
    a tagger reaches by learning nothing. Token accuracy counts its O tags as right (most words are
    O); slot F1, over the slots themselves, gives it 0."""
    import pandas as pd

    started = time.perf_counter()
    train = pd.read_parquet(Path(prepared_dir, "train.parquet"))
    rows = pd.read_parquet(Path(prepared_dir, f"{split}.parquet"))
    majority = Counter(train["intent"]).most_common(1)[0][0]
    tags = [tag for slots in rows["slots"] for tag in slots]
    stage = "val" if split == "dev" else split
    metrics = {f"{stage}/token_acc": sum(tag == "O" for tag in tags) / len(tags),
               f"{stage}/non_o_token_acc": 0.0,
               f"{stage}/slot_f1": 0.0,  # no slot predicted: precision undefined, recall 0, F1 0 (seqeval's convention)
               f"{stage}/intent_acc": float((rows["intent"] == majority).mean()),
               f"{stage}/sentence_acc": float(sum(all(t == "O" for t in slots) and intent == majority
                                                  for slots, intent in zip(rows["slots"], rows["intent"])) / len(rows))}
    return {"metrics": metrics, "params": 0, "seconds": time.perf_counter() - started}


def image_baseline(kind: str, prepared_dir: str, seed: int, output_dir: str, train_fraction: float = 1.0,
                   steps: int | None = None, batch_size: int = 64, **settings) -> dict:
    """The logistic regression or the small CNN of training/image_baselines.py on the same training
    fraction as the ViT (the same stratified subset: data.seed picks it, the job's seed the weights).
    steps: the CNN trains for the epochs that make this many optimiser steps (at least one epoch),
    as the ViT beside it does with trainer.max_steps."""
    import math

    from transformer_lab.data.images import read_training_split
    from transformer_lab.training import image_baselines

    if kind == "small_cnn":
        settings["batch_size"] = batch_size
        if steps:
            images = len(read_training_split(prepared_dir, train_fraction, settings.get("subset_seed", 0))[1])
            settings["epochs"] = max(1, round(steps / math.ceil(images / batch_size)))
    fit = {"logistic_regression": image_baselines.logistic_regression, "small_cnn": image_baselines.small_cnn}[kind]
    result = fit(prepared_dir, seed=seed, train_fraction=train_fraction, **settings)
    return {"metrics": {"test/acc": result["test_acc"], "val/acc": result["val_acc"]},
            "params": result["params"], "seconds": result["seconds"]}
