"""BERT fine-tuning: sentence / pair classification data and task, JointBERT on ATIS, the
paper's sweep config."""

import itertools
import random

import lightning as L
import pytest
import torch

from transformer_lab.data.atis import read_prepared_split
from transformer_lab.data.atis_bert import AtisBertDataModule, encode_words
from transformer_lab.data.bert import IGNORE_INDEX, special_ids
from transformer_lab.data.text_classification import TextClassificationDataModule, load_examples
from transformer_lab.data.tokenizers import train_tokenizer
from transformer_lab.errors import DataError
from transformer_lab.models.bert import BertClassifierConfig, BertJointConfig
from transformer_lab.tasks.bert_joint_intent_slot import BertJointIntentSlotTask
from transformer_lab.tasks.sequence_classification import SequenceClassificationTask
from transformer_lab.runtime.config import compose_config

GOOD = ["good", "great", "fine", "lovely", "superb"]
BAD = ["bad", "awful", "poor", "dull", "weak"]
FILLER = ["the", "film", "was", "plot", "actors", "music", "and", "story", "a", "very", "quite", "ending"]


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    texts = [" ".join(FILLER + GOOD + BAD)] * 5
    texts += ["show me flights from boston to denver on monday", "what is the cheapest fare to dallas"]
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    train_tokenizer("wordpiece", texts, 300, lowercase=True).save(str(path))
    return path


@pytest.fixture(scope="module")
def review_csv(tmp_path_factory):
    """A sentiment set a model must read to solve: the label is the polarity word inside filler."""
    rng = random.Random(0)
    lines = ["review,label"]
    for i in range(240):
        label = ["neg", "pos"][i % 2]
        words = rng.sample(FILLER, 6)
        words.insert(rng.randrange(7), rng.choice(GOOD if label == "pos" else BAD))
        lines.append(f"{' '.join(words)},{label}")
    path = tmp_path_factory.mktemp("reviews") / "reviews.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_builtin_sentiment_sentences_split_stratified():
    splits = load_examples("sentiment", seed=0, fractions=(0.15, 0.15))
    assert sum(len(s) for s in splits.values()) == 200
    for split in splits.values():
        labels = [e["label"] for e in split]
        assert labels.count("pos") == labels.count("neg")  # 100 of each, split alike
    assert all(e["text_b"] is None for e in splits["train"])
    assert any("\u2014" in e["text_a"] for s in splits.values() for e in s)  # Windows-1252 dashes decoded


@pytest.mark.parametrize("content, message", [
    ("review,stars\ngreat film,pos\n", r"column 'label' not in the header \(review, stars\)"),
    ("review,label\ngreat film,pos\n,neg\n", r"reviews.csv:3: empty 'review'"),
])
def test_bad_classification_table_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "reviews.csv"
    path.write_text(content)
    with pytest.raises(DataError, match=message):
        load_examples("local", seed=0, fractions=(0.2, 0.2), local_path=str(path),
                      columns={"text_a": "review", "text_b": None, "label": "label"})


def test_hub_classification_offline_is_a_clear_error(offline_hub):
    with pytest.raises(DataError, match="could not load 'stanfordnlp/sst2'.*offline"):
        load_examples("hub", seed=0, fractions=(0.1, 0.1), hub_id="stanfordnlp/sst2",
                      columns={"text_a": "sentence", "text_b": None, "label": "label"})


@pytest.mark.parametrize("truncation", ["head", "tail", "head_tail"])
def test_long_single_inputs_are_truncated_by_strategy(review_csv, tokenizer_path, truncation):
    dm = TextClassificationDataModule("local", str(tokenizer_path), max_len=12, truncation=truncation,
                                      head_tokens=4, local_path=str(review_csv),
                                      columns={"text_a": "review", "text_b": None, "label": "label"})
    words = " ".join(f"{w}" for w in (GOOD + FILLER + BAD))
    p = dm.preprocessor
    pieces = p.tokenizer.encode(words, add_special_tokens=False).ids
    ids = p.encode(words)["input_ids"]
    assert len(ids) == 12 and ids[0] == p.specials["cls"] and ids[-1] == p.specials["sep"]
    body = ids[1:-1]
    expected = {"head": pieces[:10], "tail": pieces[-10:], "head_tail": pieces[:4] + pieces[-6:]}[truncation]
    assert body == expected


