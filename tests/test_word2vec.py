import math
from collections import Counter

import lightning as L
import numpy as np
import pytest
import torch

from transformer_lab.data.corpus import prepare, read_documents, split_sentences, word_tokens
from transformer_lab.data.word2vec import (
    Word2VecDataModule,
    build_vocabulary,
    encode_sentences,
    keep_probabilities,
    training_windows,
)
from transformer_lab.data.word_vectors import keyed_vectors, save_word2vec_format
from transformer_lab.errors import DataError
from transformer_lab.models.word2vec import Word2Vec, Word2VecConfig, huffman_tree
from transformer_lab.tasks.word2vec import Word2VecTask

TEXT = """The cat sat on the mat. The dog sat on the log! Did the cat see the dog?

A bird flew over the house. The bird sang a song. The cat watched the bird.

The sun rose over the hills. Farmers went to the fields. The dog ran after the cat."""


@pytest.fixture(scope="module")
def lee_corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "corpus"
    prepare("builtin", str(out))
    return out


def test_huffman_codes_are_prefix_free_and_shorter_for_frequent_words():
    counts = np.array([500, 300, 120, 60, 10, 5, 3, 1, 1])
    codes, points = huffman_tree(counts)
    strings = ["".join(map(str, c)) for c in codes]
    for i, a in enumerate(strings):
        for j, b in enumerate(strings):
            assert i == j or not b.startswith(a)
    lengths = [len(c) for c in codes]
    assert all(lengths[i] <= lengths[j] for i in range(len(counts)) for j in range(len(counts)) if counts[i] > counts[j])
    assert all(len(p) == len(c) for p, c in zip(points, codes))
    assert max(max(p) for p in points) == len(counts) - 2  # inner nodes 0..V-2, the root last
    assert sum(2.0 ** -len(c) for c in codes) == pytest.approx(1.0)  # a full binary tree (Kraft equality)


def test_hierarchical_softmax_is_a_distribution_over_the_vocabulary():
    counts = torch.tensor([50, 30, 12, 6, 4, 2, 1])
    model = Word2Vec(Word2VecConfig(vocab_size=7, dim=8, objective="hierarchical"), counts)
    torch.nn.init.normal_(model.output_vectors.weight)
    torch.nn.init.normal_(model.input_vectors.weight)
    context, mask = torch.full((7, 1), 3), torch.ones(7, 1, dtype=torch.bool)  # one context word: word 3
    log_probs = -model(context, mask, torch.arange(7)).loss
    assert log_probs.exp().sum().item() == pytest.approx(1.0, abs=1e-5)


def test_negative_sampling_noise_follows_unigram_to_the_three_quarters():
    counts = torch.tensor([1000, 400, 100, 30, 5])
    model = Word2Vec(Word2VecConfig(vocab_size=5, dim=4), counts)
    expected = counts.double() ** 0.75 / (counts.double() ** 0.75).sum()
    torch.testing.assert_close(model.noise.double(), expected, rtol=1e-6, atol=1e-7)
    torch.manual_seed(0)
    draws = model.noise_table[torch.randint(len(model.noise_table), (200_000,))]  # what training samples from
    frequencies = torch.bincount(draws, minlength=5).double() / 200_000
    torch.testing.assert_close(frequencies, expected, atol=0.005, rtol=0)


def test_subsampling_matches_gensim_and_keeps_rare_words():
    from gensim.models import Word2Vec as GensimWord2Vec

    rng = np.random.default_rng(0)
    vocabulary = [f"w{i}" for i in range(200)]
    zipf = 1 / np.arange(1, 201)
    sentences = [list(rng.choice(vocabulary, size=12, p=zipf / zipf.sum())) for _ in range(2000)]
    words, counts = build_vocabulary(sentences, min_count=1)
    keep = keep_probabilities(counts, 1e-3)
    gensim = GensimWord2Vec(min_count=1, sample=1e-3)
    gensim.build_vocab(sentences)
    theirs = np.array([gensim.wv.get_vecattr(w, "sample_int") / 2**32 for w in words])
    np.testing.assert_allclose(keep, theirs, atol=1e-6)
    assert keep[0] < 0.5 and keep[-1] == 1.0  # the most frequent word is thinned, the rarest always kept


