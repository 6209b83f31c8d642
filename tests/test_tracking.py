"""What a run shows in MLflow's run table and compare view: the settings that set it apart (no class
paths, no absolute paths), the data it read (DVC's hash as the dataset digest), the same learning-rate
and system metrics in every family, experiments that open on their runs, sweeps that summarise."""

import csv
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import ROOT
from lightning.pytorch.loggers import CSVLogger
from mlflow import MlflowClient
from omegaconf import OmegaConf

from transformer_lab.errors import TransformerLabError
from transformer_lab.runtime.config import compose_config
from transformer_lab.tasks.schedules import adamw_with_warmup, scheduled
from transformer_lab.tracking import runs as tracking
from transformer_lab.tracking.sweeps import best_trial, parsed_overrides, summarise_sweep, trial_rows
from transformer_lab.training.lr_monitor import LearningRateMonitor
from transformer_lab.training.train import train
from transformer_lab.utils.dvc_outputs import dvc_md5

CLASS_PATH = re.compile(r"^([A-Za-z_]\w*\.)+[A-Z]\w*$")


def assert_comparable(params: dict[str, str]) -> None:
    for key, value in params.items():
        assert "_target_" not in key and not CLASS_PATH.match(value), (key, value)
        assert not os.path.isabs(value) and "://" not in value, (key, value)


def test_params_are_the_settings_a_person_compares(tmp_path):
    cfg = compose_config("train", ["experiment=bert/sentiment", "task.lr=3e-4"], tmp_path)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    params = tracking.comparable_params(resolved, tracking.config_choices(), cfg.paths.root_dir)
    assert_comparable(params)
    assert params["config.experiment"] == "bert/sentiment" and params["task.lr"] == "0.0003"
    # the setting that sets the sentiment starts apart, as a path in the project, not this clone's
    assert params["task.pretrained"] == "artifacts/bert/pretrain/checkpoints/best.ckpt"
    assert params["model.size"] == "tiny" and params["data.datamodule.batch_size"] == "16"
    assert not any(key.startswith(("callbacks.", "logger.", "paths.", "hydra.", "tracking.")) for key in params)
    assert "data.source" not in params and params["data.datamodule.source"] == "sentiment"  # said once
    # a path outside the project says where a clone is, not what ran: left to config.yaml
    assert tracking.shown_value("/elsewhere/data", cfg.paths.root_dir) is None
    assert tracking.shown_value(f"{cfg.paths.root_dir}/data/x", cfg.paths.root_dir) == "data/x"


def test_dvc_md5_is_the_hash_dvc_records(tmp_path):
    """The dataset digest is what `dvc add` (real DVC) writes for the same folder, and it moves
    when one file changes."""
    data = tmp_path / "prepared"
    (data / "sub").mkdir(parents=True)
    (data / "train.jsonl").write_text('{"text": "a"}\n')
    (data / "sub" / "labels.txt").write_text("x\ny\n")
    dvc = shutil.which("dvc", path=str(Path(ROOT, ".venv", "bin"))) or shutil.which("dvc")
    subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    subprocess.run([dvc, "add", "-q", "prepared"], cwd=tmp_path, check=True)
    recorded = OmegaConf.load(tmp_path / "prepared.dvc").outs[0].md5
    assert dvc_md5(data) == recorded and recorded.endswith(".dir")
    before = recorded
    (data / "train.jsonl").write_text('{"text": "b"}\n')
    assert dvc_md5(data) != before


def test_two_data_versions_are_two_datasets(tmp_path):
    data = tmp_path / "prepared"
    data.mkdir()
    (data / "train.csv").write_text("a,b\n1,2\n")
    first = tracking.data_inputs({"prepared_dir": str(data), "batch_size": 8}, {"train": 1}, "toy", "f" * 16, tmp_path)
    (data / "train.csv").write_text("a,b\n1,3\n")
    second = tracking.data_inputs({"prepared_dir": str(data), "batch_size": 8}, {"train": 1}, "toy", "f" * 16, tmp_path)
    [one], [two] = first, second
    assert one.dataset.name == two.dataset.name == "toy" and one.dataset.digest != two.dataset.digest
    assert json.loads(one.dataset.source)["uri"] == "prepared" and json.loads(one.dataset.profile) == {"examples": {"train": 1}}
    # data that no setting names as a file (built in): named by the run's data fingerprint
    [builtin] = tracking.data_inputs({"source": "sentiment", "batch_size": 8}, {"train": 5}, "sentiment", "ab" * 8, tmp_path)
    assert builtin.dataset.digest == "ab" * 8 and json.loads(builtin.dataset.source) == {"source": "sentiment"}


