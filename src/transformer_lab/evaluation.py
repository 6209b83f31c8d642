"""Scores of joint intent + slot predictions against gold string labels, as ATIS papers report them."""

from __future__ import annotations

from seqeval.metrics import classification_report, f1_score


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
