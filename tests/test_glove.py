"""GloVe: the paper's weighting and loss against hand computations, the compiled AdaGrad step against
autograd + torch.optim.Adagrad, the co-occurrence counts against a brute-force double loop, training,
the vectors as a token model's start (task.embeddings.init=glove), and the benchmark's JSON."""

import json
import math
import sys
from collections import defaultdict

import lightning as L
import numpy as np
import pytest
import torch
from conftest import ROOT

from transformer_lab.data.corpus import prepare
from transformer_lab.data.glove import CooccurrenceEntries, GloVeDataModule, cooccurrences, vocabulary
from transformer_lab.data.word2vec import Word2VecPreprocessor
from transformer_lab.data.word_vectors import load_word2vec_format, save_word2vec_format
from transformer_lab.errors import TransformerLabError
from transformer_lab.models.glove import GloVe, GloVeConfig, weighting
from transformer_lab.tasks.glove import GloVeTask


def test_weighting_is_the_papers_f():
    counts = torch.tensor([0.5, 10.0, 50.0, 99.0, 100.0, 150.0])
    expected = [(0.5 / 100) ** 0.75, 0.1**0.75, 0.5**0.75, 0.99**0.75, 1.0, 1.0]
    torch.testing.assert_close(weighting(counts), torch.tensor(expected))
    torch.testing.assert_close(weighting(torch.tensor([2.0, 8.0]), x_max=4.0, alpha=0.5),
                               torch.tensor([math.sqrt(0.5), 1.0]))


def _two_word_model(update: str = "compiled") -> GloVe:
    """Two words, dim 2, tables set by hand."""
    model = GloVe(GloVeConfig(vocab_size=2, dim=2, update=update))
    with torch.no_grad():
        model.word_vectors.weight.copy_(torch.tensor([[1.0, 0.0], [0.5, 2.0]]))
        model.context_vectors.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, -1.0]]))
        model.word_biases.weight.copy_(torch.tensor([[0.1], [-0.2]]))
        model.context_biases.weight.copy_(torch.tensor([[0.3], [0.0]]))
    return model


# X = [[0, 3], [3, 200]]: three non-zero entries; X_00 = 0 is left out of J.
ROWS, COLS, COUNTS = torch.tensor([0, 1, 1]), torch.tensor([1, 0, 1]), torch.tensor([3.0, 3.0, 200.0])


def _hand_j() -> float:
    """J written out for ROWS/COLS/COUNTS and _two_word_model's tables."""
    # (0,1): w_0.w~_1 = 1, b_0 + b~_1 = 0.1; (1,0): w_1.w~_0 = 2, -0.2 + 0.3; (1,1): 0.5 - 2 = -1.5, -0.2 + 0
    predictions = [1.0 + 0.1, 2.0 + 0.1, -1.5 - 0.2]
    weights = [0.03**0.75, 0.03**0.75, 1.0]  # f(3) = (3/100)^(3/4); f(200) = 1
    targets = [math.log(3), math.log(3), math.log(200)]
    return sum(f * (p - t) ** 2 for f, p, t in zip(weights, predictions, targets))


def test_loss_is_the_papers_weighted_least_squares_by_hand():
    hand = _hand_j()
    for update in ("compiled", "autograd"):
        model = _two_word_model(update)
        out = model(ROWS, COLS, COUNTS)
        assert out.loss.sum().item() == pytest.approx(hand, rel=1e-6)
        torch.testing.assert_close(out.logits, torch.tensor([1.1, 2.1, -1.7]))
        torch.testing.assert_close(model.entry_losses(ROWS, COLS, COUNTS), out.loss.detach())
    torch.testing.assert_close(model.vectors(), torch.tensor([[1.0, 1.0], [1.5, 1.0]]))  # w + w~


def test_mittens_reports_half_the_papers_loss():
    """The benchmark's loss definition: mittens' error on the same matrix and tables is J / 2."""
    np_mittens = pytest.importorskip("mittens.np_mittens")  # the dev extra installs it
    model = _two_word_model()
    tables = [t.detach().double().numpy().copy() for t in model.tables()]
    glove = np_mittens.GloVe(n=2, max_iter=1, display_progress=0, test_mode=True)
    glove.fit(np.array([[0.0, 3.0], [3.0, 200.0]]),
              fixed_initialization=dict(zip(("W", "C", "bw", "bc"), tables)))
    assert glove.errors[0] == pytest.approx(_hand_j() / 2, rel=1e-9)


