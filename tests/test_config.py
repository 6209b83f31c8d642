"""The Hydra config tree: every option composes and instantiates, sweeps run (bad overrides: test_trust.py)."""

import dataclasses
import os
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from conftest import PYTHON, ROOT, run, sweep_runs
from hydra.utils import instantiate

from transformer_lab.runtime.config import compose_config


@pytest.mark.parametrize("trainer", ["cpu", "gpu", "ddp", "ddp_spawn", "ddp_cpu", "fsdp", "deepspeed_stage_2",
                                     "deepspeed_stage_3"])
def test_every_trainer_config_composes(tmp_path, trainer):
    cfg = compose_config("train", [f"trainer={trainer}"], tmp_path)
    assert cfg.trainer._target_ == "lightning.pytorch.Trainer"


def test_distributed_strategies_instantiate(tmp_path):
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

    from transformer_lab.models.blocks import TransformerBlock

    ddp = instantiate(compose_config("train", ["trainer=ddp_cpu"], tmp_path).trainer.strategy)
    assert isinstance(ddp, DDPStrategy) and ddp._process_group_backend == "gloo"
    fsdp = instantiate(compose_config("train", ["trainer=fsdp"], tmp_path).trainer.strategy)
    assert isinstance(fsdp, FSDPStrategy) and type(fsdp).__module__ == "transformer_lab.training.strategies"
    assert fsdp.kwargs["auto_wrap_policy"]._module_classes == {TransformerBlock}
    spawn = compose_config("train", ["trainer=ddp_spawn"], tmp_path).trainer.strategy
    assert spawn == "ddp_spawn"


def test_fsdp_precision_clips_by_the_norm_of_the_whole_model():
    """Lightning's FSDP plugin refuses `gradient_clip_algorithm='norm'` (the project's default); ours
    clips through the root module, which knows the norm over every rank's shard."""
    import functools

    import torch

    from transformer_lab.training.strategies import NormClippingFSDPPrecision

    model = torch.nn.Linear(4, 4)
    model(torch.randn(8, 4)).pow(2).sum().mul(100).backward()
    # the root FSDP module's method of the same name; a whole model on one process is one shard
    model.clip_grad_norm_ = functools.partial(torch.nn.utils.clip_grad_norm_, model.parameters())
    before = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    NormClippingFSDPPrecision("32-true", module=model).clip_grad_by_norm(None, 1.0)
    after = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    assert before > 1.0 and after == pytest.approx(1.0, rel=1e-4)


def test_deepspeed_configs_instantiate_their_strategies(tmp_path):
    stage3 = compose_config("train", ["trainer=deepspeed_stage_3"], tmp_path).trainer
    assert stage3.strategy._target_ == "lightning.pytorch.strategies.DeepSpeedStrategy"
    assert stage3.strategy.stage == 3 and stage3.precision == "bf16-mixed"
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (`make install GPU=1` builds it)")
    from lightning.pytorch.strategies import DeepSpeedStrategy

    for name, stage in (("deepspeed_stage_2", 2), ("deepspeed_stage_3", 3)):
        strategy = instantiate(compose_config("train", [f"trainer={name}"], tmp_path).trainer.strategy)
        assert isinstance(strategy, DeepSpeedStrategy) and strategy.config["zero_optimization"]["stage"] == stage


def test_experiment_and_debug_configs_change_what_they_should(tmp_path):
    full = compose_config("train", ["experiment=atis/full"], tmp_path)
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
    # `dvc exp run --queue` runs stages in a temporary copy; the store stays in the project (DVC_ROOT)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "project"))
    cfg = compose_config("train", [], tmp_path)
    assert cfg.logger.mlflow.tracking_uri == f"sqlite:///{tmp_path}/project/mlflow.db"
    assert cfg.logger.mlflow.artifact_location == (tmp_path / "project" / "mlruns" / "atis").as_uri()
    assert cfg.paths.data_dir == f"{cfg.paths.root_dir}/data"  # the data are the copy's own


