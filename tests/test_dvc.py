"""`dvc repro` of the real dvc.yaml on a fresh copy of the project, with tiny parameters."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import copy_project
from test_pipeline_deps import RUNS_BERT
from mlflow import MlflowClient

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def dvc(project: Path, *args: str, succeeds: bool = True, activated: bool = False,
        warm: bool = False) -> subprocess.CompletedProcess:
    # `.venv/bin/dvc ...` from a fresh shell: the venv is not on PATH (a stage's `python3` is some
    # other Python, which hands over to the project's .venv), and no tracking URI is set (the
    # default local store). activated: after `source .venv/bin/activate`, which the queue needs
    # (DVC starts its queue worker as `dvc`, found on PATH).
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PROJECT_ROOT", "VIRTUAL_ENV")}
    others = [p for p in env["PATH"].split(os.pathsep) if Path(p) != BIN]
    env["PATH"] = os.pathsep.join([str(project / ".venv" / "bin"), *others] if activated else others)
    wrapper = [str(project / ".venv" / "bin" / "python"), "-m", "transformer_lab.runtime.warm_start"] if warm else []
    result = subprocess.run([*wrapper, str(project / ".venv" / "bin" / "dvc"), *args], cwd=project, env=env,
                            capture_output=True, text=True, timeout=1800)  # a hang guard, not a speed check: 6 min on CI, 18 on a busy 2-core VM
    assert (result.returncode == 0) == succeeds, \
        f"dvc {' '.join(args)}: exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def git(project: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=project, check=True,
                   capture_output=True)


def set_param(path: Path, key: str, old: str, new: str) -> None:
    text = path.read_text()
    assert f"{key}: {old}" in text, f"{path} has no '{key}: {old}'"
    path.write_text(text.replace(f"{key}: {old}", f"{key}: {new}", 1))


def ran_stages(output: str) -> list[str]:
    return re.findall(r"Running stage '([a-z0-9_@]+)'", output)


def test_dvc_pipeline_runs_once_then_only_what_changed(tmp_path):
    project = copy_project(tmp_path / "project")
    conf = project / "conf"
    for key, old, new in [("n_train", "4000", "300"), ("n_dev", "500", "60"), ("n_test", "800", "60")]:
        set_param(conf / "data" / "atis.yaml", key, old, new)
    set_param(conf / "trainer" / "default.yaml", "max_epochs", "15", "1")
    set_param(conf / "experiment" / "word2vec" / "corpus.yaml", "max_epochs", "5", "1")
    set_param(conf / "experiment" / "elmo" / "pretrain.yaml", "max_epochs", "2", "1")
    set_param(conf / "experiment" / "bert" / "pretrain.yaml", "max_epochs", "2", "1")
    for key, old, new in [("n_train", "3000", "300"), ("n_validation", "300", "60"), ("n_test", "300", "60")]:
        set_param(conf / "data" / "qa.yaml", key, old, new)
    set_param(conf / "data" / "bert_pretraining.yaml", "max_documents", "null", "60")
    set_param(conf / "experiment" / "gpt" / "pretrain.yaml", "max_epochs", "1", "1")
    set_param(conf / "data" / "gpt_pretraining.yaml", "samples_per_epoch", "6400", "320")
    set_param(conf / "experiment" / "gpt" / "sentiment.yaml", "max_epochs", "5", "1")
    set_param(conf / "experiment" / "vit" / "digits.yaml", "max_epochs", "35", "1")
    set_param(conf / "experiment" / "tabular" / "tab_transformer.yaml", "max_epochs", "100", "2")
    set_param(conf / "experiment" / "translation" / "builtin.yaml", "max_epochs", "3", "1")
    set_param(conf / "experiment" / "multimodal" / "base.yaml", "max_epochs", "8", "1")
    set_param(conf / "evaluate" / "translation.yaml", "max_sentences", "null", "128")
    for experiment, epochs in (("bert/sentiment", "5"), ("bert/pairs", "5"), ("atis/bert", "3"), ("bert/qa", "2"),
                                ("atis/builtin", "4")):
        set_param(conf / "experiment" / f"{experiment}.yaml", "max_epochs", epochs, "1")
    # every datamodule caps its splits alike (data.datamodule.max_examples): seconds per stage
    for data in ("atis_bert", "bert_pretraining", "elmo_pretraining", "gpt_pretraining", "gpt_sentiment", "images", "qa",
                 "sentiment", "translation"):
        set_param(conf / "data" / f"{data}.yaml", "max_examples", "null", "128")
    set_param(conf / "baseline" / "xgboost.yaml", "n_estimators", "2000", "100")
    # the pickled MLflow model of every run is tested in-process (test_train); here it would only cost time
    set_param(conf / "train.yaml", "log_trained_model", "true", "false")
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "tiny")
    (project / ".venv").symlink_to(BIN.parent)  # a user's clone has its own .venv (git-ignored)

    first = dvc(project, "repro", warm=True)
    assert sorted(ran_stages(first.stdout)) == sorted(["prepare_atis", "train_atis", "evaluate_atis", "prepare_corpus",
                                                       "train_tokenizers", "pretrain_word2vec", "evaluate_word2vec",
                                                       "pretrain_glove", "evaluate_glove", "pretrain_elmo", "evaluate_elmo", "train_atis_no_elmo",
                                                       "train_atis_elmo", "compare_atis_elmo",
                                                       "pretrain_bert", "finetune_sentiment", "finetune_pairs",
                                                       "finetune_sentiment_scratch", "finetune_sentiment_minilm",
                                                       "compare_sentiment",
                                                       "finetune_atis", "finetune_qa", "pretrain_gpt",
                                                       "generate_gpt", "finetune_gpt_sentiment", "prepare_images",
                                                       "train_vit", "evaluate_vit", "prepare_tabular",
                                                       "train_tabular@tab_transformer", "train_tabular@ft_transformer", "train_tabular@tab_mlp",
                                                       "train_xgboost", "train_logreg", "evaluate_tabular",
                                                       "prepare_translation", "train_translation",
                                                       "evaluate_translation", "prepare_multimodal",
                                                       *(f"train_multimodal@{v}" for v in
                                                         ("image", "text", "table", "joint", "late_fusion")),
                                                       "evaluate_multimodal"])
    variants = json.loads((project / "artifacts/multimodal/eval/comparison.json").read_text())
    assert set(variants) == {"image", "text", "table", "joint", "late_fusion"}
    assert all(0 <= s["test/macro_f1"] <= 1 for s in variants.values())
    comparison = json.loads((project / "artifacts/tabular/eval/comparison.json").read_text())
    assert set(comparison) == {"tab_transformer", "ft_transformer", "tab_mlp", "xgboost", "logistic_regression"}
    assert all(0 <= scores["test/auroc"] <= 1 for scores in comparison.values())
    # sentiment from three starts, side by side
    starts = json.loads((project / "artifacts/bert/sentiment_comparison/comparison.json").read_text())
    assert set(starts) == {"scratch", "own", "minilm"} and all(0 <= s["test/acc"] <= 1 for s in starts.values())
    # the ATIS tagger without and with ELMo features
    elmo_starts = json.loads((project / "artifacts/atis/elmo_comparison/comparison.json").read_text())
    assert set(elmo_starts) == {"without_elmo", "with_elmo"}
    assert all(0 <= s["val/slot_f1"] <= 1 for s in elmo_starts.values())
    translation = json.loads((project / "artifacts/translation/eval/metrics.json").read_text())
    assert 0 <= translation["bleu_test_builtin"] <= 100 and translation["sentences_test_builtin"] == 128
    eval_metrics = json.loads((project / "artifacts/atis/eval/metrics.json").read_text())
    assert 0 <= eval_metrics["test/slot_f1"] <= 1
    for plot in ("artifacts/atis/train/history.csv", "artifacts/atis/eval/intent_confusion.csv",
                 "artifacts/atis/eval/per_slot_f1.png", "artifacts/word2vec/eval/projection.csv",
                 "data/tokenizers/corpus/bpe/tokenizer.json", "artifacts/vit/eval/confusion.csv",
                 "artifacts/vit/eval/attention.png", "artifacts/vit/eval/misclassified.png",
                 "artifacts/tabular/eval/comparison.png", "artifacts/tabular/eval/comparison.csv",
                 "artifacts/bert/sentiment_comparison/comparison.png",
                 "artifacts/bert/sentiment_comparison/comparison.csv",
                 "artifacts/translation/eval/cross_attention.png", "artifacts/translation/eval/samples.md",
                 "artifacts/multimodal/eval/comparison.png", "artifacts/multimodal/eval/attention.png"):
        assert (project / plot).is_file()

    # Importing the package writes __pycache__ (timestamped .pyc files) into the source folders the
    # stages depend on: not a change. (The venv imports its own source; compile the copy's alike.)
    compiled = subprocess.run([sys.executable, "-m", "compileall", "-q", "src"], cwd=project)
    assert compiled.returncode == 0 and list((project / "src/transformer_lab/models").glob("__pycache__/*.pyc"))
    second = dvc(project, "repro")
    assert ran_stages(second.stdout) == [] and "up to date" in second.stdout

    # A comment added to BERT's code makes BERT's stages stale and no other: the image, table,
    # word2vec, ELMo, GPT, ViT and translation stages stay up to date (the layers import one way)
    bert = project / "src/transformer_lab/models/bert.py"
    original = bert.read_text()
    bert.write_text(original + "# a comment\n")
    stale = set(json.loads(dvc(project, "status", "dvc.yaml", "--json").stdout))
    assert stale == RUNS_BERT, sorted(stale ^ RUNS_BERT)
    bert.write_text(original)

    # A rerun that fails (here a setting of the wrong type) leaves the stage's previous outputs in place.
    trained = project / "artifacts/atis/train"
    before = {p: p.read_bytes() for p in [trained / "metrics.json", trained / "checkpoints/best.ckpt"]}
    set_param(conf / "task" / "joint_intent_slot.yaml", "lr", "1.0e-3", "fast")
    failed = dvc(project, "repro", "train_atis", succeeds=False, warm=True)
    assert "task.lr='fast': expected a number" in failed.stderr and "previous outputs are back" in failed.stderr
    assert {p: p.read_bytes() for p in before} == before
    set_param(conf / "task" / "joint_intent_slot.yaml", "lr", "fast", "1.0e-3")
    assert "up to date" in dvc(project, "status", "dvc.yaml").stdout

    # A queued experiment runs in a temporary copy of the project, re-runs only what its change
    # touches, and still logs into the project's MLflow store.
    git(project, "add", "-A")
    git(project, "commit", "-qm", "pipeline outputs")
    dvc(project, "exp", "run", "--queue", "-n", "two-heads", "-S", "conf/model/encoder.yaml:n_heads=2")
    third = dvc(project, "exp", "run", "--run-all", activated=True)
    assert sorted(ran_stages(third.stdout)) == ["compare_atis_elmo", "evaluate_atis", "train_atis",
                                                 "train_atis_elmo", "train_atis_no_elmo"]
    dvc(project, "exp", "apply", "two-heads")
    assert "n_heads: 2" in (conf / "model" / "encoder.yaml").read_text()
    assert "up to date" in dvc(project, "status", "dvc.yaml").stdout
    # What the experiment changed, and what it moved, in a table that fits a terminal
    columns = dvc(project, "exp", "show", "--only-changed", "--csv").stdout.splitlines()[0].split(",")
    assert [c for c in columns if c.endswith("n_heads")] and [c for c in columns if c.endswith("val/loss")]
    assert len(columns) < 40 and not [c for c in columns if c.startswith("src/")], columns

    # pre-train -> fine-tune: new pre-trained weights make every fine-tuning stage after them stale,
    # and nothing else (pre-training's own setting is read by no fine-tuning stage)
    set_param(conf / "task" / "bert_pretraining.yaml", "lr", "1.0e-3", "2.0e-3")
    fourth = dvc(project, "repro", "pretrain_bert")
    assert ran_stages(fourth.stdout) == ["pretrain_bert"]
    stale = dvc(project, "status", "dvc.yaml", "--json").stdout
    assert sorted(json.loads(stale)) == ["finetune_atis", "finetune_pairs", "finetune_qa", "finetune_sentiment"]
    assert all("artifacts/bert/pretrain/checkpoints" in str(changes) for changes in json.loads(stale).values())
    sentiment = json.loads((project / "artifacts/bert/sentiment/metrics.json").read_text())
    assert 0 <= sentiment["test/acc"] <= 1
    samples = json.loads((project / "artifacts/gpt/samples/samples.json").read_text())
    assert len(samples["samples"]) == 3 and samples["new_tokens"] > 0

    shown = json.loads(dvc(project, "exp", "show", "--json").stdout)
    workspace = next(e for e in shown if e["rev"] == "workspace")["data"]
    assert workspace["params"]["conf/model/encoder.yaml"]["data"]["n_heads"] == 2
    assert not [f for f, p in workspace["params"].items() if "_target_" in p["data"]]  # what matters, not wiring
    assert "test/slot_f1" in workspace["metrics"]["artifacts/atis/eval/metrics.json"]["data"]
    assert "two-heads" in {e["name"] for commit in shown for e in commit.get("experiments") or []}
    dvc(project, "plots", "show", "-o", str(tmp_path / "plots"))
    assert (tmp_path / "plots" / "index.html").is_file()

    # Both trainings are in the project's own MLflow store, with evaluation logged into each run.
    from gensim.models import KeyedVectors

    vectors = KeyedVectors.load_word2vec_format(project / "artifacts/word2vec/eval/vectors.txt")
    assert vectors.vector_size == 100 and vectors.index_to_key[0] == "the"

    client = MlflowClient(f"sqlite:///{project}/mlflow.db")
    [word2vec_run] = client.search_runs([client.get_experiment_by_name("word2vec").experiment_id])
    assert "eval/wordsim_spearman" in word2vec_run.data.metrics
    [elmo_run] = client.search_runs([client.get_experiment_by_name("elmo_pretrain").experiment_id])
    assert {"val/perplexity", "eval/val_word_ppl", "eval/top_same_word_cosine"} <= set(elmo_run.data.metrics)
    runs = client.search_runs([client.get_experiment_by_name("atis").experiment_id])
    encoder_runs = [r for r in runs if r.data.tags.get("dvc_stage") == "train_atis"]
    assert len(encoder_runs) == 2 and {r.data.params["model.n_heads"] for r in encoder_runs} == {"4", "2"}
    elmo_runs = [r for r in runs if r.data.tags.get("dvc_stage") == "train_atis_elmo"]
    assert len(elmo_runs) == 2 and all(r.data.params["task.elmo"].endswith("best.ckpt") for r in elmo_runs)
    [queued] = [r for r in encoder_runs if r.data.params["model.n_heads"] == "2"]
    assert queued.data.tags["dvc_experiment"] == "two-heads" and queued.info.run_name == "train_atis [two-heads]"
    assert all("test/slot_f1" in r.data.metrics for r in encoder_runs)
    # TabTransformer, FT-Transformer, MLP, XGBoost, logistic regression and their comparison: one experiment
    tabular = client.search_runs([client.get_experiment_by_name("tabular").experiment_id])
    stages = sorted(r.data.tags.get("dvc_stage") or r.info.run_name for r in tabular)
    assert stages == ["comparison", "train_logreg", "train_tabular@ft_transformer", "train_tabular@tab_mlp",
                      "train_tabular@tab_transformer", "train_xgboost"]
    assert all("eval/test/auroc" in r.data.metrics for r in tabular if r.info.run_name != "comparison")
    # JointBERT sits in the same experiment as the from-scratch encoder, to compare in the UI
    bert_runs = [r for r in runs if r.data.tags.get("dvc_stage") == "finetune_atis"]
    assert len(bert_runs) == 1 and all("test/slot_f1" in r.data.metrics for r in bert_runs)
    # BERT from three starts and GPT, fine-tuned on the same sentiment split, and the comparison of the
    # three starts (logged into each of their runs too): one experiment
    sentiment_runs = client.search_runs([client.get_experiment_by_name("sentiment").experiment_id])
    assert sorted(r.data.tags.get("dvc_stage") or r.info.run_name for r in sentiment_runs) == [
        "comparison", "finetune_gpt_sentiment", "finetune_sentiment", "finetune_sentiment_minilm",
        "finetune_sentiment_scratch"]
    [compared] = [r for r in sentiment_runs if r.info.run_name == "comparison"]
    assert {"scratch/test/acc", "own/test/acc", "minilm/test/acc"} <= set(compared.data.metrics)
    assert {a.path for a in client.list_artifacts(compared.info.run_id)} >= {"comparison.png", "comparison.csv"}
    assert all("eval/test/acc" in r.data.metrics for r in sentiment_runs
               if (r.data.tags.get("dvc_stage") or "").startswith("finetune_sentiment"))
    [pretrain_gpt] = client.search_runs([client.get_experiment_by_name("gpt_pretrain").experiment_id])
    assert "val/perplexity" in pretrain_gpt.data.metrics
    assert {a.path for a in client.list_artifacts(pretrain_gpt.info.run_id, "samples")} == {
        "samples/samples.json", "samples/samples.txt"}
    assert (project / "mlruns").is_dir()  # artifacts beside the store, inside the project
