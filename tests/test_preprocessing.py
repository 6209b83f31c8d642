"""One preprocessor per family: its state is plain JSON (a checkpoint is read with weights_only=True),
it comes back from that state encoding exactly as before, a checkpoint alone predicts from raw inputs
(the tokenizer file may be gone), and the token-embedding start (task.embeddings) works for any model
with token embeddings."""

import json

import lightning as L
import numpy as np
import pytest
import torch

from transformer_lab.data.tokenizers import train_tokenizer
from transformer_lab.errors import TransformerLabError

TEXTS = ["show me flights from boston to denver", "what is the cheapest fare to dallas",
         "who drew the old maps of lisbon", "the maps were drawn by a chemist", "a good film", "a bad film"]


@pytest.fixture(scope="module")
def wordpiece():
    return train_tokenizer("wordpiece", TEXTS * 3, 200, lowercase=True)


@pytest.fixture(scope="module")
def bpe():
    return train_tokenizer("bpe", TEXTS * 3, 300)


def _round_trip(preprocessor):
    """from_state(to_state()) through JSON text: what a checkpoint keeps is plain data."""
    state = preprocessor.to_state()
    text = json.dumps(state)
    again = type(preprocessor).from_state(json.loads(text))
    assert json.dumps(again.to_state()) == text
    return again


def _same(a, b) -> bool:
    if torch.is_tensor(a):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _cases(wordpiece, bpe, prepared_atis, tmp_path) -> dict:
    """name -> (preprocessor, its encoding of some raw inputs)."""
    from transformer_lab.data.atis import AtisPreprocessor, read_prepared_split
    from transformer_lab.data.atis_bert import AtisBertPreprocessor
    from transformer_lab.data.bert import BertPreprocessor
    from transformer_lab.data.gpt import GPTClassificationPreprocessor, GPTPreprocessor
    from transformer_lab.data.images import ImagePreprocessor
    from transformer_lab.data.qa import QAPreprocessor
    from transformer_lab.data.tabular import TableSchema, TabularEncoder, TabularPreprocessor
    from transformer_lab.data.text_classification import TextClassificationPreprocessor
    from transformer_lab.data.word2vec import Word2VecPreprocessor

    atis = AtisPreprocessor.from_prepared(prepared_atis)
    rows = read_prepared_split(prepared_atis, "test")[:5]
    words = [text.split() for text in TEXTS]
    labels = AtisPreprocessor.from_prepared(prepared_atis)
    schema = TableSchema("toy", "y", categorical=["colour"], continuous=["size"], missing_values=["?"])
    encoder = TabularEncoder(["colour"], ["size"], {"colour": ["blue", "red"]}, {"size": 1.0}, {"size": 2.0},
                             ["size"], ["no", "yes"])
    table = [{"colour": "red", "size": "1.5"}, {"colour": "?", "size": "?"}, {"colour": " blue", "size": 3}]
    return {
        "atis": (atis, lambda p: ([p.encode(row) for row in rows], p.batch(words))),
        "atis_bert": (AtisBertPreprocessor(wordpiece, labels.intent_labels, labels.slot_labels, max_len=12),
                      lambda p: ([p.encode(row) for row in rows], p.batch(words))),
        "text_classification": (TextClassificationPreprocessor(wordpiece, ["neg", "pos"], 10, "head_tail", 3),
                                lambda p: p.batch([TEXTS[0], (TEXTS[1], TEXTS[2]), TEXTS[3]])),
        "qa": (QAPreprocessor(wordpiece, max_len=24, max_question_tokens=6),
               lambda p: p.collate(p.encode([{"question": q, "context": c} for q, c in zip(TEXTS[:3], TEXTS[3:])]))),
        "bert": (BertPreprocessor(wordpiece, max_len=8), lambda p: p.batch(["show me [MASK] from boston", TEXTS[1]])),
        "gpt": (GPTPreprocessor(bpe), lambda p: ([p.encode(t) for t in ["", *TEXTS]], p.decode(p.encode(TEXTS[0])))),
        "gpt_classification": (GPTClassificationPreprocessor(bpe, ["a", "b"], "similarity", 12),
                               lambda p: p.batch([(TEXTS[0], TEXTS[1]), (TEXTS[2], TEXTS[3])])),
        "images": (ImagePreprocessor(["0", "1"], [0.2, 0.4, 0.6], [0.1, 0.2, 0.3]),
                   lambda p: p.encode(np.random.default_rng(0).integers(0, 256, (2, 3, 4, 4), dtype=np.uint8))),
        "tabular": (TabularPreprocessor(schema, encoder), lambda p: p.batch(table)),
        "word2vec": (Word2VecPreprocessor(["the", "a", "film"], [9, 5, 2]), lambda p: p.encode(["film", "the"])),
    }