def test_windows_stay_inside_sentences_and_reach():
    sentences = [np.array([0, 1, 2, 3, 4, 5]), np.array([6, 7, 8])]  # word id = position, sentence 2 from 6
    context, mask, centres = training_windows(sentences, np.ones(9), 2, np.random.default_rng(0))
    assert context.shape == (9, 4) and mask.shape == (9, 4)  # every token a centre (one effective word each)
    assert sorted(centres.tolist()) == list(range(9))
    same_sentence = lambda a, b: (a < 6) == (b < 6)  # noqa: E731
    for row, used, centre in zip(context, mask, centres):
        words = row[used]
        assert len(words) >= 1 and all(same_sentence(w, centre) and 0 < abs(int(w) - int(centre)) <= 2 for w in words)
        reach = max(abs(int(w) - int(centre)) for w in words)
        # a dynamic window is whole: every word within its reach and inside the sentence is used
        expected = {w for w in range(9) if same_sentence(w, centre) and 0 < abs(w - int(centre)) <= reach}
        assert set(words.tolist()) == expected
    kept = training_windows(sentences, np.array([1.0] * 6 + [0.0] * 3), 2, np.random.default_rng(0))[2]
    assert sorted(kept.tolist()) == list(range(6))  # a word with keep probability 0 is subsampled away


@pytest.mark.parametrize("architecture", ["skipgram", "cbow"])
@pytest.mark.parametrize("objective", ["negative", "hierarchical"])
def test_tiny_corpus_trains_and_the_loss_falls(lee_corpus, architecture, objective):
    dm = Word2VecDataModule(str(lee_corpus), min_count=5, batch_size=1024)
    task = Word2VecTask({**Word2VecConfig(vocab_size=len(dm.preprocessor.words), dim=32, architecture=architecture,
                                          objective=objective).to_dict()}, dm.preprocessor.to_state())
    L.seed_everything(0)
    before = torch.cat([task(b).loss for b in dm.val_dataloader()]).mean().item()
    trainer = L.Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(task, dm)
    with torch.no_grad():
        after = torch.cat([task(b).loss for b in dm.val_dataloader()]).mean().item()
    assert after < before - 0.1, (before, after)  # held-out loss, same examples before and after


def test_gradients_are_sparse_rows():
    model = Word2Vec(Word2VecConfig(vocab_size=50, dim=8), torch.ones(50))
    torch.nn.init.normal_(model.output_vectors.weight)  # word2vec starts them at zero: no input gradient yet
    model(torch.tensor([[3, 7], [4, 0]]), torch.tensor([[True, True], [True, False]]), torch.tensor([5, 6])).loss.sum().backward()
    grad = model.input_vectors.weight.grad
    assert grad.is_sparse and set(grad.coalesce().indices()[0].tolist()) <= {3, 4, 7, 0}
    assert set(torch.nonzero(grad.to_dense().abs().sum(1)).flatten().tolist()) == {3, 4, 7}  # padding moves nothing


@pytest.mark.parametrize("architecture,objective,shared_negatives", [
    ("skipgram", "negative", 1), ("skipgram", "hierarchical", 1), ("cbow", "hierarchical", 1),
    ("cbow", "negative", 1), ("cbow", "negative", 2),  # 2: two groups, the second padded
])
def test_closed_form_sgd_update_matches_autograd_and_sgd(architecture, objective, shared_negatives):
    counts = torch.tensor([90, 60, 40, 30, 20, 12, 8, 5, 3, 2])
    config = Word2VecConfig(vocab_size=10, dim=6, architecture=architecture, objective=objective,
                            update="batched", shared_negatives=shared_negatives)
    ours, reference = Word2Vec(config, counts), Word2Vec(config, counts)
    torch.manual_seed(0)
    for table in (ours.input_vectors, ours.output_vectors):
        torch.nn.init.normal_(table.weight, std=0.5)
    reference.load_state_dict(ours.state_dict())
    context = torch.tensor([[1, 2, 3, 0], [4, 4, 5, 9], [0, 7, 8, 0]])  # word 4 twice: its updates add up
    mask = torch.tensor([[True, True, True, False], [True, True, True, True], [False, True, True, False]])
    centres = torch.tensor([0, 6, 2])
    torch.manual_seed(1)  # the same noise words for both
    losses = reference(context, mask, centres).loss
    losses.sum().backward()
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    torch.manual_seed(1)
    torch.testing.assert_close(ours.sgd_update(context, mask, centres, lr=0.1), losses.detach())
    torch.testing.assert_close(ours.input_vectors.weight, reference.input_vectors.weight)
    torch.testing.assert_close(ours.output_vectors.weight, reference.output_vectors.weight)


