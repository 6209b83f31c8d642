"""ATIS evaluation: joint intent + slot scores of predictions against gold string labels, as ATIS
papers report them, and the evaluator of a trained checkpoint on a prepared split (metrics, per-slot
F1, the intent confusion matrix), logged into the training run."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig
from seqeval.metrics import classification_report, f1_score

from transformer_lab.data.atis import read_prepared_split
from transformer_lab.tasks.checkpoints import load_task
from transformer_lab.tasks.joint_intent_slot import JointIntentSlotTask
from transformer_lab.tracking import runs as tracking
from transformer_lab.tracking.evaluations import log_into_training_run
from transformer_lab.utils import plots
from transformer_lab.utils.io import atomic_write_json, write_csv


def score_predictions(gold: list[dict], predicted: list[dict]) -> dict:
    """gold/predicted: [{"slots": [tag per word], "intent": str}]. Fractions in 0-1.

    token accuracies count real words only (never padding); non-O token accuracy is the
    accuracy on words whose gold tag is not O (the lecture's metric).
    """
    if len(gold) != len(predicted):
        raise ValueError(f"{len(predicted)} predictions for {len(gold)} examples")
    gold_tags = [g["slots"] for g in gold]
    pred_tags = [p["slots"] for p in predicted]
    pairs = [(g, p) for gs, ps in zip(gold_tags, pred_tags) for g, p in zip(gs, ps)]
    non_o = [(g, p) for g, p in pairs if g != "O"]
    intent_right = [g["intent"] == p["intent"] for g, p in zip(gold, predicted)]
    sentence_right = [i and g == p for i, g, p in zip(intent_right, gold_tags, pred_tags)]
    return {
        "intent_acc": sum(intent_right) / len(gold),
        "slot_f1": float(f1_score(gold_tags, pred_tags)),
        "sentence_acc": sum(sentence_right) / len(gold),
        "token_acc": sum(g == p for g, p in pairs) / len(pairs),
        "non_o_token_acc": sum(g == p for g, p in non_o) / max(len(non_o), 1),
        "n_utterances": len(gold),
    }


def per_slot_f1(gold: list[dict], predicted: list[dict]) -> list[dict]:
    report = classification_report([g["slots"] for g in gold], [p["slots"] for p in predicted],
                                    output_dict=True, zero_division=0)
    return [
        {"slot": name, "f1": round(float(v["f1-score"]), 4), "support": int(v["support"])}
        for name, v in sorted(report.items())
        if not name.endswith(" avg")
    ]


def intent_confusion(gold: list[dict], predicted: list[dict]) -> list[dict]:
    """One row per utterance, as DVC's confusion-matrix template expects."""
    return [{"actual": g["intent"], "predicted": p["intent"]} for g, p in zip(gold, predicted)]


def evaluate(cfg: DictConfig) -> dict:
    """Joint intent + slot scores of a checkpoint on a prepared ATIS split."""
    tracking.check_tracking(cfg)
    torch.manual_seed(cfg.seed)
    output_dir = Path(cfg.paths.output_dir)
    task = load_task(cfg.checkpoint, JointIntentSlotTask, "train_atis")
    gold = read_prepared_split(cfg.data.prepared_dir, cfg.split)
    predicted = task.predict([g["words"] for g in gold])
    metrics = score_predictions(gold, predicted)
    slot_rows, confusion_rows = per_slot_f1(gold, predicted), intent_confusion(gold, predicted)

    metrics_path = output_dir / "metrics.json"
    atomic_write_json(metrics_path, {f"{cfg.split}/{k}": v for k, v in metrics.items()})
    write_csv(output_dir / "per_slot_f1.csv", slot_rows)
    write_csv(output_dir / "intent_confusion.csv", confusion_rows)
    figures = [
        plots.confusion_matrix(confusion_rows, output_dir / "intent_confusion.png", f"intent confusion ({cfg.split})"),
        plots.per_label_bars(slot_rows, "slot", "f1", output_dir / "per_slot_f1.png", f"slot F1 by type ({cfg.split})"),
    ]
    log_into_training_run(cfg, {f"{cfg.split}/{k}": v for k, v in metrics.items()},
                          [metrics_path, output_dir / "per_slot_f1.csv", output_dir / "intent_confusion.csv", *figures])
    return metrics
