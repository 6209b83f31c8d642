"""ELMo: characters give every word a vector, each direction sees only its own side, the losses
are the words' negative log-likelihoods, the scalar mix is a convex mix, and a tiny biLM trains."""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lab.data.elmo import BOS, EOS, UNK, ElmoPreprocessor, build_vocabulary, words_of
from transformer_lab.models.elmo import IGNORE_INDEX, ElmoBiLM, ElmoConfig, ScalarMix, reverse_padded

WORDS = [BOS, EOS, UNK, "the", "cat", "sat", "on", "mat", "."]


def save_tiny_bilm(path, words: list[str]):
    """A tiny biLM saved as `pretrain_elmo` saves one, for the tests of what reads ELMo features."""
    from test_pipelines import save_checkpoint

    from transformer_lab.tasks.elmo import ElmoPretrainingTask

    bilm = ElmoPretrainingTask({"vocab_size": len(words), "size": "tiny", "hidden_dim": 32, "projection_dim": 16},
                               ElmoPreprocessor(words).to_state())
    save_checkpoint(bilm, path)
    return bilm


@pytest.fixture
def model_and_preprocessor():
    torch.manual_seed(0)
    model = ElmoBiLM(ElmoConfig(vocab_size=len(WORDS), dropout=0.0)).eval()
    return model, ElmoPreprocessor(WORDS, max_word_chars=20, max_len=16)


def test_every_word_has_a_vector_from_its_characters_alone(model_and_preprocessor):
    model, preprocessor = model_and_preprocessor
    batch = preprocessor.batch([["the", "zyzzyva", "sat"], ["a", "zyzzyva"]])
    assert batch["word_ids"][0, 2] == preprocessor.unk_id  # not in the output vocabulary...
    with torch.no_grad():
        layer0 = model(batch["characters"], batch["lengths"]).logits[0]
        # ...yet its own vector, the same in both sentences (layer 0 reads no context), unlike <UNK>'s
        assert torch.allclose(layer0[0, 2], layer0[1, 2], atol=1e-6)
        assert not torch.allclose(layer0[0, 2], layer0[0, 1])
        other = model.token_encoder(torch.tensor([preprocessor.characters("zyzzyvas")]))[0]
    assert not torch.allclose(other, layer0[0, 2, :model.config.projection_dim])


def test_forward_states_never_see_later_words_nor_backward_states_earlier_ones(model_and_preprocessor):
    model, preprocessor = model_and_preprocessor
    sentence, changed_late, changed_early = (["the", "cat", "sat", "on", "the", "mat"],
                                             ["the", "cat", "sat", "on", "a", "dog"], ["a", "dog", "sat", "on", "the", "mat"])
    with torch.no_grad():
        states = [model.layers(**{k: v for k, v in preprocessor.batch([s]).items() if k != "word_ids"})
                  for s in (sentence, changed_late, changed_early)]
    (fwd, bwd, _), (fwd_late, bwd_late, _), (fwd_early, bwd_early, _) = states
    for layer in range(2):
        # positions 0..4 are <S> the cat sat on: a change at 5.. leaves the forward states there alone
        assert torch.allclose(fwd[layer][0, :5], fwd_late[layer][0, :5], atol=1e-6)
        assert not torch.allclose(fwd[layer][0, 5:], fwd_late[layer][0, 5:])
        # ...and a change at 1..2 leaves the backward states from position 3 on alone
        assert torch.allclose(bwd[layer][0, 3:], bwd_early[layer][0, 3:], atol=1e-6)
        assert not torch.allclose(bwd[layer][0, :3], bwd_early[layer][0, :3])


def test_padding_changes_nothing_a_sentence_computes(model_and_preprocessor):
    model, preprocessor = model_and_preprocessor
    short, long = ["the", "cat"], ["the", "cat", "sat", "on", "the", "mat", "."]
    with torch.no_grad():
        alone = model(**preprocessor.batch([short]))
        padded = model(**preprocessor.batch([short, long]))
        assert torch.allclose(alone.logits[:, 0], padded.logits[:, 0, :4], atol=1e-5)
        # each direction's loss of the short sentence alone, by hand from the full softmax
        forward_states, backward_states, _ = model.layers(preprocessor.batch([short])["characters"])
    ids = preprocessor.batch([short])["word_ids"][0]
    forward = F.cross_entropy(model.softmax(forward_states[-1][0, :-1]), ids[1:])
    backward = F.cross_entropy(model.softmax(backward_states[-1][0, 1:]), ids[:-1])
    assert alone.forward_loss.item() == pytest.approx(forward.item(), rel=1e-5)
    assert alone.backward_loss.item() == pytest.approx(backward.item(), rel=1e-5)
    assert alone.loss.item() == pytest.approx((forward.item() + backward.item()) / 2, rel=1e-5)


