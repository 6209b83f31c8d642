"""Every experiment in conf/experiment/ composes, builds its family's parts and smoke-trains through
`train()`, on tiny copies of the data its stages prepare: a new experiment is covered the day it is added."""

import math
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from omegaconf import open_dict
from test_conll import write_toy_conll
from test_elmo import save_tiny_bilm

from transformer_lab.data.prepare import prepare
from transformer_lab.data.tokenizers import prepare_tokenizers
from transformer_lab.families import family_of_task
from transformer_lab.training.train import train
from transformer_lab.runtime.config import compose_config

EXPERIMENTS = sorted(p.relative_to(ROOT / "conf" / "experiment").with_suffix("").as_posix()
                     for p in (ROOT / "conf" / "experiment").rglob("*.yaml"))  # family/name: bert/sentiment


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    """`paths.data_dir` as the prepare stages fill it, with the data and vocabularies cut small."""
    root = tmp_path_factory.mktemp("experiments")
    data_dir = root / "data"
    for data, extra in (("atis", ["data.builtin.n_train=200", "data.builtin.n_dev=40", "data.builtin.n_test=40"]),
                        ("corpus", []), ("images", []), ("tabular", []), ("multimodal", []),
                        ("translation", ["data.builtin.n_train=200", "data.builtin.n_val=40", "data.builtin.n_test=40",
                                         "data.vocab_size=300"])):
        prepare(compose_config("prepare", [f"data={data}", f"paths.data_dir={data_dir}", *extra], root / data))
    (data_dir / "prepared" / "atis-local").symlink_to(data_dir / "prepared" / "atis")  # experiment=atis/full reads it
    cfg = compose_config("train_tokenizers", [f"paths.data_dir={data_dir}", "tokenizers.wordpiece.vocab_size=1000",
                                              "tokenizers.bpe.vocab_size=500", "~tokenizers.char"], root / "tok")
    prepare_tokenizers(cfg.data.prepared_dir, cfg.output_dir, dict(cfg.tokenizers))
    # the WikiText-2 experiments read their own prepared corpus and tokenizers: the tiny corpus stands in
    (data_dir / "prepared" / "wikitext2").symlink_to(data_dir / "prepared" / "corpus")
    (data_dir / "tokenizers" / "wikitext2").symlink_to(data_dir / "tokenizers" / "corpus")
    (data_dir / "tokenizers" / "wikitext2_bpe8k").symlink_to(data_dir / "tokenizers" / "corpus")
    (data_dir / "prepared" / "fashion").symlink_to(data_dir / "prepared" / "multimodal")  # multimodal/fashion
    (data_dir / "prepared" / "multi30k").symlink_to(data_dir / "prepared" / "translation")  # translation/multi30k
    write_toy_conll(data_dir / "conll2003")  # experiment=bert/ner reads data.data_dir (paths.data_dir/conll2003)
    # a tiny biLM for the experiments that read ELMo features (task.elmo), as `pretrain_elmo` saves one
    save_tiny_bilm(data_dir / "elmo.ckpt", ["<S>", "</S>", "<UNK>", "flights", "to", "boston"])
    return data_dir


# the full-size WikiText-2 and Multi30k experiments take 30 s to 100 s each here: the full suite's
FULL_SIZE = {"bert/pretrain_wikitext2", "bert/pretrain_wikitext2_gpu", "gpt/pretrain_wikitext2", "translation/multi30k"}


def test_experiments_are_grouped_by_family():
    """conf/experiment/<family>/<name>.yaml, one level: experiment=bert/sentiment, never a loose file."""
    assert len(EXPERIMENTS) >= 32 and all(e.count("/") == 1 for e in EXPERIMENTS), EXPERIMENTS
    assert FULL_SIZE <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", [pytest.param(e, marks=pytest.mark.slow) if e in FULL_SIZE else e
                                        for e in EXPERIMENTS])
def test_every_experiment_smoke_trains(experiment, tiny_data_dir, tmp_path):
    cfg = compose_config("train", [f"experiment={experiment}", "debug=smoke", "logger=none",
                                   f"paths.data_dir={tiny_data_dir}"], tmp_path / "run")
    if "pretrained" in cfg.task:  # a smoke run starts from random weights, not the pre-training stage's output
        with open_dict(cfg):
            cfg.task.pretrained = None
    if cfg.task.get("elmo"):
        with open_dict(cfg):
            cfg.task.elmo = str(tiny_data_dir / "elmo.ckpt")
    if cfg.trainer.accelerator == "gpu" and not torch.cuda.is_available():  # a GPU-sized experiment, here on the CPU
        with open_dict(cfg):
            cfg.trainer.accelerator, cfg.trainer.precision = "cpu", "32-true"
    family = family_of_task(cfg.task._target_)
    assert cfg.callbacks.model_checkpoint.mode == family.metric(cfg.optimized_metric).mode

    metrics = train(cfg)

    assert math.isfinite(metrics[cfg.optimized_metric])
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "best.ckpt", weights_only=True)
    assert checkpoint["hyper_parameters"]["model_config"]  # the model's config travels with its weights