def test_help_lists_groups_and_examples():
    result = run([PYTHON, ROOT / "pipelines" / "train.py", "--help"])
    assert result.returncode == 0
    assert "python pipelines/train.py -m model.n_heads=1,2,4" in result.stdout
    groups = dict(line.split(": ", 1) for line in result.stdout.splitlines()
                  if ": " in line and line.split(":")[0] in ("data", "model", "trainer", "debug", "hparams_search"))
    expected = {"data": {"atis", "corpus", "bert_pretraining"}, "model": {"encoder", "word2vec", "bert"},
                "trainer": {"cpu", "ddp", "ddp_cpu", "ddp_spawn", "deepspeed_stage_2", "deepspeed_stage_3", "default",
                            "fsdp", "gpu"}, "debug": {"smoke"},
                "hparams_search": {"bert_paper"}}
    for group, options in expected.items():
        assert options <= set(groups[group].split(", ")), (group, groups.get(group))


@pytest.mark.slow  # a Hydra multirun of four training jobs
def test_multirun_gives_one_mlflow_run_per_job(tmp_path, prepared_atis):
    uri = f"sqlite:///{tmp_path}/sweep.db"
    result = run([PYTHON, ROOT / "pipelines" / "train.py", "-m", "model.n_heads=1,2", "model.n_layers=1,2",
                  "debug=smoke", f"data.prepared_dir={prepared_atis}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                 env={"MLFLOW_TRACKING_URI": uri})
    assert result.returncode == 0, result.stderr[-3000:]
    parent, runs = sweep_runs(uri, "atis")
    assert len(runs) == 4 and all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in runs)
    assert parent.info.status == "FINISHED" and parent.data.tags["sweeper"] == "BasicSweeper"
    combos = {(r.data.params["model.n_heads"], r.data.params["model.n_layers"]) for r in runs}
    assert combos == {("1", "1"), ("1", "2"), ("2", "1"), ("2", "2")}
    assert all(r.info.status == "FINISHED" and "val/slot_f1" in r.data.metrics for r in runs)
    # named for the UI by what sets them apart, not by the seeded random generator
    assert all(r.info.run_name.startswith(f"atis model.n_heads={r.data.params['model.n_heads']} model.n_layers=")
               for r in runs) and len({r.info.run_name for r in runs}) == 4
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()) == ["0", "1", "2", "3"]
    # the parent says what the sweep found: its best trial, and every trial as a table and a picture
    [best] = [r for r in runs if r.info.run_id == parent.data.params["best_run_id"]]
    assert best.data.metrics["val/slot_f1"] == max(r.data.metrics["val/slot_f1"] for r in runs)
    assert parent.data.params["best_overrides"] == (f"model.n_heads={best.data.params['model.n_heads']} "
                                                    f"model.n_layers={best.data.params['model.n_layers']}")
    assert parent.data.metrics["best/val/slot_f1"] == best.data.metrics["val/slot_f1"]
    client = MlflowClient(uri)
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} == {"trials.csv", "trials.png"}
    table = client.download_artifacts(parent.info.run_id, "trials.csv", str(tmp_path))
    assert len(Path(table).read_text().splitlines()) == 5


