"""A synthetic "order is everything" task in ATIS's schema, for ablations of position information.

An utterance is a sequence of number words `w0 .. w{vocab_size-1}` (the word wK stands for the
number K), drawn uniformly. Its slot tags say how each word compares with the word just before
it: `B-up` (higher), `B-down` (lower), `B-same` (equal), and `O` for the first word, which has
no predecessor. Its intent says whether the first word is higher than the last one
(`first_higher`, else `first_not_higher`).

Why position is needed: both labels depend only on which word stands next to which (and which
stands first and last). Self-attention without positional encodings is permutation-equivariant,
so it sees an utterance as a bag of words: two orderings of the same words get the same
representations, while their tags differ. An encoder without positions can only guess.

Train and dev lengths are uniform in [min_length, max_length]; every test utterance has
`test_length` words, so the test set measures length extrapolation (e.g. train up to 64 words,
test at 128). Each split has its own random stream from the seed, so changing n_train leaves the
dev and test utterances as they were, and a larger n_train only adds utterances after the others.

Pure Python and numpy; `load_atis(source="synthetic_order")` returns it in ATIS's schema
{"words", "slots", "intent"} per example, so the ATIS preparation, datamodule and joint
intent + slot model take it unchanged.
"""

from __future__ import annotations

import itertools

import numpy as np

from transformer_lab.errors import DataError

SPLIT_STREAMS = {"train": 0, "dev": 1, "test": 2}  # one random stream per split, from the seed
FIRST_HIGHER, FIRST_NOT_HIGHER = "first_higher", "first_not_higher"


def number_word(value: int) -> str:
    return f"w{value}"


def order_tags(values: list[int]) -> list[str]:
    """O for the first word, then B-up / B-down / B-same against the word just before."""
    tags = ["O"]
    for before, value in itertools.pairwise(values):
        tags.append("B-up" if value > before else "B-down" if value < before else "B-same")
    return tags


def order_intent(values: list[int]) -> str:
    return FIRST_HIGHER if values[0] > values[-1] else FIRST_NOT_HIGHER


def order_example(values: list[int]) -> dict:
    """One utterance of the given numbers in ATIS's schema."""
    return {"words": [number_word(v) for v in values], "slots": order_tags(values), "intent": order_intent(values)}


def generate_order_sample(seed: int = 0, n_train: int = 3000, n_dev: int = 500, n_test: int = 500,
                          vocab_size: int = 16, min_length: int = 8, max_length: int = 64,
                          test_length: int = 128) -> dict[str, list[dict]]:
    """{train, dev, test}: lists of examples (see the module docstring); the same for the same settings."""
    if vocab_size < 2:
        raise DataError(f"data.synthetic_order.vocab_size={vocab_size}: at least 2 number words are needed")
    if not 2 <= min_length <= max_length:
        raise DataError(f"data.synthetic_order: lengths [{min_length}, {max_length}] must satisfy "
                        "2 <= min_length <= max_length")
    if test_length < 2:
        raise DataError(f"data.synthetic_order.test_length={test_length}: at least 2 words are needed")
    sizes = {"train": n_train, "dev": n_dev, "test": n_test}
    splits = {}
    for split, size in sizes.items():
        rng = np.random.default_rng([seed, SPLIT_STREAMS[split]])
        examples = []
        for _ in range(size):  # one utterance after another: a larger n_train extends a smaller one
            length = test_length if split == "test" else int(rng.integers(min_length, max_length + 1))
            examples.append(order_example(rng.integers(0, vocab_size, length).tolist()))
        splits[split] = examples
    return splits
