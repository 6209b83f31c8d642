import random

import pytest
import seqeval.metrics

from transformer_lab.evaluation.atis import per_slot_f1, score_predictions
from transformer_lab.tasks.metrics import SlotF1, extract_chunks


def random_tags(rng: random.Random, length: int) -> list[str]:
    # Includes ill-formed sequences (I- after O, type switches inside I-) on purpose.
    return [rng.choice(["O", "O", "B-a", "I-a", "B-b.c", "I-b.c"]) for _ in range(length)]


def test_slot_f1_matches_seqeval_on_random_sequences():
    rng = random.Random(0)
    for _ in range(50):
        gold = [random_tags(rng, rng.randint(1, 12)) for _ in range(8)]
        pred = [[t if rng.random() < 0.7 else rng.choice(["O", "B-a", "I-a", "B-b.c", "I-b.c"]) for t in g] for g in gold]
        metric = SlotF1()
        metric.update(pred[:4], gold[:4])
        metric.update(pred[4:], gold[4:])  # accumulates over batches
        assert metric.compute().item() == pytest.approx(seqeval.metrics.f1_score(gold, pred), abs=1e-6)


def test_chunks_follow_conlleval():
    assert extract_chunks(["B-a", "I-a", "O", "I-b", "I-b", "B-b"]) == {("a", 0, 1), ("b", 3, 4), ("b", 5, 5)}
    assert extract_chunks(["B-a", "I-b"]) == {("a", 0, 0), ("b", 1, 1)}
    assert extract_chunks(["O", "O"]) == set()


def test_slot_f1_empty_is_zero_not_nan():
    metric = SlotF1()
    metric.update([["O"]], [["O"]])
    assert metric.compute().item() == 0.0


def test_score_predictions_counts_real_words_only():
    gold = [{"intent": "flight", "slots": ["O", "B-to", "I-to"]}, {"intent": "airfare", "slots": ["O", "O"]}]
    pred = [{"intent": "flight", "slots": ["O", "B-to", "O"]}, {"intent": "airfare", "slots": ["O", "O"]}]
    scores = score_predictions(gold, pred)
    assert scores["intent_acc"] == 1.0
    assert scores["token_acc"] == pytest.approx(4 / 5)
    assert scores["non_o_token_acc"] == pytest.approx(1 / 2)
    assert scores["slot_f1"] == 0.0  # the one entity is cut short: no exact match
    assert scores["sentence_acc"] == pytest.approx(1 / 2)
    rows = per_slot_f1(gold, pred)
    assert rows == [{"slot": "to", "f1": 0.0, "support": 1}]

