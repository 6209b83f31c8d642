"""The Hydra config tree: every option composes, bad overrides fail before any work, sweeps run."""

import pytest
from hydra.utils import instantiate
from mlflow import MlflowClient

from conftest import PYTHON, ROOT, run
from transformer_lab.utils.config import compose_config


@pytest.mark.parametrize("trainer", ["cpu", "gpu", "ddp", "ddp_cpu", "fsdp", "deepspeed"])
def test_every_trainer_config_composes(tmp_path, trainer):
    cfg = compose_config("train", [f"trainer={trainer}"], tmp_path)
    assert cfg.trainer._target_ == "lightning.pytorch.Trainer"


def test_distributed_strategies_instantiate(tmp_path):
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

    from transformer_lab.models.blocks import TransformerBlock

    ddp = instantiate(compose_config("train", ["trainer=ddp_cpu"], tmp_path).trainer.strategy)
    assert isinstance(ddp, DDPStrategy) and ddp._process_group_backend == "gloo"
    fsdp = instantiate(compose_config("train", ["trainer=fsdp"], tmp_path).trainer.strategy)
    assert isinstance(fsdp, FSDPStrategy)
    assert fsdp.kwargs["auto_wrap_policy"]._module_classes == {TransformerBlock}


def test_experiment_and_debug_configs_change_what_they_should(tmp_path):
    full = compose_config("train", ["experiment=atis"], tmp_path)
    assert full.data.source == "local" and full.trainer.max_epochs == 55 and full.data.datamodule.batch_size == 32
    smoke = compose_config("train", ["debug=smoke", "model.n_heads=2"], tmp_path)
    assert smoke.trainer.max_epochs == 1 and smoke.model.n_heads == 2 and smoke.callbacks.rich_progress_bar is None


def test_tracking_uri_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    cfg = compose_config("train", [], tmp_path)
    assert cfg.logger.mlflow.tracking_uri == "http://127.0.0.1:5999"
    assert cfg.logger.mlflow.artifact_location is None  # the server decides
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    cfg = compose_config("train", [], tmp_path)
    assert cfg.logger.mlflow.tracking_uri == f"sqlite:///{cfg.paths.root_dir}/mlflow.db"
    assert cfg.logger.mlflow.artifact_location.endswith("/mlruns/atis")  # one folder per experiment


@pytest.mark.parametrize("override, message", [
    ("model.n_headz=2", "Could not override 'model.n_headz'"),
    ("trainer=tpu_pod", "Could not find 'trainer/tpu_pod'"),
])
def test_bad_override_fails_fast_with_hydras_message(tmp_path, override, message):
    result = run([PYTHON, ROOT / "pipelines" / "train.py", override, f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 1
    assert message in result.stderr
    assert not (tmp_path / "checkpoints").exists()


def test_help_lists_groups_and_examples():
    result = run([PYTHON, ROOT / "pipelines" / "train.py", "--help"])
    assert result.returncode == 0
    assert "python pipelines/train.py -m model.n_heads=1,2,4" in result.stdout
    groups = dict(line.split(": ", 1) for line in result.stdout.splitlines()
                  if ": " in line and line.split(":")[0] in ("data", "model", "trainer", "debug", "hparams_search"))
    expected = {"data": {"atis", "corpus", "bert_pretraining"}, "model": {"encoder", "word2vec", "bert"},
                "trainer": {"cpu", "ddp", "ddp_cpu", "deepspeed", "default", "fsdp", "gpu"}, "debug": {"smoke"},
                "hparams_search": {"bert_paper"}}
    for group, options in expected.items():
        assert options <= set(groups[group].split(", ")), (group, groups.get(group))


def test_multirun_gives_one_mlflow_run_per_job(tmp_path, prepared_atis):
    uri = f"sqlite:///{tmp_path}/sweep.db"
    result = run([PYTHON, ROOT / "pipelines" / "train.py", "-m", "model.n_heads=1,2", "model.n_layers=1,2",
                  "debug=smoke", f"data.prepared_dir={prepared_atis}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                 env={"MLFLOW_TRACKING_URI": uri})
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("atis").experiment_id])
    assert len(runs) == 4
    combos = {(r.data.params["model.n_heads"], r.data.params["model.n_layers"]) for r in runs}
    assert combos == {("1", "1"), ("1", "2"), ("2", "1"), ("2", "2")}
    assert all(r.info.status == "FINISHED" and "val/slot_f1" in r.data.metrics for r in runs)
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()) == ["0", "1", "2", "3"]


@pytest.mark.slow
def test_ddp_cpu_trains_with_two_processes_and_one_mlflow_run(tmp_path, prepared_atis):
    uri = f"sqlite:///{tmp_path}/ddp.db"
    result = run([PYTHON, ROOT / "pipelines" / "train.py", "trainer=ddp_cpu", "debug=smoke",
                  f"data.prepared_dir={prepared_atis}", f"hydra.run.dir={tmp_path / 'run'}"],
                 env={"MLFLOW_TRACKING_URI": uri})
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "run" / "train_ddp_process_1.log").is_file()  # the second process really ran
    client = MlflowClient(uri)
    [mlflow_run] = client.search_runs([client.get_experiment_by_name("atis").experiment_id])
    assert mlflow_run.info.status == "FINISHED" and "val/slot_f1" in mlflow_run.data.metrics