def test_reverse_padded_reverses_within_each_length():
    x = torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]])
    assert reverse_padded(x, torch.tensor([3, 4])).tolist() == [[3, 2, 1, 0], [7, 6, 5, 4]]


def test_scalar_mix_is_a_convex_mix_scaled_by_gamma():
    mix = ScalarMix(3)
    with torch.no_grad():
        mix.scalar_parameters.copy_(torch.tensor([0.3, -1.0, 2.0]))
        mix.gamma.fill_(2.0)
    assert mix.weights.sum().item() == pytest.approx(1.0) and (mix.weights > 0).all()
    layers = torch.randn(3, 2, 5, 4)
    expected = 2.0 * sum(w * layer for w, layer in zip(mix.weights, layers))
    assert torch.allclose(mix(layers), expected, atol=1e-6)
    same = torch.randn(2, 5, 4).expand(3, 2, 5, 4)
    assert torch.allclose(mix(same), 2.0 * same[0], atol=1e-6)


def test_adaptive_softmax_is_a_distribution_over_the_vocabulary():
    model = ElmoBiLM(ElmoConfig(vocab_size=300, softmax="adaptive", adaptive_cutoffs=[20, 100])).eval()
    with torch.no_grad():
        log_probabilities = model.word_log_probabilities(torch.randn(4, model.config.projection_dim))
    assert log_probabilities.shape == (4, 300)
    assert torch.allclose(log_probabilities.exp().sum(-1), torch.ones(4), atol=1e-5)


def test_words_and_vocabulary():
    assert words_of("The cat's mat, 2 feet.") == ["The", "cat", "'", "s", "mat", ",", "2", "feet", "."]
    vocabulary = build_vocabulary([["a", "b", "a"], ["c", "a", "b"]], min_count=2, max_words=None)
    assert vocabulary == [BOS, EOS, UNK, "a", "b"]
    preprocessor = ElmoPreprocessor(vocabulary, max_word_chars=6, max_len=4)
    batch = preprocessor.batch([["a", "b", "c", "a"]])  # cut to <S> a b </S>
    assert batch["lengths"].tolist() == [4] and batch["word_ids"][0].tolist() == [0, 3, 4, 1]
    assert preprocessor.characters("abcdefgh")[-1] != 0 and len(preprocessor.characters("abcdefgh")) == 6
    assert (batch["word_ids"] != IGNORE_INDEX).all()


def test_tiny_biLM_learns_a_repetitive_text_and_gives_features(tmp_path):
    """A few hundred steps on a tiny repetitive corpus: per-word perplexity falls far below the
    vocabulary size, and features() gives (L + 1, words, 2 * projection) per sentence."""
    from transformer_lab.tasks.elmo import ElmoPretrainingTask

    torch.manual_seed(0)
    sentences = [["the", "cat", "sat", "on", "the", "mat", "."], ["a", "dog", "sat", "on", "a", "log", "."]] * 8
    vocabulary = build_vocabulary(sentences, min_count=1, max_words=None)
    preprocessor = ElmoPreprocessor(vocabulary, max_word_chars=12, max_len=16)
    config = ElmoConfig(vocab_size=len(vocabulary), max_word_chars=12, dropout=0.0)
    task = ElmoPretrainingTask(config.to_dict(), preprocessor.to_state())
    optimizer = torch.optim.Adam(task.model.parameters(), lr=1e-2)
    batch = preprocessor.batch(sentences)
    for _ in range(60):
        optimizer.zero_grad()
        task.model(**batch).loss.backward()
        optimizer.step()
    with torch.no_grad():
        out = task.model.eval()(**batch)
    assert math.exp(out.forward_loss.item()) < 2.0 < len(vocabulary)
    features = task.features(["the cat sat", "a dog sat on a log ."])
    assert [f.shape for f in features] == [(3, 3, 128), (3, 7, 128)]


