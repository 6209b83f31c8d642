"""Pre-training examples from a corpus of single sentences (the masked LM alone): packing short
sentences into full examples without losing, splitting or reordering any."""

import pytest

from transformer_lab.data.bert import pack_sentences

SEP = 3


def test_packing_keeps_every_sentence_whole_and_in_order_and_never_overflows():
    sentences = [[10 + i] * length for i, length in enumerate([3, 4, 9, 1, 1, 1, 8, 2, 5])]
    packed = pack_sentences(sentences, 10, SEP)
    assert all(len(example) <= 10 for example in packed)
    unpacked = []
    for example in packed:
        sentence = []
        for token in [*example, SEP]:
            if token == SEP:
                unpacked.append(sentence)
                sentence = []
            else:
                sentence.append(token)
    assert unpacked == sentences
    # greedy: a sentence starts a new example only where it would not fit the current one
    assert [len(e) for e in packed] == [8, 9, 5, 8, 8]


@pytest.mark.parametrize("sentences", [[], [[5, 6]]])
def test_packing_nothing_or_one_sentence(sentences):
    assert pack_sentences(sentences, 4, SEP) == sentences