def test_experiments_are_model_training_experiments(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    made = tracking.experiment_id(client, "fresh", str(tmp_path))
    assert client.get_experiment(made).tags[tracking.EXPERIMENT_KIND] == tracking.MODEL_TRAINING
    older = client.create_experiment("older")  # made before experiments had a kind
    assert tracking.experiment_id(client, "older", str(tmp_path)) == older
    assert client.get_experiment(older).tags[tracking.EXPERIMENT_KIND] == "custom_model_development"


def test_system_metrics_setting(tmp_path):
    assert compose_config("train", ["debug=smoke"], tmp_path).tracking.system_metrics_s is None  # off in smoke runs
    assert compose_config("train", [], tmp_path).tracking.system_metrics_s == 5
    for bad in ("0", "-1", "fast", "true"):
        with pytest.raises(TransformerLabError, match="tracking.system_metrics_s"):
            tracking.check_tracking(compose_config("train", [f"tracking.system_metrics_s={bad}", "logger=none"], tmp_path))


class TwoGroups(L.LightningModule):
    def __init__(self, rates: tuple[float, float] | None = None):
        super().__init__()
        self.layer, self.rates = torch.nn.Linear(4, 1), rates

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=4)

    def configure_optimizers(self):
        if not self.rates:  # what the families use: decayed matrices and undecayed biases at one rate
            return adamw_with_warmup(self.layer, 1e-2, 0.01, total_steps=4, warmup_steps=2)
        optimizer = torch.optim.AdamW([{"params": [self.layer.weight], "lr": self.rates[0]},
                                       {"params": [self.layer.bias], "lr": self.rates[1]}])
        return {"optimizer": optimizer, "lr_scheduler": scheduled(torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0))}


def logged_rates(tmp_path, rates=None) -> list[str]:
    logger = CSVLogger(tmp_path)
    trainer = L.Trainer(max_steps=4, logger=logger, callbacks=[LearningRateMonitor(logging_interval="step")],
                        enable_checkpointing=False, enable_progress_bar=False, log_every_n_steps=1)
    trainer.fit(TwoGroups(rates))
    with open(Path(logger.log_dir, "metrics.csv")) as stream:
        return [column for column in next(csv.reader(stream)) if "lr" in column]


def test_learning_rate_is_one_train_lr_curve(tmp_path):
    """Weights and gains share one rate: one `train/lr`, not Lightning's curve per group; groups at
    different rates keep a curve each; without a logger the monitor stays out of the way."""
    assert logged_rates(tmp_path / "shared") == ["train/lr"]
    assert logged_rates(tmp_path / "different", rates=(1e-2, 1e-3)) == ["train/lr/pg1", "train/lr/pg2"]
    L.Trainer(max_steps=2, logger=False, callbacks=[LearningRateMonitor()], enable_checkpointing=False,
              enable_progress_bar=False).fit(TwoGroups())


