"""The studies that pre-train before they fine-tune (bert_masking, bert_objective) and word2vec_init:
a job's pre-training overrides and its start from the pre-training checkpoint, the data steps that
are functions (a corpus of a table's sentences or of ATIS utterances, the embedded fallback), the
figure against pre-training seconds, and one tiny pre-train-then-fine-tune study end to end."""

import json

import pandas as pd
import pytest
import torch
from conftest import PYTHON, ROOT, run, sweep_runs
from omegaconf import OmegaConf

from transformer_lab.data.corpus import read_documents
from transformer_lab.errors import DataError, TransformerLabError
from transformer_lab.studies.corpora import atis_utterances, sentence_corpus
from transformer_lab.studies.jobs import pretrain_overrides, prepare_data, start_from, train_overrides, variant_spec

PRETRAINING_STUDIES = ("bert_masking", "bert_objective")


def study_cfg(**study) -> OmegaConf:
    return OmegaConf.create({"seed": 2, "task_name": "study/toy", "study": {
        "name": "toy", "fallback": {"data.source=local": "data.source=sentiment"}, "shared_data": "/nonexistent",
        "variants": {}, **study}})


def test_a_job_pretrains_with_the_studys_then_its_variants_overrides_and_no_run_of_its_own():
    cfg = study_cfg(pretrain=["experiment=bert/pretrain", "data.source=local"], base=["experiment=bert/sentiment"])
    spec = OmegaConf.create({"pretrain": ["task.objective=causal"], "overrides": ["model.pool=mean"]})
    overrides = pretrain_overrides(cfg, spec)
    assert overrides[:4] == ["experiment=bert/pretrain", "data.source=sentiment", "task.objective=causal", "seed=2"]
    assert "logger=none" in overrides and "tracking.log_trained_model=false" in overrides
    assert not any(o.startswith("+callbacks.study_probes") for o in overrides)  # the probes watch the fine-tuning
    assert train_overrides(cfg, spec)[:2] == ["experiment=bert/sentiment", "model.pool=mean"]
    # a variant that opts out, a study without pre-training, a variant that alone pre-trains
    assert pretrain_overrides(cfg, OmegaConf.create({"pretrain": False, "overrides": []})) is None
    assert pretrain_overrides(study_cfg(), OmegaConf.create({"overrides": ["x=1"]})) is None
    assert pretrain_overrides(study_cfg(), spec)[0] == "task.objective=causal"
    # the short form (a list of overrides) and a variant without fine-tuning overrides of its own
    assert list(variant_spec(OmegaConf.create({"name": "t", "variants": {"a": ["x=1"]}}), "a").overrides) == ["x=1"]
    assert train_overrides(cfg, OmegaConf.create({"pretrain": ["task.objective=mlm"]}))[0] == "experiment=bert/sentiment"


def pretraining_checkpoint(path, global_step: int = 7) -> None:
    sizes = {"n_layers": 2, "d_model": 32, "n_heads": 4, "d_ff": 64, "max_len": 40, "vocab_size": 99}
    torch.save({"state_dict": {"model.bert.pooler.weight": torch.zeros(2, 2)}, "global_step": global_step,
                "hyper_parameters": {"model_config": sizes, "preprocessor": {"tokenizer": '{"model": "a tokenizer"}'}}},
               path)


def test_fine_tuning_starts_from_the_pretraining_checkpoints_weights_sizes_and_tokenizer(tmp_path):
    checkpoint = tmp_path / "last.ckpt"
    pretraining_checkpoint(checkpoint)
    overrides = start_from(checkpoint, tmp_path, 7)
    assert overrides == [f"task.pretrained={checkpoint}", f"data.datamodule.tokenizer_path={tmp_path / 'tokenizer.json'}",
                         "model.n_layers=2", "model.d_model=32", "model.n_heads=4", "model.d_ff=64", "model.max_len=40"]
    assert (tmp_path / "tokenizer.json").read_text() == '{"model": "a tokenizer"}'
    with pytest.raises(TransformerLabError, match="saved at step 7, but the pre-training ended at step 9"):
        start_from(checkpoint, tmp_path, 9)  # a last.ckpt older than the run's end: not the pre-trained weights


def write_table(path, rows: list[tuple[str, str]]) -> None:
    path.write_text("sentence\tlabel\n" + "".join(f"{s}\t{label}\n" for s, label in rows), encoding="utf-8")