def test_per_word_update_is_word2vecs_step_one_example_after_another():
    counts = torch.tensor([90, 60, 40, 30, 20, 12, 8, 5, 3, 2])
    config = Word2VecConfig(vocab_size=10, dim=6, architecture="cbow")
    assert (config.update, config.shared_negatives) == ("per_word", 1)  # the CBOW default: word2vec's order
    ours = Word2Vec(config, counts)
    one_by_one = Word2Vec(Word2VecConfig(**{**config.to_dict(), "update": "batched"}), counts)
    all_at_once = Word2Vec(Word2VecConfig(**{**config.to_dict(), "update": "batched"}), counts)
    torch.manual_seed(0)
    for table in (ours.input_vectors, ours.output_vectors):
        torch.nn.init.normal_(table.weight, std=0.5)
    one_by_one.load_state_dict(ours.state_dict())
    all_at_once.load_state_dict(ours.state_dict())
    # word 4 twice in one window, the second centre (6) in the third window, and a window with
    # no context: each example must read the rows as the ones before it left them
    context = torch.tensor([[1, 2, 3, 0], [4, 4, 5, 9], [0, 6, 8, 0], [3, 3, 3, 3]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True], [False, True, True, False],
                         [False, False, False, False]])
    centres = torch.tensor([0, 6, 2, 1])
    losses, rows = ours._per_word_steps(context, mask, centres, lr=0.5)

    assert (rows[:, 0] == centres).all()
    labels, weights = torch.tensor([[1.0] + [0.0] * 5]), torch.ones(1, 6)
    expected = []
    for i in range(len(centres)):  # the batched update on one example is that example's SGD step
        one_by_one.output_rows = lambda c, i=i: (rows[i : i + 1], labels, weights)
        expected.append(one_by_one.sgd_update(context[i : i + 1], mask[i : i + 1], centres[i : i + 1], lr=0.5))
    torch.testing.assert_close(losses, torch.cat(expected))
    torch.testing.assert_close(ours.input_vectors.weight, one_by_one.input_vectors.weight)
    torch.testing.assert_close(ours.output_vectors.weight, one_by_one.output_vectors.weight)
    all_at_once.output_rows = lambda c: (rows, labels, weights)
    all_at_once.sgd_update(context, mask, centres, lr=0.5)  # the same examples, all reading the starting rows
    assert not torch.allclose(ours.input_vectors.weight, all_at_once.input_vectors.weight, atol=1e-3)


def test_per_word_noise_words_follow_the_unigram_table():
    counts = torch.tensor([1000, 300, 100, 30, 10, 3])
    model = Word2Vec(Word2VecConfig(vocab_size=6, dim=2, architecture="cbow", negatives=20), counts)
    n = 5000
    torch.manual_seed(0)
    _, rows = model._per_word_steps(torch.zeros(n, 1, dtype=torch.long), torch.ones(n, 1, dtype=torch.bool),
                                    torch.zeros(n, dtype=torch.long), lr=0.0)
    frequencies = torch.bincount(rows[:, 1:].flatten(), minlength=6) / (n * 20)
    torch.testing.assert_close(frequencies, model.noise, atol=0.005, rtol=0)  # counts^0.75, normalised
    torch.manual_seed(0)
    assert torch.equal(model._per_word_steps(torch.zeros(n, 1, dtype=torch.long), torch.ones(n, 1, dtype=torch.bool),
                                             torch.zeros(n, dtype=torch.long), lr=0.0)[1], rows)  # seeded: repeats