def test_compiled_adagrad_step_is_autograd_and_torch_adagrad():
    """Three steps on batches with repeated rows: the same tables, sums and losses either way."""
    torch.manual_seed(0)
    compiled = GloVe(GloVeConfig(vocab_size=30, dim=8))
    reference = GloVe(GloVeConfig(vocab_size=30, dim=8, update="autograd"))
    reference.load_state_dict(compiled.state_dict())
    adagrads = [torch.optim.Adagrad(m.parameters(), lr=0.05, initial_accumulator_value=0.1)
                for m in (compiled, reference)]
    for _ in range(3):
        rows, cols = torch.randint(30, (200,)), torch.randint(30, (200,))
        counts = torch.rand(200) * 150 + 0.1  # both sides of x_max
        losses = compiled.adagrad_step(rows, cols, counts, [adagrads[0].state[t]["sum"] for t in compiled.tables()],
                                       lr=0.05)
        adagrads[1].zero_grad()
        expected = reference(rows, cols, counts).loss
        (expected.sum() / 2).backward()
        adagrads[1].step()
        torch.testing.assert_close(losses, expected.detach(), rtol=1e-5, atol=1e-5)
        for mine, theirs in zip(compiled.tables(), reference.tables()):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
        for mine, theirs in zip(compiled.tables(), reference.tables()):
            torch.testing.assert_close(adagrads[0].state[mine]["sum"], adagrads[1].state[theirs]["sum"],
                                       rtol=1e-5, atol=1e-7)


def _brute_force(sentences: list[list[int]], vocab_size: int, window: int) -> np.ndarray:
    counts = defaultdict(float)
    for sentence in sentences:
        for p, i in enumerate(sentence):
            for q, j in enumerate(sentence):
                if 0 < abs(p - q) <= window:
                    counts[i, j] += 1 / abs(p - q)
    dense = np.zeros((vocab_size, vocab_size))
    for (i, j), value in counts.items():
        dense[i, j] = value
    return dense


def test_cooccurrences_are_the_brute_force_double_loop():
    rng = np.random.default_rng(0)
    sentences = [rng.integers(0, 7, size=n) for n in (12, 2, 9, 1, 15)] + [np.array([3, 3, 3])]
    for window in (1, 3, 10):
        rows, cols, values = cooccurrences(sentences, 7, window)
        dense = np.zeros((7, 7))
        dense[rows, cols] = values
        expected = _brute_force([s.tolist() for s in sentences], 7, window)
        np.testing.assert_allclose(dense, expected, rtol=1e-12)
        np.testing.assert_allclose(dense, dense.T)  # symmetric
        assert (values > 0).all() and len(values) == np.count_nonzero(expected)  # the non-zero entries only
        assert list(zip(rows, cols)) == sorted(zip(rows, cols))  # row-major
    # by hand: "3 3 3" alone, window 2: X_33 = 2 x (1/1 + 1/1 + 1/2) (each pair both ways)
    rows, cols, values = cooccurrences([np.array([3, 3, 3])], 4, 2)
    assert (rows.tolist(), cols.tolist(), values.tolist()) == ([3], [3], [5.0])
    # a sentence ends a window: 0 1 | 2 pairs nothing across the bar
    rows, cols, values = cooccurrences([np.array([0, 1]), np.array([2, 0])], 3, 5)
    assert sorted(zip(rows.tolist(), cols.tolist())) == [(0, 1), (0, 2), (1, 0), (2, 0)]
    with pytest.raises(TransformerLabError, match="window=0"):
        cooccurrences(sentences, 7, 0)


def test_vocabulary_keeps_the_most_frequent_words_up_to_max_size():
    sentences = [["a", "b", "a", "c"], ["a", "b", "d"]]
    assert vocabulary(sentences, 1, 2)[0] == ["a", "b"]
    words, counts = vocabulary(sentences, 2)
    assert words == ["a", "b"] and counts.tolist() == [3, 2]


def test_entries_come_once_an_epoch_shuffled_anew_or_in_row_order_when_one_batch_holds_them():
    rows, cols, values = np.arange(10), np.arange(10)[::-1].copy(), np.arange(1, 11, dtype=np.float64)
    entries = CooccurrenceEntries(rows, cols, values, batch_size=4, seed=0)
    assert len(entries) == 3
    epochs = [torch.cat([b["rows"] for b in entries]) for _ in range(2)]
    for order in epochs:
        assert sorted(order.tolist()) == list(range(10))
    assert epochs[0].tolist() != epochs[1].tolist() != list(range(10))
    batch = next(iter(entries))
    assert (batch["cols"] == 9 - batch["rows"]).all() and (batch["counts"] == batch["rows"] + 1).all()
    assert batch["counts"].dtype == torch.float32
    [whole] = list(CooccurrenceEntries(rows, cols, values, batch_size=10))
    assert whole["rows"].tolist() == list(range(10))


@pytest.fixture(scope="module")
def lee_corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "corpus"
    prepare("builtin", str(out))
    return out


def _train(dm: GloVeDataModule, update: str, epochs: int) -> tuple[GloVeTask, L.Trainer]:
    L.seed_everything(0)
    task = GloVeTask(GloVeConfig(dim=16, update=update, **dm.model_kwargs()).to_dict(), dm.preprocessor.to_state())
    trainer = L.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(task, dm)
    return task, trainer