def test_a_sentence_corpus_is_the_tables_sentences_without_their_labels(tmp_path):
    table = tmp_path / "train.tsv"
    write_table(table, [(f"a fine film number {i} ", str(i % 2)) for i in range(60)] + [("  ", "1")])
    summary = sentence_corpus(str(table), str(tmp_path / "corpus"), max_sentences=50, validation_fraction=0.1)
    documents = read_documents(tmp_path / "corpus", "train") + read_documents(tmp_path / "corpus", "validation")
    assert summary["train"]["documents"] == 45 and summary["validation"]["documents"] == 5
    assert sorted(s for d in documents for s in d) == sorted(f"a fine film number {i}" for i in range(50))
    assert all(len(d) == 1 for d in documents)  # one sentence a document: no next sentence to predict
    with pytest.raises(DataError, match="no column 'text'"):
        sentence_corpus(str(table), str(tmp_path / "other"), column="text")


def test_an_atis_corpus_is_the_training_utterances_words_only(prepared_atis, tmp_path):
    from transformer_lab.data.atis import read_prepared_split

    atis_utterances(str(prepared_atis), str(tmp_path / "corpus"), validation_fraction=0.1)
    documents = read_documents(tmp_path / "corpus", "train") + read_documents(tmp_path / "corpus", "validation")
    utterances = [" ".join(row["words"]) for row in read_prepared_split(prepared_atis, "train")]
    assert sorted(" ".join(d) for d in documents) == sorted(utterances)
    slots = {tag for row in read_prepared_split(prepared_atis, "train") for tag in row["slots"] if tag != "O"}
    assert not any(tag in " ".join(d) for d in documents for tag in slots)


def test_a_data_step_that_is_a_function_runs_once_with_the_fallback_on_its_arguments(tmp_path):
    table = tmp_path / "train.tsv"
    write_table(table, [(f"sentence {i}", "0") for i in range(20)])
    step = {"_target_": "transformer_lab.studies.corpora.sentence_corpus", "source": str(table),
            "output_dir": str(tmp_path / "corpus")}
    study = OmegaConf.create({"name": "toy", "shared_data": str(tmp_path), "fallback": {str(table): "builtin"},
                              "prepare": [step]})
    prepare_data(study, ROOT)
    assert json.loads((tmp_path / "corpus" / "summary.json").read_text())["source"] == "local"
    study.shared_data = str(tmp_path / "absent")  # a clone without the real data: the embedded corpus
    prepare_data(study, ROOT)
    assert json.loads((tmp_path / "corpus" / "summary.json").read_text())["source"] == "builtin"


