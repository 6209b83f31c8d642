"""Prediction on free text from a trained checkpoint."""

from __future__ import annotations

from transformer_lab.errors import TransformerLabError


def predict_text(task, text: str) -> dict:
    words = text.split()
    if not words:
        raise TransformerLabError("text is empty: pass text=\"show me flights from boston to denver\"")
    max_words = task.model.config.max_len - 1
    if len(words) > max_words:
        raise TransformerLabError(f"text has {len(words)} words; this model reads at most {max_words}")
    result = task.predict([words])[0]
    return {"intent": result["intent"], "words": words, "slots": result["slots"]}


def format_prediction(prediction: dict) -> str:
    width = max(len(w) for w in prediction["words"])
    lines = [f"intent: {prediction['intent']}"]
    lines += [f"  {w:<{width}}  {t}" for w, t in zip(prediction["words"], prediction["slots"])]
    return "\n".join(lines)
