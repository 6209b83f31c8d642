"""Transfer measurement: the label-efficiency sampler, GLUE-layout directories, the comparison of
starts and benchmarks/transfer.py's JSON contract."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from transformer_lab.data.text_classification import read_split_directory, stratified_subset
from transformer_lab.errors import TransformerLabError

ROOT = Path(__file__).resolve().parents[1]


def examples(n_pos: int, n_neg: int) -> list[dict]:
    return ([{"text_a": f"good {i}", "text_b": None, "label": "1"} for i in range(n_pos)]
            + [{"text_a": f"bad {i}", "text_b": None, "label": "0"} for i in range(n_neg)])


def test_label_efficiency_subsets_are_stratified_and_seeded():
    data = examples(700, 300)
    subset = stratified_subset(data, 100, seed=0)
    assert len(subset) == 100 and Counter(e["label"] for e in subset) == {"1": 70, "0": 30}
    assert subset == stratified_subset(data, 100, seed=0)  # same seed, same sentences in the same order
    assert {e["text_a"] for e in subset} != {e["text_a"] for e in stratified_subset(data, 100, seed=1)}
    odd = Counter(e["label"] for e in stratified_subset(examples(2, 1), 2, seed=0))
    assert sum(odd.values()) == 2 and odd["1"] >= 1  # largest remainder: the exact size, the majority first
    assert stratified_subset(data, None, seed=0) == data and len(stratified_subset(data, 5000, seed=0)) == 1000


def write_glue(directory: Path, test: bool) -> Path:
    directory.mkdir(parents=True)
    header = "\ufeffQuality\t#1 String\t#2 String\n"  # MRPC's files start with a byte-order mark
    rows = ['1\tHe said " it fits .\tIt fits , he said .\n', "0\tA cat .\tA dog .\n"]
    for name in ("train.tsv", "dev.tsv", *(["test.tsv"] if test else [])):
        (directory / name).write_text(header + "".join(rows), encoding="utf-8")
    return directory


def test_glue_directories_keep_their_splits_and_their_quotes(tmp_path):
    columns = {"text_a": "#1 String", "text_b": "#2 String", "label": "Quality"}
    splits = read_split_directory(write_glue(tmp_path / "mrpc", test=False), columns)
    assert [len(splits[s]) for s in ("train", "validation", "test")] == [2, 2, 0]
    assert splits["train"][0] == {"text_a": 'He said " it fits .', "text_b": "It fits , he said .", "label": "1"}
    assert len(read_split_directory(write_glue(tmp_path / "with_test", test=True), columns)["test"]) == 2
    with pytest.raises(TransformerLabError, match="column 'sentence' not in the header"):
        read_split_directory(tmp_path / "mrpc", {"text_a": "sentence", "text_b": None, "label": "label"})


def squad_file(path: Path, n_articles: int) -> Path:
    articles = [{"title": f"article {a}", "paragraphs": [{"context": f"Ada {a} was born in Paris.", "qas": [
        {"id": f"{a}-{q}", "question": f"Where was Ada {a} born ({q})?",
         "answers": [{"text": "Paris", "answer_start": len(f"Ada {a} was born in ")}]} for q in range(3)]}]}
        for a in range(n_articles)]
    path.write_text(json.dumps({"version": "1.1", "data": articles}))
    return path


def test_squad_is_split_by_article_never_across_one(tmp_path):
    from transformer_lab.data.qa import read_squad, split_articles

    source = squad_file(tmp_path / "dev-v1.1.json", 12)
    split = split_articles(source, 9, tmp_path / "split", seed=0)
    train, heldout = read_squad(split["train"]), read_squad(split["heldout"])
    assert len(train) == 27 and len(heldout) == 9
    assert not {e["context"] for e in train} & {e["context"] for e in heldout}  # no article on both sides
    assert {e["id"] for e in train} | {e["id"] for e in heldout} == {e["id"] for e in read_squad(source)}
    again = split_articles(source, 9, tmp_path / "again", seed=0)
    assert again["train"].read_text() == split["train"].read_text()  # seeded
    with pytest.raises(TransformerLabError, match="12 articles; cannot keep 12"):
        split_articles(source, 12, tmp_path / "all", seed=0)


@pytest.mark.skipif(not (ROOT / ".." / "shared" / "data" / "squad").is_dir(), reason="../shared/data/squad absent")
def test_the_real_squad_dev_file_splits_38_to_10_articles(tmp_path):
    from transformer_lab.data.qa import split_articles

    split = split_articles(ROOT / ".." / "shared" / "data" / "squad" / "dev-v1.1.json", 38, tmp_path, seed=0)
    titles = {name: {a["title"] for a in json.loads(path.read_text())["data"]} for name, path in split.items()}
    assert (len(titles["train"]), len(titles["heldout"])) == (38, 10) and not titles["train"] & titles["heldout"]


def comparison_config(tmp_path, starts: dict) -> OmegaConf:
    return OmegaConf.create({"task_name": "sentiment", "title": "t", "metrics": ["val/acc", "test/acc"],
                             "logger": None, "paths": {"output_dir": str(tmp_path / "out")}, "starts": starts})


def test_the_comparison_of_starts_reads_each_runs_scores_and_names_a_missing_one(tmp_path):
    from transformer_lab.evaluation.transfer import compare

    (tmp_path / "out").mkdir()
    for name, score in (("scratch", 0.5), ("minilm", 0.8)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps({"val/acc": score, "test/acc": score, "params": 7}))
    starts = {name: {"dir": str(tmp_path / name), "stage": f"finetune_{name}"} for name in ("scratch", "minilm")}
    assert compare(comparison_config(tmp_path, starts)) == {"scratch": {"val/acc": 0.5, "test/acc": 0.5},
                                                            "minilm": {"val/acc": 0.8, "test/acc": 0.8}}
    assert (tmp_path / "out" / "comparison.png").is_file()
    assert (tmp_path / "out" / "comparison.csv").read_text().splitlines()[0] == "start,val/acc,test/acc,params"
    starts["own"] = {"dir": str(tmp_path / "own"), "stage": "finetune_sentiment"}
    with pytest.raises(TransformerLabError, match=r"own/metrics.json: not found.*dvc repro finetune_sentiment"):
        compare(comparison_config(tmp_path, starts))


@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_transfer_benchmark_writes_the_json_contract_and_resumes(tmp_path):
    data = tmp_path / "sst2"
    data.mkdir()
    words = ["great fun", "a joy", "superb acting", "dull and long", "awful plot", "a bore"]
    rows = "".join(f"{w} {i}\t{int(k < 3)}\n" for i in range(4) for k, w in enumerate(words))
    for name in ("train.tsv", "dev.tsv", "test.tsv"):
        (data / name).write_text("sentence\tlabel\n" + rows)
    out = tmp_path / "transfer.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "transfer.py"), "--task", "sst2", "--data", str(data),
               "--init", "scratch", "--train-examples", "6,all", "--seeds", "0", "--min-steps", "2", "--epochs", "1",
               "--set", "model.n_layers=1", "--set", "model.d_model=32", "--set", "model.n_heads=2",
               "--set", "model.d_ff=64", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads(out.read_text())
    assert [(r["init"], r["train_examples"], r["seed"]) for r in written["results"]] == [("scratch", 6, 0),
                                                                                       ("scratch", 24, 0)]
    for row in written["results"]:
        assert row["train_seconds"] > 0 and 0 <= row["dev"]["acc"] <= 1 and 0 <= row["test"]["acc"] <= 1
    summary = {(e["init"], e["train_examples"]): e for e in written["summary"]}
    assert summary[("scratch", 6)]["dev_acc"]["mean"] == written["results"][0]["dev"]["acc"]
    assert "| scratch | 6 | 1 |" in result.stdout  # the summary table at the end of the run
    again = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert again.returncode == 0 and "transfer sst2:" not in again.stdout  # both rows kept, none re-run
    assert json.loads(out.read_text())["results"] == written["results"]


def test_own_start_and_its_scratch_control_differ_only_in_the_weights(tmp_path):
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("transfer_benchmark", ROOT / "benchmarks" / "transfer.py")
    transfer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(transfer)
    sizes = {"n_layers": 4, "d_model": 256, "n_heads": 4, "d_ff": 1024, "max_len": 128}
    checkpoint = tmp_path / "pretrained.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"model_config": sizes,
                                                       "preprocessor": {"tokenizer": '{"version": "1.0"}'}}},
               checkpoint)
    own = transfer.start_overrides(f"own:{checkpoint}", tmp_path)
    control = transfer.start_overrides(f"scratch:{checkpoint}", tmp_path)
    assert own[0] == f"task.pretrained={checkpoint.resolve()}" and control[0] == "task.pretrained=null"
    assert own[1:] == control[1:] and "model.d_model=256" in control
    tokenizer = Path(control[1].split("=", 1)[1])
    assert tokenizer.read_text() == '{"version": "1.0"}'  # the checkpoint's own tokenizer, for both