def test_training_lowers_the_loss_the_same_on_both_paths(lee_corpus):
    dm = GloVeDataModule(str(lee_corpus), min_count=5, batch_size=8192, max_vocab=300)
    entries = (torch.from_numpy(dm.rows), torch.from_numpy(dm.cols), torch.from_numpy(dm.counts).float())
    before = GloVe(GloVeConfig(dim=16, vocab_size=300))
    compiled, trainer = _train(dm, "compiled", 3)
    reference, _ = _train(dm, "autograd", 3)
    start = before.entry_losses(*entries).mean().item()
    assert trainer.callback_metrics["val/loss"].item() < 0.5 * start
    for mine, theirs in zip(compiled.model.tables(), reference.model.tables()):
        torch.testing.assert_close(mine, theirs, rtol=1e-3, atol=1e-4)  # float32 sums in another order
    words, vectors = compiled.vectors()
    assert words == dm.preprocessor.words and vectors.shape == (300, 16)


def test_glove_vectors_start_a_token_model(tmp_path):
    """task.embeddings.init=glove reads the vectors evaluate_glove exports, rescaled as word2vec's; the
    refusals are one line naming the field."""
    from transformer_lab.data.gpt import GPTPreprocessor
    from transformer_lab.data.tokenizers import train_tokenizer
    from transformer_lab.tasks.gpt import GPTPretrainingTask

    texts = ["the maps were drawn by a chemist", "who drew the old maps", "a good film", "a bad film"] * 3
    sentences = [text.split() for text in texts]
    words, counts = vocabulary(sentences, 1)
    glove = GloVeTask(GloVeConfig(vocab_size=len(words), dim=16).to_dict(),
                      Word2VecPreprocessor(words, counts.tolist()).to_state())
    exported = tmp_path / "artifacts/glove/eval/vectors.txt"
    save_word2vec_format(exported, *glove.vectors())

    preprocessor = GPTPreprocessor(train_tokenizer("bpe", texts, 300))
    tokens = preprocessor.tokens
    model = {"vocab_size": len(tokens), "n_layers": 1, "d_model": 16, "n_heads": 2, "max_len": 16}

    def task(**embeddings):
        return GPTPretrainingTask(model, preprocessor.to_state(), embeddings={"init": "glove", **embeddings})

    start = task(vectors="artifacts/glove/eval/vectors.txt")
    coverage = start.initialise_embeddings(tmp_path)
    found = [(row, words.index(token)) for row, token in enumerate(tokens) if token in words]
    assert found and coverage == pytest.approx(len(found) / len(tokens))
    table = start.model.get_input_embeddings().weight.detach()
    glove_vectors = torch.from_numpy(load_word2vec_format(exported)[1])  # as written (6 decimals)
    ratios = table[[r for r, _ in found]] / glove_vectors[[w for _, w in found]]
    torch.testing.assert_close(ratios, torch.full_like(ratios, ratios[0, 0].item()))  # the vectors, one scale

    refusals = {"task.embeddings.init=glove needs task.embeddings.vectors=FILE": {"vectors": None},
                "task.embeddings.vectors=artifacts/word2vec/eval/vectors.txt holds word2vec's vectors, not glove's: "
                "set task.embeddings.vectors=artifacts/glove/eval/vectors.txt":
                    {"vectors": "artifacts/word2vec/eval/vectors.txt"},
                "task.embeddings.vectors=missing.txt: not found; `dvc repro evaluate_glove`":
                    {"vectors": "missing.txt"}}
    for message, embeddings in refusals.items():
        with pytest.raises(TransformerLabError) as refused:
            task(**embeddings).initialise_embeddings(tmp_path)
        assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_the_benchmark_writes_its_json_contract(tmp_path):
    """Its main on the Lee corpus with tiny settings (three trainings and gensim's word2vec: 2 s)."""
    pytest.importorskip("mittens", reason="mittens comes with the dev extra (pip install -e '.[dev]')")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import glove_vs_reference

    out = tmp_path / "glove.json"
    assert glove_vs_reference.main(["--corpus", "builtin", "--out", str(out), "--vocab-size", "600", "--dim", "16",
                                    "--epochs", "3", "--minibatch-epochs", "1"]) == 0
    result = json.loads(out.read_text())
    for key in ("ours_loss", "mittens_loss", "loss_ratio", "ours_minibatch_loss"):
        assert isinstance(result[key], list) and all(isinstance(v, float) for v in result[key]), key
    assert len(result["ours_loss"]) == len(result["mittens_loss"]) == len(result["loss_ratio"]) == 3
    assert result["max_loss_deviation"] < 1e-4  # the same optimisation from the same tables
    for key in ("ours_seconds", "mittens_seconds", "ours_to_mittens_speed", "ours_wordsim_spearman",
                "mittens_wordsim_spearman", "word2vec_wordsim_spearman", "ours_minibatch_wordsim_spearman"):
        assert isinstance(result[key], float), key
    assert result["vocab_size"] == 600 and result["settings"]["epochs"] == 3
    assert "mittens" in result["loss_definition"] and "twice" in result["loss_definition"]
    assert {"cpu", "cpu_count", "torch", "date", "command"} <= set(result["machine"])
