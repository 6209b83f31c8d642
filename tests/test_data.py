import json
import re
from pathlib import Path

import datasets
import pytest
from conftest import PYTHON, ROOT, SHARED_DATA, run

from transformer_lab.data.atis import (
    AtisDataModule,
    AtisPreprocessor,
    examples_from_hub_rows,
    load_hub_atis,
    prepare_atis,
    read_seq_in_dir,
)
from transformer_lab.data.atis_builtin import generate_atis_sample
from transformer_lab.errors import DataError


def write_split(root: Path, split: str, rows: list[tuple[str, str, str]]) -> None:
    d = root / split
    d.mkdir(parents=True, exist_ok=True)
    (d / "seq.in").write_text("".join(f"{r[0]}\n" for r in rows))
    (d / "seq.out").write_text("".join(f"{r[1]}\n" for r in rows))
    (d / "label").write_text("".join(f"{r[2]}\n" for r in rows))


GOOD = [
    ("show me flights from boston to denver", "O O O O B-fromloc.city_name O B-toloc.city_name", "flight"),
    ("what is the fare to dallas", "O O O O O B-toloc.city_name", "airfare"),
]


@pytest.fixture
def seq_in_dir(tmp_path) -> Path:
    for split in ("train", "dev", "test"):
        write_split(tmp_path / "atis", split, GOOD)
    return tmp_path / "atis"


def test_builtin_sample_is_seeded_and_rich_enough():
    a, b = generate_atis_sample(seed=3), generate_atis_sample(seed=3)
    assert a == b and a != generate_atis_sample(seed=4)
    train = a["train"]
    assert len(train) == 4000
    assert len({e["intent"] for e in train}) >= 10
    assert len({t[2:] for e in train for t in e["slots"] if t != "O"}) >= 30
    assert any("#" in e["intent"] for e in train)  # a multi-intent class, as in ATIS
    for e in train[:200]:
        assert len(e["words"]) == len(e["slots"])


def test_local_directory_parses(seq_in_dir):
    splits = read_seq_in_dir(seq_in_dir)
    assert splits["train"][0] == {"words": GOOD[0][0].split(), "slots": GOOD[0][1].split(), "intent": "flight"}


@pytest.mark.skipif(not (SHARED_DATA / "atis").is_dir(), reason="shared ATIS copy not present")
def test_real_atis_parses_with_published_sizes():
    splits = read_seq_in_dir(SHARED_DATA / "atis")
    assert [len(splits[s]) for s in ("train", "dev", "test")] == [4478, 500, 893]
    assert len({e["intent"] for e in splits["train"]}) == 21


def test_hub_rows_convert_to_the_same_schema():
    rows = datasets.Dataset.from_dict({
        "id": [0, 1], "intent": ["flight", "airfare"],
        "text": [GOOD[0][0], GOOD[1][0]], "slots": [GOOD[0][1], GOOD[1][1]],
    })
    assert examples_from_hub_rows(rows, "hub[train]") == read_seq_in_dir_like(GOOD)
    bad = datasets.Dataset.from_dict({"id": [0], "intent": ["flight"], "text": ["a b"], "slots": ["O"]})
    with pytest.raises(DataError, match=r"hub\[train\] row 0: 1 slot tags for 2 words"):
        examples_from_hub_rows(bad, "hub[train]")


def read_seq_in_dir_like(rows):
    return [{"words": r[0].split(), "slots": r[1].split(), "intent": r[2]} for r in rows]


def test_hub_offline_gives_a_clear_error(offline_hub):
    with pytest.raises(DataError, match="could not load 'tuetschek/atis' from the Hugging Face Hub.*offline"):
        load_hub_atis("tuetschek/atis")


def test_unseen_words_and_labels_map_to_unk(tmp_path):
    splits = {
        "train": read_seq_in_dir_like(GOOD),
        "dev": read_seq_in_dir_like(GOOD),
        "test": [{"words": ["fly", "to", "mars"], "slots": ["O", "O", "B-toloc.planet"], "intent": "space"}],
    }
    summary = prepare_atis(splits, tmp_path / "prepared")
    assert summary["test"]["unseen_intents"] == 1 and summary["test"]["unseen_slot_tags"] == 1
    vocab = AtisPreprocessor.from_prepared(tmp_path / "prepared")
    encoded = vocab.encode(splits["test"][0])
    assert encoded["input_ids"] == [vocab.cls_id, vocab.unk_id, vocab.word_id["to"], vocab.unk_id]
    assert encoded["intent_label"] == vocab.intent_id["UNK"]
    assert encoded["slot_labels"][2] == vocab.slot_id["UNK"]
    dm = AtisDataModule(str(tmp_path / "prepared"), batch_size=2)
    dm.setup()
    batch = next(iter(dm.test_dataloader()))
    assert batch["input_ids"].shape == (1, 4) and batch["slot_labels"].shape == (1, 3)


def test_prepared_vocabulary_comes_from_train_only(tmp_path):
    splits = {"train": read_seq_in_dir_like(GOOD[:1]), "dev": read_seq_in_dir_like(GOOD[1:]),
              "test": read_seq_in_dir_like(GOOD[1:])}
    prepare_atis(splits, tmp_path / "p")
    vocab = json.loads((tmp_path / "p" / "vocab.json").read_text())
    assert "boston" in vocab and "dallas" not in vocab
    assert json.loads((tmp_path / "p" / "intent_labels.json").read_text()) == ["UNK", "flight"]


