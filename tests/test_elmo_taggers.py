"""benchmarks/elmo_taggers.py: one tagger with and without frozen ELMo features, same budget, every
run an MLflow run of one experiment; CoNLL read into the tagger's schema, cased."""

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import elmo_taggers  # noqa: E402
from test_conll import write_toy_conll  # noqa: E402
from test_elmo import save_tiny_bilm  # noqa: E402


def test_conll_becomes_tagger_examples_with_one_shared_intent(tmp_path):
    splits = elmo_taggers.read_splits("conll", str(write_toy_conll(tmp_path / "conll")))
    assert [len(splits[s]) for s in ("train", "dev", "test")] == [200, 40, 40]
    first = splits["train"][0]
    assert len(first["words"]) == len(first["slots"]) == 6 and first["slots"][:2] == ["B-PER", "O"]
    assert {e["intent"] for split in splits.values() for e in split} == {"sentence"}


def test_both_starts_train_with_one_recipe_and_land_side_by_side_in_mlflow(tmp_path):
    from mlflow import MlflowClient

    torch.manual_seed(0)
    save_tiny_bilm(tmp_path / "elmo.ckpt", ["<S>", "</S>", "<UNK>", "met", "in", "Bonn", "Anna"])
    out = tmp_path / "result.json"
    args = ["--task", "conll", "--data", str(write_toy_conll(tmp_path / "conll")), "--elmo", str(tmp_path / "elmo.ckpt"),
            "--epochs", "1", "--seeds", "0", "--out", str(out),
            "--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.n_layers=1"]
    assert elmo_taggers.main(args) == 0
    result = json.loads(out.read_text())
    none, elmo = result["runs"]
    assert (none["start"], elmo["start"]) == ("none", "elmo")
    assert elmo["params"] > none["params"] and elmo["trainable_params"] < elmo["params"]  # the biLM is frozen
    assert set(result["summary"]) == {"none", "elmo"} and 0 <= result["summary"]["elmo"]["slot_f1"]["mean"] <= 1
    assert out.with_suffix(".png").stat().st_size > 0

    client = MlflowClient()  # the test's own store (conftest)
    runs = client.search_runs([client.get_experiment_by_name("elmo_taggers_conll").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["conll-elmo-seed0", "conll-none-seed0"]
    assert all("val/slot_f1" in r.data.metrics for r in runs)

    before = out.read_text()
    assert elmo_taggers.main(args) == 0  # the same settings again: the runs already measured are kept
    assert json.loads(out.read_text())["runs"] == json.loads(before)["runs"]
    assert len(client.search_runs([runs[0].info.experiment_id])) == 2