CASES = ["atis", "atis_bert", "text_classification", "qa", "bert", "gpt", "gpt_classification", "images",
         "tabular", "word2vec"]


@pytest.mark.parametrize("name", CASES)
def test_a_preprocessor_comes_back_from_its_json_state_and_encodes_the_same(name, wordpiece, bpe, prepared_atis,
                                                                             tmp_path):
    preprocessor, encode = _cases(wordpiece, bpe, prepared_atis, tmp_path)[name]
    again = _round_trip(preprocessor)
    assert _same(encode(again), encode(preprocessor))
    with pytest.raises(TransformerLabError, match="saved state lacks"):
        type(preprocessor).from_state({})


def test_tabular_rows_read_raw_encode_as_the_prepared_split(tmp_path):
    """The evaluator hands the prepared rows to predict, which re-reads them by the schema: the
    features must be bit-identical to the encoder's own encoding of the split."""
    from transformer_lab.data.tabular import TabularPreprocessor, fold_rows, prepare, read_prepared
    from transformer_lab.runtime.config import PROJECT_ROOT

    prepare("builtin", str(tmp_path / "p"), str(PROJECT_ROOT / "conf" / "schemas" / "penguins.yaml"))
    table, schema, encoder = read_prepared(tmp_path / "p")
    split = fold_rows(table, None)["test"]
    encoded = encoder.transform(split)
    batch = TabularPreprocessor(schema, encoder).batch(split[schema.features])
    assert np.array_equal(batch["categorical"].numpy(), encoded.categorical)
    assert np.array_equal(batch["continuous"].numpy(), encoded.continuous)
    with pytest.raises(TransformerLabError, match="is not a number"):
        TabularPreprocessor(schema, encoder).batch([{**split[schema.features].iloc[0].to_dict(),
                                                     schema.continuous[0]: "heavy"}])


def test_images_must_be_raw_uint8():
    from transformer_lab.data.images import ImagePreprocessor

    with pytest.raises(TransformerLabError, match="raw uint8 images"):
        ImagePreprocessor(["0"], [0.5], [0.2]).encode(torch.rand(2, 1, 4, 4))


@pytest.fixture
def trained_classifier(tmp_path, wordpiece):
    """A sentence classifier trained for a few steps through Lightning, its checkpoint, and its tokenizer file."""
    from transformer_lab.data.text_classification import TextClassificationDataModule
    from transformer_lab.models.bert import BertClassifierConfig
    from transformer_lab.tasks.sequence_classification import SequenceClassificationTask

    tokenizer_path = tmp_path / "tokenizer.json"
    wordpiece.save(str(tokenizer_path))
    (tmp_path / "reviews.csv").write_text("review,label\n" + "".join(
        f"{text},{'pos' if 'good' in text else 'neg'}\n" for text in TEXTS * 6))
    L.seed_everything(0)
    dm = TextClassificationDataModule("local", str(tokenizer_path), max_len=16, batch_size=8,
                                      local_path=str(tmp_path / "reviews.csv"),
                                      columns={"text_a": "review", "text_b": None, "label": "label"})
    config = BertClassifierConfig(size="tiny", n_layers=1, d_model=16, n_heads=2, max_len=16, **dm.model_kwargs())
    task = SequenceClassificationTask(config.to_dict(), dm.preprocessor.to_state(), lr=1e-3)
    trainer = L.Trainer(max_steps=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, num_sanity_val_steps=0, enable_checkpointing=False)
    trainer.fit(task, dm)
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    return task, tmp_path / "model.ckpt", tokenizer_path