def test_pairs_get_segment_ids_and_fit_max_len(tmp_path, tokenizer_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("sentence1\tsentence2\tlabel\n" + "".join(
        f"{' '.join(FILLER)}\t{' '.join(FILLER[:3])}\t{label}\n" for label in ["yes", "no"] * 10))
    dm = TextClassificationDataModule("local", str(tokenizer_path), max_len=16, local_path=str(path),
                                      columns={"text_a": "sentence1", "text_b": "sentence2", "label": "label"})
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[1] <= 16
    for ids, segments in zip(batch["input_ids"], batch["segment_ids"]):
        sep = torch.nonzero(ids == dm.preprocessor.specials["sep"]).flatten()
        assert len(sep) == 2
        assert (segments[: sep[0] + 1] == 0).all() and (segments[sep[0] + 1 : sep[1] + 1] == 1).all()


def test_classifier_fine_tuning_learns_a_task_that_needs_the_text(review_csv, tokenizer_path, tmp_path):
    L.seed_everything(0)
    dm = TextClassificationDataModule("local", str(tokenizer_path), max_len=16, batch_size=16,
                                      local_path=str(review_csv),
                                      columns={"text_a": "review", "text_b": None, "label": "label"})
    config = BertClassifierConfig(size="tiny", n_layers=1, d_model=64, n_heads=2, **dm.model_kwargs())
    task = SequenceClassificationTask(config.to_dict(), dm.preprocessor.to_state(), lr=2e-3)
    trainer = L.Trainer(max_epochs=8, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, num_sanity_val_steps=0)
    trainer.fit(task, dm)
    scores = trainer.test(task, dm, verbose=False)[0]
    assert scores["test/acc"] >= 0.9, scores


def test_atis_words_keep_their_tag_on_the_first_piece(prepared_atis, tokenizer_path):
    dm = AtisBertDataModule(str(prepared_atis), str(tokenizer_path), max_examples=40)
    specials = special_ids(dm.preprocessor.tokenizer)
    ids, first = encode_words(dm.preprocessor.tokenizer, ["show", "flights", "to", "xyzzyville"], specials)
    assert ids[0] == specials["cls"] and ids[-1] == specials["sep"] and first[0] == 1
    assert len(first) == 4 and first == sorted(first) and first[-1] < len(ids) - 1
    dm.setup()
    for example, row in zip(dm.examples["train"], read_prepared_split(prepared_atis, "train")):
        tagged = [label for label in example["slot_labels"] if label != IGNORE_INDEX]
        assert [dm.preprocessor.slot_labels[t] for t in tagged] == row["slots"]  # one tag per word, in order
        assert len(example["slot_labels"]) == len(example["input_ids"]) - 1


def test_joint_bert_trains_on_atis_and_predicts_a_tag_per_word(prepared_atis, tmp_path):
    utterances = [" ".join(row["words"]) for row in read_prepared_split(prepared_atis, "train")]
    train_tokenizer("wordpiece", utterances, 400, lowercase=True).save(str(tmp_path / "atis_tokenizer.json"))
    L.seed_everything(0)
    dm = AtisBertDataModule(str(prepared_atis), str(tmp_path / "atis_tokenizer.json"), batch_size=16)
    config = BertJointConfig(size="tiny", n_layers=1, d_model=64, n_heads=2, **dm.model_kwargs())
    task = BertJointIntentSlotTask(config.to_dict(), dm.preprocessor.to_state(), lr=5e-3)
    trainer = L.Trainer(max_epochs=6, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, num_sanity_val_steps=0, inference_mode=False)
    before = trainer.validate(task, dm, verbose=False)[0]
    trainer.fit(task, dm)
    scores = trainer.validate(task, dm, verbose=False)[0]
    # 300 utterances and a few seconds of training: far from converged, but clearly learning
    assert scores["val/loss"] < before["val/loss"] - 1.0 and scores["val/slot_f1"] > before["val/slot_f1"] + 0.25, (
        before, scores)
    words = "show me flights from boston to denver".split()
    [prediction] = task.predict([words])
    assert len(prediction["slots"]) == len(words) and prediction["intent"] in task.preprocessor.intent_labels


def test_paper_sweep_is_the_12_run_grid(tmp_path):
    from hydra import compose, initialize_config_dir

    from transformer_lab.runtime.config import PROJECT_ROOT

    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=bert/sentiment", "hparams_search=bert_paper"],
                      return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    grid = list(itertools.product(*(str(v).split(",") for v in params.values())))
    assert cfg.hydra.mode.name == "MULTIRUN" and len(grid) == 12
    assert set(params) == {"data.datamodule.batch_size", "task.lr", "trainer.max_epochs"}
    composed = compose_config("train", ["experiment=bert/sentiment"], tmp_path)
    assert composed.task.pretrained.endswith("artifacts/bert/pretrain/checkpoints/best.ckpt") and composed.test