# ---------------------------------------------------------------- bad input
def corrupt_tag_count(d: Path):
    (d / "dev" / "seq.out").write_text("O O O O B-fromloc.city_name O\nO O O O O B-toloc.city_name\n")
    return r"dev/seq\.out:1: 6 slot tags for 7 words"


def corrupt_empty(d: Path):
    (d / "test" / "label").write_text("")
    return r"test/label: file is empty"


def corrupt_missing_split(d: Path):
    for f in (d / "dev").iterdir():
        f.unlink()
    (d / "dev").rmdir()
    return r"dev: missing split directory"


def corrupt_encoding(d: Path):
    (d / "train" / "seq.in").write_bytes(b"show me flights\nto m\xfcnchen please\n")
    return r"train/seq\.in:2: not valid UTF-8"


def corrupt_line_count(d: Path):
    (d / "train" / "label").write_text("flight\n")
    return r"train/label: 1 lines but .*seq\.in has 2"


def corrupt_bad_tag(d: Path):
    (d / "test" / "seq.out").write_text("O O O O X-city O B-toloc.city_name\nO O O O O B-toloc.city_name\n")
    return r"test/seq\.out:1: slot tag 'X-city' is not O"


@pytest.mark.parametrize("corrupt", [corrupt_tag_count, corrupt_empty, corrupt_missing_split, corrupt_encoding,
                                     corrupt_line_count, corrupt_bad_tag])
def test_bad_input_names_file_and_line(seq_in_dir, corrupt):
    expected = corrupt(seq_in_dir)
    with pytest.raises(DataError, match=expected):
        read_seq_in_dir(seq_in_dir)


def prepare_cli(data_dir: Path, out: Path):
    return run([PYTHON, ROOT / "pipelines" / "prepare.py", "data.source=local", f"data.local_dir={data_dir}",
                f"data.prepared_dir={out}", f"hydra.run.dir={out.parent / 'hydra'}"])


@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_cli_bad_input_is_one_line_exit_2_and_leaves_nothing(seq_in_dir, tmp_path):
    out = tmp_path / "prepared" / "atis"
    assert prepare_cli(seq_in_dir, out).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    expected = corrupt_tag_count(seq_in_dir)
    result = prepare_cli(seq_in_dir, out)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and re.search(expected, lines[0]), result.stderr
    # the earlier good output is untouched and no temporary directory is left behind
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(before) == ["dev.parquet", "intent_labels.json", "slot_labels.json", "summary.json",
                              "test.parquet", "train.parquet", "vocab.json"]
    assert [p.name for p in out.parent.iterdir() if p.name != "hydra"] == ["atis"]


def test_failed_write_leaves_no_partial_directory(tmp_path, monkeypatch):
    splits = {s: read_seq_in_dir_like(GOOD) for s in ("train", "dev", "test")}

    def explode(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(datasets.Dataset, "to_parquet", explode)
    with pytest.raises(OSError, match="disk full"):
        prepare_atis(splits, tmp_path / "out" / "atis")
    assert list((tmp_path / "out").iterdir()) == []


def directory_readers():
    """Every reader of a file the user names, and what it says it expected instead of a directory."""
    from transformer_lab.data import conll, corpus, gpt, text_classification, translation

    return [
        (translation.read_lines, "a text file of sentences, one a line"),
        (conll.read_conll, "a CoNLL-2003 file"),
        (corpus.read_text_file, "a text file"),
        (gpt.read_choices_jsonl, "a JSON-lines file"),
        (text_classification.read_fasttext_labels, "a text file of '__label__X text' lines"),
        (lambda path: text_classification.read_table(path, "text", None, "label"), "a CSV or TSV file"),
    ]


@pytest.mark.parametrize("case", range(len(directory_readers())))
def test_a_directory_where_a_file_is_expected_is_named_a_directory(tmp_path, case):
    read, expected = directory_readers()[case]
    folder = tmp_path / "train.txt"
    folder.mkdir()
    with pytest.raises(DataError, match=rf"^{re.escape(str(folder))}: is a directory, expected {re.escape(expected)}"):
        read(folder)
    with pytest.raises(DataError, match=rf"^{re.escape(str(tmp_path / 'absent.txt'))}: .*not found"):
        read(tmp_path / "absent.txt")


def test_an_image_folder_of_one_class_says_so(tmp_path, offline_hub):  # offline_hub: listed afresh, not cached
    import numpy as np
    from PIL import Image

    from transformer_lab.data.images import prepare

    (tmp_path / "images" / "cat").mkdir(parents=True)
    for i in range(4):
        Image.fromarray(np.full((8, 8), 40 * i, dtype=np.uint8)).save(tmp_path / "images" / "cat" / f"{i}.png")
    with pytest.raises(DataError, match=rf"^{re.escape(str(tmp_path / 'images'))}: the image folder has one class "
                                        r"\('cat'\): a classifier needs at least 2$"):
        prepare("local", str(tmp_path / "out"), local_dir=str(tmp_path / "images"))