def test_a_checkpoint_alone_predicts_from_raw_text(trained_classifier):
    from transformer_lab.tasks.checkpoints import load_task
    from transformer_lab.tasks.sequence_classification import SequenceClassificationTask

    task, checkpoint, tokenizer_path = trained_classifier
    expected = task.predict(TEXTS)
    tokenizer_path.unlink()  # the tokenizer travels inside the checkpoint, not as a path
    restored = load_task(checkpoint, SequenceClassificationTask, "finetune_sentiment")
    torch.testing.assert_close(restored.predict(TEXTS), expected)
    assert restored.preprocessor.labels == ["neg", "pos"]


def test_a_checkpoint_without_its_preprocessor_is_one_clear_error(trained_classifier, tmp_path):
    from transformer_lab.tasks.checkpoints import load_task
    from transformer_lab.tasks.sequence_classification import SequenceClassificationTask

    _, checkpoint, _ = trained_classifier
    saved = torch.load(checkpoint, weights_only=True)
    del saved["hyper_parameters"]["preprocessor"]
    saved["hyper_parameters"]["labels"] = ["neg", "pos"]  # what the older format kept instead
    torch.save(saved, tmp_path / "old.ckpt")
    with pytest.raises(TransformerLabError, match=r"old.ckpt: saved without its preprocessor state .* "
                                                  r"retrain: `dvc repro finetune_sentiment`"):
        load_task(tmp_path / "old.ckpt", SequenceClassificationTask, "finetune_sentiment")


def _vectors(path, tokens: list[str], dim: int) -> np.ndarray:
    from transformer_lab.data.word_vectors import save_word2vec_format

    vectors = np.random.default_rng(1).normal(size=(len(tokens), dim)).astype(np.float32)
    save_word2vec_format(path, tokens, vectors)
    return vectors


@pytest.mark.parametrize("family", ["bert_pretraining", "gpt_pretraining"])
def test_word2vec_embeddings_start_any_token_model(family, wordpiece, bpe, tmp_path):
    from transformer_lab.data.bert import BertPreprocessor
    from transformer_lab.data.gpt import GPTPreprocessor
    from transformer_lab.tasks.bert_pretraining import BertPretrainingTask
    from transformer_lab.tasks.gpt import GPTPretrainingTask

    preprocessor = BertPreprocessor(wordpiece) if family == "bert_pretraining" else GPTPreprocessor(bpe)
    tokens = preprocessor.tokens
    words = [token for token in tokens if token.isalpha() and len(token) > 1][:4]  # "maps", or BPE's "aps"
    vectors = _vectors(tmp_path / "vectors.txt", [*words, "not-a-token"], 16)
    model = dict(vocab_size=len(tokens), n_layers=1, d_model=16, n_heads=2, max_len=16)
    task_class = BertPretrainingTask if family == "bert_pretraining" else GPTPretrainingTask
    embeddings = {"init": "word2vec", "vectors": "vectors.txt"}  # relative to the project root
    task = task_class(model, preprocessor.to_state(), embeddings=embeddings)
    untouched = task.model.get_input_embeddings().weight.detach().clone()

    coverage = task.initialise_embeddings(tmp_path)

    assert coverage == pytest.approx(len(words) / len(tokens))
    table = task.model.get_input_embeddings().weight.detach()
    rows = [tokens.index(word) for word in words]
    ratios = table[rows] / torch.from_numpy(vectors[:len(words)])
    torch.testing.assert_close(ratios, torch.full_like(ratios, ratios[0, 0].item()))  # the vectors, one scale
    others = [i for i in range(len(tokens)) if i not in rows]
    assert torch.equal(table[others], untouched[others])  # tokens without a vector keep their random row

    random_start = task_class(model, preprocessor.to_state(), embeddings={"init": "random"})
    assert random_start.initialise_embeddings(tmp_path) is None
    with pytest.raises(TransformerLabError,
                       match=r"task.embeddings.init='fasttext' is not one of random, word2vec, glove"):
        task_class(model, preprocessor.to_state(), embeddings={"init": "fasttext"}).initialise_embeddings(tmp_path)