def test_per_word_perplexity_counts_every_word_and_the_end_marker(model_and_preprocessor):
    from transformer_lab.tasks.elmo import ElmoPretrainingTask

    model, preprocessor = model_and_preprocessor
    task = ElmoPretrainingTask(model.config.to_dict(), preprocessor.to_state())
    task.model.load_state_dict(model.state_dict())
    sentences = [["the", "cat", "sat"], ["a", "zyzzyva", "sat", "on", "the", "mat", "."]]
    total, words = task.forward_word_nll(sentences, batch_size=1)
    by_hand = 0.0
    for sentence in sentences:
        batch = preprocessor.batch([sentence])
        with torch.no_grad():
            forward_states, _, _ = model.layers(batch["characters"])
            log_p = model.softmax(forward_states[-1][0, :-1]).log_softmax(-1)
        by_hand -= log_p.gather(1, batch["word_ids"][0, 1:, None]).sum().item()
    assert words == (3 + 1) + (7 + 1) and total == pytest.approx(by_hand, rel=1e-5)
    assert task.forward_word_nll(sentences, batch_size=2) == pytest.approx((total, words), rel=1e-5)


def test_the_character_layer_is_context_free_and_the_top_layer_is_not(model_and_preprocessor):
    from transformer_lab.evaluation.elmo import contextual_neighbours, neighbours_markdown
    from transformer_lab.tasks.elmo import ElmoPretrainingTask

    model, preprocessor = model_and_preprocessor
    task = ElmoPretrainingTask(model.config.to_dict(), preprocessor.to_state())
    sentences = [["the", "cat", "sat", "on", "the", "mat"], ["a", "dog", "sat", "down"], ["we", "sat", "."]]
    rows, summary = contextual_neighbours(task, sentences, ["sat"], per_probe=3)
    assert len(rows) == 3 and all(r["token_neighbour"] == "sat" and r["token_cosine"] == pytest.approx(1.0)
                                  for r in rows)
    assert summary["token_neighbour_same_word"] == 1.0 and summary["token_same_word_cosine"] == pytest.approx(1.0)
    assert summary["top_same_word_cosine"] < 0.999
    assert all(r["top_neighbour_sentence"] != r["sentence"] for r in rows)
    assert neighbours_markdown(rows).count("\n") == 2 + 3


def test_a_trained_biLM_is_a_feature_extraction_pipeline(model_and_preprocessor, tmp_path):
    from test_pipelines import save_checkpoint

    from transformer_lab import pipeline
    from transformer_lab.tasks.elmo import ElmoPretrainingTask

    model, preprocessor = model_and_preprocessor
    task = ElmoPretrainingTask(model.config.to_dict(), preprocessor.to_state())
    assert save_checkpoint(task, tmp_path / "elmo.ckpt")["family"] == "elmo_pretraining"
    embed = pipeline(model=str(tmp_path / "elmo.ckpt"))
    assert embed.task_name == "feature-extraction"
    vector = embed("the cat sat on the mat .")
    expected = task.features(["the cat sat on the mat ."])[0].mean(0).mean(0)
    assert vector == pytest.approx(expected.tolist(), abs=1e-5) and len(vector) == 2 * model.config.projection_dim
    assert embed.similarity("the cat sat", "the cat sat") == pytest.approx(1.0)


def test_the_data_encodes_characters_as_the_model_reads_them():
    """data/elmo.py and models/elmo.py each define the character encoding (data/ does not import models/)."""
    from transformer_lab.data import elmo as data
    from transformer_lab.models import elmo as model

    for name in ("CHAR_PAD", "BEGIN_OF_WORD", "END_OF_WORD", "BEGIN_OF_SENTENCE", "END_OF_SENTENCE", "N_MARKERS",
                 "N_CHARS", "IGNORE_INDEX"):
        assert getattr(data, name) == getattr(model, name), name
    for inner, width in (([], 4), ([data.END_OF_SENTENCE], 6), ([b + data.N_MARKERS for b in "héllo".encode()], 5)):
        assert data.spelling(inner, width) == model.spelling(inner, width)