@pytest.mark.slow
def test_optuna_search_is_one_parent_run_with_a_child_per_trial(tmp_path, prepared_atis):
    uri = f"sqlite:///{tmp_path}/optuna.db"
    result = run([PYTHON, ROOT / "pipelines" / "train.py", "hparams_search=atis_optuna", "hydra.sweeper.n_trials=2",
                  "debug=smoke", f"data.prepared_dir={prepared_atis}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                 env={"MLFLOW_TRACKING_URI": uri})
    assert result.returncode == 0, result.stderr[-3000:]
    parent, trials = sweep_runs(uri, "atis")
    assert parent.data.tags["sweeper"] == "OptunaSweeper" and len(trials) == 2
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in trials)
    scores = [r.data.metrics["val/slot_f1"] for r in trials]
    best = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(max(scores), abs=1e-6)  # Optuna got what MLflow shows
    assert parent.data.metrics["best/val/slot_f1"] == pytest.approx(best["best_value"], abs=1e-6)


def test_slurm_launcher_config_validates_without_a_cluster(tmp_path):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", ["hydra/launcher=slurm", "trainer=ddp", "trainer.num_nodes=2",
                                "hydra.launcher.partition=gpu"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert launcher.nodes == 2 and launcher.partition == "gpu" and launcher.tasks_per_node == 1
    from hydra.utils import get_class

    assert get_class(launcher._target_).__name__ == "SlurmLauncher"  # the plugin is installed and importable


@pytest.mark.slow
def test_two_optuna_workers_share_one_study_and_one_parent_run(tmp_path, prepared_atis):
    """The known workaround for the Optuna sweeper's blocking n_jobs: two processes on one study
    in a shared database. No trial is run twice, the study's best is the best child run MLflow
    shows, and one parent run holds every trial."""
    import subprocess

    import optuna

    uri, storage = f"sqlite:///{tmp_path}/mlflow.db", f"sqlite:///{tmp_path}/optuna.db"
    sweep = tmp_path / "sweep"
    # created once before the workers, as the README says (`optuna create-study`): no race to create it
    optuna.create_study(study_name="atis_encoder", storage=storage, direction="maximize")
    workers = [subprocess.Popen(
        [PYTHON, ROOT / "pipelines" / "train.py", "hparams_search=atis_optuna", "hydra.sweeper.n_trials=2",
         f"hydra.sweeper.storage={storage}", f"hydra.sweep.dir={sweep}", f"hydra.sweep.subdir=worker{w}_${{hydra.job.num}}",
         "debug=smoke", f"data.prepared_dir={prepared_atis}"],
        cwd=ROOT, env={**os.environ, "MLFLOW_TRACKING_URI": uri}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for w in (1, 2)]
    outputs = [worker.communicate(timeout=900)[0] for worker in workers]
    for worker, output in zip(workers, outputs):
        assert worker.returncode == 0, output[-3000:]

    study = optuna.load_study(study_name="atis_encoder", storage=storage)
    trials = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(t.number for t in trials) == [0, 1, 2, 3]  # four distinct trials, none twice
    parent, children = sweep_runs(uri, "atis")
    assert len(children) == 4 and all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children)
    assert {p.name for p in sweep.iterdir() if p.is_dir()} >= {"worker1_0", "worker1_1", "worker2_0", "worker2_1"}
    best_child = max(children, key=lambda r: r.data.metrics["val/slot_f1"])
    assert study.best_value == pytest.approx(best_child.data.metrics["val/slot_f1"], abs=1e-6)
    assert study.best_params["model.n_heads"] == int(best_child.data.params["model.n_heads"])


def test_parameter_types_read_from_source_are_the_imported_classes():
    """check_types reads the annotations of a config's `_target_` from its source, so that a wrong type
    is refused before torch loads: for every family's model config, task and datamodule, it accepts
    and refuses what the annotations of the imported class would."""
    import typing

    from hydra.utils import get_class

    from transformer_lab.families import FAMILIES
    from transformer_lab.utils.validate import _accepts, parameter_types

    probes = ("abc", 3, 0.5, True, None)
    targets = {t for f in FAMILIES.values() for t in (f.config, f.task, f.datamodule)}
    for target in sorted(targets):
        cls = get_class(target)
        imported = typing.get_type_hints(cls if dataclasses.is_dataclass(cls) else cls.__init__)
        read = parameter_types(target)
        assert read is not None, target
        for name, hint in imported.items():
            expected = [_accepts(hint, probe) for probe in probes]
            if name == "return" or expected == [None] * len(probes):
                continue  # a type check_types leaves alone (a list, a dict, a Literal)
            assert [_accepts(read.get(name), probe) for probe in probes] == expected, (target, name)
