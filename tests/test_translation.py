"""Translation data, training and evaluation: the generated task, the checks on sentence pairs
(one line naming file and line, exit 2, nothing written), batching, the schedule, and a trained
tiny model translating through its checkpoint, the evaluation stage and the pipeline."""

import json
from pathlib import Path

import pytest
import torch
from conftest import PYTHON, ROOT, run

from transformer_lab.data.translation import (
    LengthBucketSampler,
    TranslationDataModule,
    builtin_pairs,
    collate,
    english_number,
    german_number,
    prepare,
    read_pairs,
)
from transformer_lab.errors import DataError
from transformer_lab.tasks.schedules import warmup_inverse_sqrt

MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


@pytest.mark.parametrize("n, english, german", [
    (2, "two", "zwei"), (13, "thirteen", "dreizehn"), (21, "twenty-one", "einundzwanzig"),
    (70, "seventy", "siebzig"), (101, "one hundred one", "einhunderteins"),
    (1000, "one thousand", "eintausend"), (3456, "three thousand four hundred fifty-six",
                                           "dreitausendvierhundertsechsundfünfzig"),
    (9999, "nine thousand nine hundred ninety-nine", "neuntausendneunhundertneunundneunzig"),
])
def test_numbers_in_both_languages(n, english, german):
    assert english_number(n) == english and german_number(n) == german


def test_generated_splits_are_distinct_and_reproducible():
    splits = builtin_pairs(n_train=300, n_val=40, n_test=40, seed=3)
    assert builtin_pairs(n_train=300, n_val=40, n_test=40, seed=3) == splits
    sources = [s for pairs in splits.values() for s, _ in pairs]
    assert len(sources) == len(set(sources)) == 380
    assert set(splits) == {"train", "val", "test_builtin"}
    source, target = splits["train"][0]
    assert source.endswith(".") and target.endswith(".") and target.split()[0] in ("ich", "du", "er", "sie", "wir")