def test_per_word_update_is_cbow_negative_on_cpu_float32_only():
    with pytest.raises(ValueError, match="update='per_word' is CBOW with negative sampling only"):
        Word2VecConfig(architecture="skipgram", update="per_word")
    with pytest.raises(ValueError, match="shared_negatives"):
        Word2VecConfig(architecture="cbow", update="per_word", shared_negatives=4)
    assert Word2VecConfig(architecture="skipgram").update == "batched"
    model = Word2Vec(Word2VecConfig(vocab_size=10, dim=4, architecture="cbow"), torch.arange(10, 0, -1)).double()
    with pytest.raises(ValueError, match="float32 tables on the CPU, not torch.float64"):
        model.sgd_update(torch.tensor([[1, 2]]), torch.tensor([[True, True]]), torch.tensor([3]), lr=0.1)


def test_shared_negatives_are_one_draw_per_group_and_cbow_only():
    model = Word2Vec(Word2VecConfig(vocab_size=10, dim=4, architecture="cbow", update="batched"), torch.arange(10, 0, -1))
    assert model.config.shared_negatives == 16  # the batched CBOW default
    model.config.shared_negatives = 3
    rows, labels, _ = model.output_rows(torch.arange(7))
    assert rows.shape == (7, 6) and rows[:, 0].tolist() == list(range(7))
    for group in (rows[0:3, 1:], rows[3:6, 1:]):
        assert (group == group[0]).all()  # one draw of K noise words per group of 3
    assert Word2VecConfig(architecture="skipgram").shared_negatives == 1
    with pytest.raises(ValueError, match="shared_negatives"):
        Word2VecConfig(architecture="skipgram", shared_negatives=4)


def test_export_loads_in_gensim(tmp_path):
    from gensim.models import KeyedVectors

    words = ["the", "cat", "o'neill", "2001"]
    vectors = np.random.default_rng(0).normal(size=(4, 7)).astype(np.float32)
    save_word2vec_format(tmp_path / "vectors.txt", words, vectors)
    loaded = KeyedVectors.load_word2vec_format(str(tmp_path / "vectors.txt"))
    assert loaded.index_to_key == words
    np.testing.assert_allclose(loaded[words], vectors, atol=1e-6)
    ours = keyed_vectors(words, vectors)
    assert ours.most_similar("cat", topn=1)[0][0] == loaded.most_similar("cat", topn=1)[0][0]


# ------------------------------------------------------------------ corpus preparation
def test_builtin_corpus_keeps_documents_and_sentence_order(lee_corpus):
    train, validation = read_documents(lee_corpus, "train"), read_documents(lee_corpus, "validation")
    assert len(train) + len(validation) == 300 and len(validation) == 30
    assert train[0][0].startswith("Hundreds of people have been forced to vacate their homes")
    assert train[0][1].startswith("A new blaze near Goulburn")


def test_local_text_splits_into_paragraph_documents(tmp_path):
    (tmp_path / "story.txt").write_text(TEXT)
    summary = prepare("local", str(tmp_path / "out"), local_paths=[str(tmp_path / "story.txt")], lowercase=True,
                      validation_fraction=0.34)
    assert summary["train"]["documents"] == 2 and summary["validation"]["documents"] == 1
    docs = read_documents(tmp_path / "out", "train") + read_documents(tmp_path / "out", "validation")
    assert sorted(len(d) for d in docs) == [3, 3, 3]
    assert all(s == s.lower() for d in docs for s in d)


def test_sentence_splitting_and_word_tokens():
    assert split_sentences("It rained. Then it stopped! Why? \"Yes.\" 3 left.") == [
        "It rained.", "Then it stopped!", "Why?", "\"Yes.\"", "3 left."]
    assert word_tokens("The U.S. didn't win 3-2.") == ["the", "u", "s", "didn't", "win", "3", "2"]


@pytest.mark.parametrize("content, message", [
    (b"", "file is empty"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "looks binary"),
    (b"caf\xe9 au lait\n", r":1: not valid UTF-8"),
])
def test_bad_text_input_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "input.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message):
        prepare("local", str(tmp_path / "out"), local_paths=[str(path)])
    assert not (tmp_path / "out").exists()


def test_wikitext_offline_is_a_clear_error(tmp_path, offline_hub):
    with pytest.raises(DataError, match="could not load 'Salesforce/wikitext' .*offline"):
        prepare("hub", str(tmp_path / "out"))
