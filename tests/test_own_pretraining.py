"""benchmarks/own_pretraining.py: the learning-curve summary, the verdict against scratch and the
JSON contract the issue names (labels, starts{start: {n: {mean, std, seeds}}}, pretrain_minutes,
pretrain_objective, pretrain_tokens, machine) with its plot, on a tiny SST-2-shaped folder."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def benchmark():
    spec = importlib.util.spec_from_file_location("own_pretraining", ROOT / "benchmarks" / "own_pretraining.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(start: str, n: int, seed: int, acc: float) -> dict:
    return {"start": start, "labels": n, "seed": seed, "dev": {"acc": acc}}


def test_each_start_and_size_is_summed_up_over_its_seeds_and_judged_against_scratch():
    own_pretraining = benchmark()
    runs = [run("scratch", 500, s, a) for s, a in enumerate((0.60, 0.62, 0.64))]
    runs += [run("own", 500, s, a) for s, a in enumerate((0.70, 0.71, 0.72))]
    runs += [run("scratch", 100, s, a) for s, a in enumerate((0.50, 0.60, 0.55))]
    runs += [run("own", 100, s, a) for s, a in enumerate((0.56, 0.56, 0.56))]
    starts = own_pretraining.summarise(runs, [100, 500])
    assert starts["own"]["500"] == {"mean": 0.71, "std": 0.01, "seeds": [0.70, 0.71, 0.72]}
    assert starts["scratch"]["500"]["std"] == pytest.approx(0.02)  # the sample standard deviation
    assert "minilm" not in starts
    verdicts = own_pretraining.verdicts(starts)
    assert verdicts["500"] == {"own_minus_scratch": pytest.approx(0.09), "spread": 0.02, "ahead": True}
    # ahead by 0.01, inside scratch's spread of 0.05: not shown
    assert verdicts["100"]["ahead"] is False and verdicts["100"]["spread"] == pytest.approx(0.05)


def test_a_start_may_have_its_own_learning_rate_and_a_wrong_one_is_refused(tmp_path, capsys):
    from types import SimpleNamespace

    own_pretraining = benchmark()
    args = SimpleNamespace(lr=1e-3, start_lr=[own_pretraining.start_lr("minilm=5e-4")])
    assert own_pretraining.lr_of(args, "minilm") == 5e-4 and own_pretraining.lr_of(args, "own") == 1e-3
    with pytest.raises(SystemExit):
        own_pretraining.main(["--data", str(tmp_path), "--out", str(tmp_path / "out.json"), "--start-lr", "bert=1"])
    assert "argument --start-lr: 'bert=1': expected START=LR" in capsys.readouterr().err


def test_a_folder_without_sst2_files_is_one_line_and_exit_2(tmp_path, capsys):
    assert benchmark().main(["--data", str(tmp_path), "--out", str(tmp_path / "out.json")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    assert not (tmp_path / "out.json").exists()


@pytest.mark.slow  # pre-trains and fine-tunes five times (about a minute)
def test_the_benchmark_writes_the_json_contract_and_its_plot(tmp_path):
    data = tmp_path / "sst2"
    data.mkdir()
    words = ["great fun", "a joy to watch", "superb acting", "dull and long", "an awful plot", "a bore"]
    rows = "".join(f"{w} {i}\t{int(k < 3)}\n" for i in range(8) for k, w in enumerate(words))
    for name in ("train.tsv", "dev.tsv"):
        (data / name).write_text("sentence\tlabel\n" + rows)
    out = tmp_path / "own.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "own_pretraining.py"), "--data", str(data),
               "--labels", "6,12", "--seeds", "0", "--starts", "scratch,own,minilm", "--out", str(out),
               "--size", "tiny", "--layers", "1", "--d-model", "64", "--pretrain-epochs", "1",
               "--pretrain-batch-size", "8", "--min-steps", "2", "--epochs", "1"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads(out.read_text())
    assert written["labels"] == [6, 12]
    assert set(written["starts"]) == {"scratch", "own", "minilm"}
    for start in written["starts"].values():
        for n in ("6", "12"):
            assert set(start[n]) == {"mean", "std", "seeds"} and len(start[n]["seeds"]) == 1
            assert 0 <= start[n]["mean"] <= 1
    assert written["pretrain_objective"] == "mlm" and written["pretrain_tokens"] > 0
    assert 0 < written["pretrain_minutes"] < 5
    assert {"cpu", "torch"} <= set(written["machine"]) and "own_pretraining.py" in written["command"]
    assert (tmp_path / "own.png").stat().st_size > 0
    again = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert again.returncode == 0 and "own_pretraining: own n=" not in again.stdout  # resumed: nothing re-run