def test_the_figure_puts_the_score_against_the_pretraining_seconds(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from transformer_lab.studies.figure import scatter_panel

    summary = {"claimed": "mlm", "metric": "val/acc", "variants": {
        "mlm": {"mean": 0.7, "std": 0.01, "metrics": {"pretrain/seconds": 30.0}},
        "causal": {"mean": 0.6, "std": 0.02, "metrics": {"pretrain/seconds": 55.0}},
        "none": {"mean": 0.5, "std": 0.0, "metrics": {}}}}  # no pre-training: no point
    figure, ax = plt.subplots()
    scatter_panel(ax, summary, "pretrain/seconds")
    assert sorted((text.get_text(), text.xy) for text in ax.texts) == [("causal", (55.0, 0.6)), ("mlm", (30.0, 0.7))]
    assert ax.get_xlabel() == "seconds of pre-training"
    plt.close(figure)


@pytest.mark.slow  # every variant's pre-training and fine-tuning configs, composed on both data
@pytest.mark.parametrize("name", [*PRETRAINING_STUDIES, "word2vec_init"])
def test_every_pretraining_and_fine_tuning_config_composes_and_passes_the_checks(name, tmp_path):
    from hydra.core.global_hydra import GlobalHydra

    from transformer_lab.families import check_config
    from transformer_lab.runtime.config import compose_config

    cfg = compose_config("study", [f"study={name}", "variant=x"], tmp_path)
    for variant in cfg.study.variants:
        spec = variant_spec(cfg.study, variant)
        cfg.variant = variant
        for embedded in (False, True):
            runs = [pretrain_overrides(cfg, spec, embedded), train_overrides(cfg, spec, embedded)]
            for overrides in filter(None, runs):
                GlobalHydra.instance().clear()
                composed = compose_config("train", overrides, tmp_path)
                check_config(composed)
                if overrides is runs[0]:
                    assert composed.data.datamodule.next_sentence is False  # single sentences: MLM or causal alone
        if name in PRETRAINING_STUDIES:
            assert (pretrain_overrides(cfg, spec) is None) == (spec.get("pretrain") is False)
        GlobalHydra.instance().clear()


@pytest.mark.slow  # composes every variant's two trainings
def test_a_pretraining_studys_stage_depends_on_its_pretraining_and_data_steps_too():
    from transformer_lab.runtime.stage_deps import relative, what_a_stage_reads

    needed = set(relative(what_a_stage_reads("python3 pipelines/study.py study=bert_objective", "bert_objective")))
    assert {"conf/experiment/bert/pretrain.yaml", "conf/task/bert_pretraining.yaml", "conf/data/bert_pretraining.yaml",
            "src/transformer_lab/tasks/bert_pretraining.py", "src/transformer_lab/studies/corpora.py",
            "conf/experiment/bert/sentiment.yaml", "pipelines/train_tokenizers.py"} <= needed


TINY_PRETRAINING_STUDY = """# @package _global_
study:
  name: tiny_pretraining
  claim: Left-to-right pre-training fine-tunes better than none.
  metric: val/acc
  higher_is_better: true
  claimed: causal
  prepare:
    - {{_target_: transformer_lab.studies.corpora.sentence_corpus, source: {table}, output_dir: {corpus}}}
    - train_tokenizers.py data=corpus data.prepared_dir={corpus} output_dir={tokenizers} tokenizers.wordpiece.vocab_size=300
      ~tokenizers.bpe ~tokenizers.char
  pretrain: [experiment=bert/pretrain, data.prepared_dir={corpus}, data.datamodule.tokenizer_path={tokenizer},
             data.datamodule.next_sentence=false, model.n_layers=1, debug=smoke]
  base: [experiment=bert/sentiment, data.datamodule.tokenizer_path={tokenizer}, model.n_layers=1, test=false, debug=smoke]
  figure: {{scatter: [pretrain/seconds]}}
  variants:
    causal: {{pretrain: [task.objective=causal]}}
    none: {{pretrain: false, overrides: [task.pretrained=null]}}
"""


@pytest.mark.slow
def test_a_pretraining_study_pretrains_each_job_then_fine_tunes_from_it_under_one_mlflow_run(tmp_path):
    conf = tmp_path / "conf" / "study"
    conf.mkdir(parents=True)
    table = tmp_path / "sentences.tsv"
    write_table(table, [(f"the film number {i} was {'good' if i % 2 else 'dull'} and {i % 7} long", "0")
                        for i in range(300)])
    tokenizers = tmp_path / "tokenizers"
    (conf / "tiny_pretraining.yaml").write_text(TINY_PRETRAINING_STUDY.format(
        table=table, corpus=tmp_path / "corpus", tokenizers=tokenizers, tokenizer=tokenizers / "wordpiece" / "tokenizer.json"))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    done = run([PYTHON, "pipelines/study.py", "--config-dir", tmp_path / "conf", "study=tiny_pretraining",
                "variant=causal,none", "seed=0",
                f"out_dir={tmp_path / 'studies' / 'tiny'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
               env={"MLFLOW_TRACKING_URI": uri}, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "studies" / "tiny" / "summary.json").read_text())
    causal, none = summary["variants"]["causal"], summary["variants"]["none"]
    assert causal["metrics"]["pretrain/steps"] == 4 and "pretrain/val/lm_loss" in causal["metrics"]
    assert not any(name.startswith("pretrain/") for name in none["metrics"])
    jobs = {json.loads(p.read_text())["variant"]: p.parent for p in (tmp_path / "sweep").rglob("study_job.json")}
    pretrained = jobs["causal"] / "pretrain" / "checkpoints" / "last.ckpt"
    assert pretrained.is_file() and not (jobs["none"] / "pretrain").exists()
    fine_tuned = OmegaConf.load(jobs["causal"] / ".hydra" / "config.yaml")  # the study job's; the training's below
    assert fine_tuned.variant == "causal"
    hparams = torch.load(jobs["causal"] / "checkpoints" / "last.ckpt", weights_only=True)["hyper_parameters"]
    assert hparams["pretrained"] == str(pretrained)
    assert pd.read_csv(jobs["causal"] / "pretrain" / "history.csv")["step"].max() == 4
    parent, children = sweep_runs(uri, "study/tiny_pretraining")
    assert len(children) == 2  # a run per job: the pre-training records into its job's run
    [child] = [c for c in children if "pretrain/steps" in c.data.metrics]
    assert child.data.metrics["pretrain/steps"] == 4 and "val/acc" in child.data.metrics