def write_pairs(directory: Path, split: str, sources: list[str], targets: list[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{split}.en").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    (directory / f"{split}.de").write_text("".join(t + "\n" for t in targets), encoding="utf-8")


@pytest.fixture
def local_pairs(tmp_path) -> Path:
    directory = tmp_path / "pairs"
    pairs = builtin_pairs(n_train=200, n_val=30, n_test=30, seed=0)
    for split, name in (("train", "train"), ("val", "val"), ("test_builtin", "test_2016_flickr")):
        write_pairs(directory, name, [s for s, _ in pairs[split]], [t for _, t in pairs[split]])
    return directory


def test_local_directory_keeps_every_test_split_and_the_vocabulary_round_trips(local_pairs, tmp_path):
    summary = prepare("local", str(tmp_path / "out"), local_dir=str(local_pairs), vocab_size=300)
    assert list(summary["splits"]) == ["train", "val", "test_2016_flickr"]
    module = TranslationDataModule(str(tmp_path / "out"), max_len=32)
    p = module.preprocessor
    for text in ("sie kauft dreihundertzweiundvierzig rote Äpfel.", "wir malen zwölf große Vögel."):
        assert p.decode(p.encode([text])[0]) == text  # spaces and umlauts come back: what BLEU reads
    assert p.unk_id in p.encode(["Zebras"])[0]  # a letter no training sentence has
    assert (p.pad_id, p.bos_id, p.eos_id) == (0, 1, 2)


# one case in the quick suite, the others (a CLI process each, 20-30 s here) in the full one
# every damage through the data code (quick) and through the command line (slow: a stage's start-up)
@pytest.mark.parametrize("via", ["api", pytest.param("cli", marks=pytest.mark.slow)])
@pytest.mark.parametrize("damage, expected", [
    ("shorter", r"train\.en has 200 lines but .*train\.de has 199: the two sides of a split are line-aligned"),
    ("empty", r"val\.de:4: empty line"),
    ("latin1", r"test_2016_flickr\.en:2: not valid UTF-8 \(byte 0xe4"),
])
def test_bad_pairs_are_one_line_exit_2_and_nothing_is_written(local_pairs, tmp_path, damage, expected, via):
    out = tmp_path / "prepared" / "translation"

    def prepare_cli():
        return run([PYTHON, ROOT / "pipelines" / "prepare.py", "data=translation", "data.source=local",
                    f"data.local_dir={local_pairs}", "data.vocab_size=300", f"data.prepared_dir={out}",
                    f"hydra.run.dir={tmp_path / 'hydra'}"])

    prepare("local", str(out), local_dir=str(local_pairs), vocab_size=300)  # the earlier, good output
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    if damage == "shorter":
        lines = (local_pairs / "train.de").read_text().splitlines()
        (local_pairs / "train.de").write_text("\n".join(lines[:-1]) + "\n")
    elif damage == "empty":
        lines = (local_pairs / "val.de").read_text().splitlines()
        lines[3] = "   "
        (local_pairs / "val.de").write_text("\n".join(lines) + "\n")
    else:
        lines = (local_pairs / "test_2016_flickr.en").read_bytes().split(b"\n")
        lines[1] = "M\u00e4nner".encode("latin-1")
        (local_pairs / "test_2016_flickr.en").write_bytes(b"\n".join(lines))
    if via == "cli":
        result = prepare_cli()
        assert result.returncode == 2, result.stderr
        [line] = result.stderr.strip().splitlines()
    else:
        with pytest.raises(DataError) as refused:
            prepare("local", str(out), local_dir=str(local_pairs), vocab_size=300)
        [line] = [f"error: {refused.value}"]
    assert line.startswith("error: ") and __import__("re").search(expected, line), line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the earlier output is intact
    assert not list(out.parent.glob(".translation.*"))  # and no half-written copy beside it


def test_a_directory_without_a_validation_split_is_named(tmp_path):
    write_pairs(tmp_path / "d", "train", ["a b."], ["c d."])
    with pytest.raises(DataError, match=r"no val\.en"):
        prepare("local", str(tmp_path / "out"), local_dir=str(tmp_path / "d"))


def test_hub_source_offline_is_one_clear_line(offline_hub, tmp_path):
    with pytest.raises(DataError, match=r"could not load 'bentrevett/multi30k' from the Hugging Face Hub .*"
                                        r"data\.local_dir=DIR"):
        prepare("hub", str(tmp_path / "out"))


def test_batches_shift_the_target_right_and_mask_padding():
    batch = collate([{"source": [5, 6, 2], "target": [7, 8, 9, 2], "reference": "x"},
                     {"source": [5, 2], "target": [7, 2], "reference": "y"}], pad_id=0, bos_id=1)
    assert batch["input_ids"].tolist() == [[5, 6, 2], [5, 2, 0]]
    assert batch["decoder_input_ids"].tolist() == [[1, 7, 8, 9], [1, 7, 0, 0]]
    assert batch["labels"].tolist() == [[7, 8, 9, 2], [7, 2, -100, -100]]
    assert batch["references"] == ["x", "y"]


def test_length_buckets_cover_every_pair_once_and_follow_seed_and_epoch():
    lengths = [(i * 7) % 23 + 1 for i in range(500)]
    batches = list(LengthBucketSampler(lengths, 16, seed=0))
    assert sorted(i for b in batches for i in b) == list(range(500))
    assert len(batches) == len(LengthBucketSampler(lengths, 16, seed=0))
    assert batches == list(LengthBucketSampler(lengths, 16, seed=0))
    assert batches != list(LengthBucketSampler(lengths, 16, seed=0, epoch=1))
    epoch = [0]
    live = LengthBucketSampler(lengths, 16, seed=0, epoch=lambda: epoch[0])  # the trainer's epoch, read per pass
    assert list(live) == batches
    epoch[0] = 1
    assert list(live) == list(LengthBucketSampler(lengths, 16, seed=0, epoch=1))  # a resumed run's draw
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / len(batches)
    assert spread < 3  # similar lengths in a batch (random batches would spread ~20)


def test_inverse_square_root_schedule_peaks_at_the_end_of_warm_up():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = warmup_inverse_sqrt(optimizer, warmup_steps=100)
    rates = []
    for _ in range(400):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates[0] == pytest.approx(0.01) and rates[99] == pytest.approx(1.0)
    assert rates[399] == pytest.approx(0.5)  # (100 / 400) ** 0.5
    assert max(rates) == rates[99]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny translation model trained a few hundred steps on the generated task, evaluated."""
    from transformer_lab.data.prepare import prepare as prepare_stage
    from transformer_lab.evaluation.translation import evaluate
    from transformer_lab.training.train import train
    from transformer_lab.runtime.config import compose_config

    root = tmp_path_factory.mktemp("translation")
    data = [f"paths.data_dir={root / 'data'}", "data.builtin.n_train=1500", "data.builtin.n_val=60",
            "data.builtin.n_test=60", "data.vocab_size=400"]
    prepare_stage(compose_config("prepare", ["data=translation", *data], root / "prep"))
    cfg = compose_config("train", ["experiment=translation/builtin", "logger=none", "trainer.max_epochs=6",
                                   "callbacks.rich_progress_bar=null", *data], root / "train")
    metrics = train(cfg)
    eval_cfg = compose_config("evaluate", ["evaluate=translation", f"train_dir={root / 'train'}", "logger=none", *data],
                              root / "eval")
    return root, metrics, evaluate(eval_cfg)


@pytest.mark.slow  # trains a model first (a minute): the full suite's
def test_training_learns_and_evaluation_scores_every_split(trained):
    root, metrics, scores = trained
    assert metrics["val/bleu"] > 40  # from ~0 at the start: the model translates
    assert set(scores) == {"bleu_val", "chrf_val", "sentences_val", "bleu_test_builtin", "chrf_test_builtin",
                           "sentences_test_builtin"}
    assert scores["bleu_test_builtin"] > 40 and scores["sentences_test_builtin"] == 60
    assert json.loads((root / "eval" / "metrics.json").read_text()) == scores
    translations = (root / "eval" / "translations_test_builtin.txt").read_text().splitlines()
    assert len(translations) == 60
    assert "reference:" in (root / "eval" / "samples.md").read_text()
    assert (root / "eval" / "cross_attention.png").stat().st_size > 10_000


@pytest.mark.slow  # trains a model first (a minute): the full suite's
def test_the_trained_model_translates_through_the_pipeline(trained):
    from transformer_lab import pipeline

    root, _, _ = trained
    translate = pipeline(model=str(root / "train"))
    [pair] = builtin_pairs(n_train=1500, n_val=60, n_test=60, seed=0)["test_builtin"][:1]
    greedy = translate(pair[0], num_beams=1)
    assert set(greedy) == {"translation_text"} and greedy["translation_text"]
    assert translate([pair[0]], num_beams=1) == [greedy]
    task = translate.model
    source_tokens, target_tokens, weights = task.cross_attention(pair[0], pair[1])
    assert weights.shape == (2, 4, len(target_tokens), len(source_tokens))
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="../shared/data/multi30k is not here")
def test_multi30k_reads_in_its_own_layout():
    pairs = read_pairs(MULTI30K, "test_2016_flickr", "en", "de")
    assert len(pairs) == 1000 and all(s and t for s, t in pairs)


@pytest.mark.slow
def test_the_benchmark_writes_its_keys_for_any_directory_in_the_layout(local_pairs, tmp_path):
    """benchmarks/translation.py on the generated pairs for a few seconds: the JSON contract,
    both models from the same weights, and bad input as one line, exit 2, nothing written."""
    out = tmp_path / "translation.json"
    command = [PYTHON, ROOT / "benchmarks" / "translation.py", "--data", local_pairs, "--minutes", "0.05",
               "--size", "tiny", "--vocab-size", "300", "--batch-size", "16", "--evals", "1", "--beams", "2",
               "--out", out]
    result = run(command, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    scores = json.loads(out.read_text())
    for key in ("bleu_test_2016_flickr", "chrf_test_2016_flickr", "hf_bleu_test_2016_flickr", "train_seconds",
                "params", "tokens_per_s", "seconds_per_step", "hf_seconds_per_step", "val_bleu", "hf_val_bleu"):
        assert key in scores, key
    assert scores["steps"] >= 1 and scores["curve"][-1]["steps"] == scores["steps"]
    assert out.with_suffix(".png").is_file()
    samples = scores["samples"]["test_2016_flickr"]
    assert len(samples) == 5 and {"source", "reference", "ours", "hf"} <= set(samples[0])

    (local_pairs / "val.en").write_text("one line only\n")
    out.unlink()
    result = run(command)
    assert result.returncode == 2 and not out.exists()
    assert result.stderr.strip().startswith("error: ") and "val.en has 1 lines but" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