def test_sweep_summary_names_the_best_trial(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = tracking.experiment_id(client, "atis", str(tmp_path))
    parent = client.create_run(experiment, run_name="sweep x").info.run_id
    scores = {"1e-4": 0.61, "3e-4": 0.74, "1e-3": 0.70}
    for rate, score in scores.items():
        child = client.create_run(experiment, run_name=f"atis task.lr={rate}", tags={
            "mlflow.parentRunId": parent, "hydra_overrides": f"debug=smoke task.lr={rate} data.name='a b'"}).info.run_id
        client.log_metric(child, "val/slot_f1", score)
        client.set_terminated(child)
    failed = client.create_run(experiment, tags={"mlflow.parentRunId": parent,
                                                 "hydra_overrides": "debug=smoke task.lr=1e-2 data.name='a b'"})
    client.set_terminated(failed.info.run_id, "FAILED")
    reference = {"run_id": parent, "experiment_id": experiment, "metric": "val/slot_f1", "mode": "max"}
    best = summarise_sweep(client, reference)
    stored = client.get_run(parent).data
    assert best["task.lr"] == "3e-4" and stored.params["best_overrides"] == "task.lr=3e-4"
    assert stored.params["best_run_id"] == best["run_id"] and stored.metrics["best/val/slot_f1"] == 0.74
    table = client.download_artifacts(parent, "trials.csv", str(tmp_path))
    rows = list(csv.DictReader(Path(table).read_text().splitlines()))
    assert [row["task.lr"] for row in rows] == ["1e-4", "3e-4", "1e-3", "1e-2"]  # swept: the only setting that varies
    assert set(rows[0]) == {"run", "run_id", "status", "task.lr", "val/slot_f1"} and rows[3]["status"] == "FAILED"
    assert Path(client.download_artifacts(parent, "trials.png", str(tmp_path))).stat().st_size > 5000
    # a minimised metric picks the lowest; no mode, no best
    rows, _ = trial_rows(client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent}'"), "val/slot_f1")
    assert best_trial(rows, "val/slot_f1", "min")["task.lr"] == "1e-4" and best_trial(rows, "val/slot_f1", None) is None
    assert parsed_overrides("a=1 +b='x y' broken") == {"a": "1", "b": "x y"}
    # trials that all failed: the table, no picture, no best
    lone = client.create_run(experiment, run_name="sweep y").info.run_id
    client.set_terminated(client.create_run(experiment, tags={"mlflow.parentRunId": lone,
                                                              "hydra_overrides": "task.lr=1"}).info.run_id, "FAILED")
    assert summarise_sweep(client, {**reference, "run_id": lone}) is None
    assert [a.path for a in client.list_artifacts(lone)] == ["trials.csv"]


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory, prepared_atis):
    """One smoke training run with its system metrics on, sampled fast enough for seconds of training."""
    tmp = tmp_path_factory.mktemp("tracked")
    uri = f"sqlite:///{tmp}/mlflow.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        train(compose_config("train", ["debug=smoke", f"data.prepared_dir={prepared_atis}", "model.n_heads=2",
                                       "trainer.max_epochs=3", "tracking.system_metrics_s=0.2"], tmp / "run"))
    client = MlflowClient(uri)
    run_id = json.loads((tmp / "run" / "mlflow_run.json").read_text())["run_id"]
    return client, client.get_run(run_id), prepared_atis


def test_a_tracked_run_shows_its_settings_data_and_use(tracked_run):
    client, run, prepared = tracked_run
    params = run.data.params
    assert_comparable(params)
    assert params["model.n_heads"] == "2" and params["config.debug"] == "smoke"  # the overrides, as params
    assert params["data.examples.train"] == "64" and params["seed"] == "0"
    assert len(params) < 70  # was 110 with every class path and output path
    assert run.data.tags["hydra_overrides"].startswith("debug=smoke data.prepared_dir=")  # the command line, as typed
    assert client.get_experiment(run.info.experiment_id).tags[tracking.EXPERIMENT_KIND] == tracking.MODEL_TRAINING
    [data] = run.inputs.dataset_inputs
    assert data.dataset.name == "atis" and data.dataset.digest == dvc_md5(prepared).removesuffix(".dir")
    assert {tag.key: tag.value for tag in data.tags} == {"mlflow.data.context": "training"}
    steps = json.loads(Path(run.info.artifact_uri.removeprefix("file://"), "metrics.json").read_text())["steps"]
    rates = client.get_metric_history(run.info.run_id, "train/lr")
    assert len(rates) == steps and rates[-1].value < rates[0].value  # the cosine decay, one point per step
    assert "system/cpu_utilization_percentage" in run.data.metrics
    assert "system/system_memory_usage_megabytes" in run.data.metrics
    assert "config.yaml" in {artifact.path for artifact in client.list_artifacts(run.info.run_id)}
