"""CoNLL-2003 named entities: IOB1 -> BIO, reading the files, entity F1 against seqeval, and a
tagger that learns and predicts one tag per word."""

import random
from pathlib import Path

import lightning as L
import pytest
import torch

from transformer_lab.data.conll import ConllDataModule, iob1_to_bio, read_conll, read_conll_dir
from transformer_lab.errors import DataError
from transformer_lab.tasks.metrics import SlotF1

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "conll2003"

SAMPLE = """-DOCSTART- -X- O O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O
. . O O

Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER
met VBD I-VP O
Anna NNP I-NP I-PER
Karin NNP I-NP B-PER
in IN I-PP O
Bonn NNP I-NP I-LOC
"""


def test_iob1_becomes_bio():
    assert iob1_to_bio(["I-PER", "I-PER", "O", "I-LOC"]) == ["B-PER", "I-PER", "O", "B-LOC"]
    # B- in IOB1 marks a second entity of the same type touching the first; it stays a start
    assert iob1_to_bio(["I-PER", "B-PER", "I-PER"]) == ["B-PER", "B-PER", "I-PER"]
    assert iob1_to_bio(["I-ORG", "I-MISC", "I-MISC"]) == ["B-ORG", "B-MISC", "I-MISC"]  # a change of type starts one
    assert iob1_to_bio(["O", "O"]) == ["O", "O"]


def test_conll_files_read_as_bio_sentences(tmp_path):
    path = tmp_path / "eng.train"
    path.write_text(SAMPLE)
    first, second = read_conll(path)
    assert first == {"words": ["EU", "rejects", "German", "call", "."], "tags": ["B-ORG", "O", "B-MISC", "O", "O"]}
    assert second["tags"] == ["B-PER", "I-PER", "O", "B-PER", "B-PER", "O", "B-LOC"]
    path.write_text(SAMPLE.replace("rejects VBZ I-VP O", "rejects VBZ I-VP X-ORG"))
    with pytest.raises(DataError, match=r"eng.train:4: expected 'word ... NER-tag'"):
        read_conll(path)
    path.write_text(SAMPLE)
    with pytest.raises(DataError, match="eng.testa: file not found"):
        read_conll_dir(tmp_path)


def random_tags(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG", "B-MISC"]) for _ in range(n)]


def test_entity_f1_equals_seqeval():
    from seqeval.metrics import f1_score

    rng = random.Random(0)
    gold = [iob1_to_bio(random_tags(rng, rng.randint(1, 15))) for _ in range(300)]
    # predictions: gold with a fifth of the tags changed, ill-formed sequences (I- after O) included
    predicted = [[t if rng.random() > 0.2 else rng.choice(["O", "I-PER", "B-LOC", "I-MISC"]) for t in s] for s in gold]
    metric = SlotF1()
    metric.update(predicted, gold)
    assert metric.compute().item() == pytest.approx(f1_score(gold, predicted), abs=1e-6)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data/conll2003 not present")
def test_entity_f1_equals_seqeval_on_the_real_dev_file():
    from seqeval.metrics import f1_score

    gold = [s["tags"] for s in read_conll(SHARED / "eng.testa")]
    assert len(gold) == 3250
    rng = random.Random(1)
    predicted = [["O" if rng.random() < 0.1 else t for t in s] for s in gold]
    metric = SlotF1()
    metric.update(predicted, gold)
    assert metric.compute().item() == pytest.approx(f1_score(gold, predicted), abs=1e-6)


def write_toy_conll(directory: Path) -> Path:
    """Sentences where a capitalised city after "in" is a LOC and a name after "met" a PER."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    cities, names = ["Bonn", "Paris", "Rome", "Oslo"], ["Anna", "Peter", "Maria", "John"]
    for split, n in (("eng.train", 200), ("eng.testa", 40), ("eng.testb", 40)):
        lines = []
        for _ in range(n):
            lines += [f"{rng.choice(names)} NNP I-NP I-PER", "met VBD I-VP O", f"{rng.choice(names)} NNP I-NP I-PER",
                      "in IN I-PP O", f"{rng.choice(cities)} NNP I-NP I-LOC", ". . O O", ""]
        (directory / split).write_text("\n".join(lines))
    return directory


def test_a_tagger_learns_entities_and_predicts_one_tag_per_word(tmp_path):
    from tokenizers import Tokenizer

    from transformer_lab.data.tokenizers import train_tokenizer
    from transformer_lab.models.bert import BertTaggerConfig
    from transformer_lab.tasks.token_classification import TokenClassificationTask

    data_dir = write_toy_conll(tmp_path / "conll")
    texts = [" ".join(s["words"]) for s in read_conll(data_dir / "eng.train")]
    tokenizer_path = tmp_path / "tokenizer.json"
    train_tokenizer("wordpiece", texts, 200, lowercase=True).save(str(tokenizer_path))
    data = ConllDataModule(str(data_dir), str(tokenizer_path), batch_size=16)
    config = BertTaggerConfig(size="tiny", n_layers=1, d_model=64, n_heads=2, max_len=64, **data.model_kwargs())
    task = TokenClassificationTask(config.to_dict(), data.preprocessor.to_state(), lr=3e-3)
    L.seed_everything(0)
    trainer = L.Trainer(max_epochs=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu")
    trainer.fit(task, datamodule=data)
    scores = trainer.test(task, datamodule=data, verbose=False)[0]
    assert scores["test/f1"] > 0.9
    assert isinstance(Tokenizer.from_str(task.hparams.preprocessor["tokenizer"]), Tokenizer)
    mode = task.training
    tags = task.predict([["Anna", "met", "Peter", "in", "Oslo", "."], ["in"]])
    assert tags[0] == ["B-PER", "O", "B-PER", "O", "B-LOC", "O"] and len(tags[1]) == 1
    assert task.training == mode and torch.is_grad_enabled()  # predict hands the modes back
