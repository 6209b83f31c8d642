"""Training: seed → data → model → task → callbacks, loggers, trainer → fit → validate (and test) best → record."""

from __future__ import annotations

import os
import time
from pathlib import Path

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from transformer_lab.data import published
from transformer_lab.errors import TransformerLabError
from transformer_lab.families import FamilyDataModule, check_config
from transformer_lab.tasks.checkpoints import read_checkpoint
from transformer_lab.tasks.embeddings import TokenEmbeddings
from transformer_lab.tracking import runs as tracking
from transformer_lab.training import logged_model
from transformer_lab.training.callbacks import CheckpointOnRequeue, RandomState, requeue_checkpoint
from transformer_lab.utils import plots
from transformer_lab.utils.cli import JOB_DIR_ENV
from transformer_lab.utils.instantiate import instantiate_collection
from transformer_lab.utils.io import atomic_write_json


def resolve_checkpoint(ckpt_path: str | None, checkpoint_dir: str) -> str | None:
    if ckpt_path in (None, ""):
        return None
    path = Path(checkpoint_dir, "last.ckpt") if ckpt_path == "last" else Path(ckpt_path)
    if not path.is_file():
        raise TransformerLabError(f"ckpt_path={ckpt_path}: no checkpoint at {path} "
                                  "(resume with the run's directory: hydra.run.dir=DIR ckpt_path=last)")
    return str(path)


def resume_from(ckpt_path: str | None, checkpoint_dir: str) -> str | None:
    """The checkpoint training starts from: the one an earlier attempt of this SLURM (submitit) job
    saved when it was requeued, else `ckpt_path` (resolve_checkpoint), else none. The requeue checkpoint
    comes first because it continues the attempt that started from `ckpt_path`; outside a requeued job
    there is none and `ckpt_path` alone decides."""
    explicit = resolve_checkpoint(ckpt_path, checkpoint_dir)
    requeued = requeue_checkpoint(checkpoint_dir)
    return str(requeued) if requeued and requeued.exists() else explicit


def check_resumable(ckpt_path: str, model_config: dict) -> None:
    """A checkpoint resumes only the architecture it was trained with: one line naming the first difference."""
    saved = read_checkpoint(ckpt_path)["hyper_parameters"].get("model_config") or {}
    changed = [key for key in model_config if key in saved and saved[key] != model_config[key]]
    if changed:
        key = changed[0]
        raise TransformerLabError(f"ckpt_path={ckpt_path}: the checkpoint's model has {key}={saved[key]!r}, this "
                                  f"config {key}={model_config[key]!r}; resume without changing the architecture "
                                  "(hydra.run.dir=RUN_DIR ckpt_path=last reads the run's own settings)")


def reopen_mlflow_run(loggers: list) -> None:
    """A resumed run's MLflow run is RUNNING again until it ends (an interrupted attempt left it
    FINISHED, FAILED or KILLED)."""
    logger = tracking.find_mlflow_logger(loggers)
    if logger is not None:
        logger.experiment.update_run(logger.run_id, status="RUNNING")


def build_model_config(model: DictConfig, sizes: dict):
    """The model's config object: the `model` node plus the sizes that come from the data (vocabulary,
    label counts)."""
    try:
        return instantiate(model, **sizes)
    except InstantiationException as err:
        if isinstance(err.__cause__, (ValueError, TypeError)):  # the config class's own check
            raise TransformerLabError(f"model: {err.__cause__}") from None
        raise


def print_summary(cfg: DictConfig, metrics: dict, output_dir: Path, seconds: float, link: str | None) -> None:
    """The end of a run: its key scores, where its files are and where its MLflow run is."""
    optimized = cfg.get("optimized_metric")
    shown = sorted(metrics, key=lambda k: (k != optimized, not k.startswith("test/"), k))[:8]
    print(f"\n{cfg.task_name}: done in {seconds / 60:.1f} min ({seconds:.0f} s)")
    print("  " + "   ".join(f"{k} {metrics[k]:.4g}" for k in shown))
    print(f"  outputs  {output_dir}")
    if link:
        print(f"  MLflow   {link}")


def debug_choice() -> str | None:
    """The `debug` option the run was composed with (debug=smoke), if any."""
    return HydraConfig.get().runtime.choices.get("debug") if HydraConfig.initialized() else None


def register_as(cfg: DictConfig, family, data_fingerprint: str) -> logged_model.RegisterAs | None:
    """How the run's model is registered (tracking.register), saying why when a debug run's is not."""
    if not cfg.tracking.register:
        if cfg.tracking.log_trained_model and debug_choice():
            print(f"model registry: not registered: a debug run (debug={debug_choice()}); "
                  "tracking.register=true registers it")
        return None
    metric = family.metric(cfg.optimized_metric)
    return logged_model.RegisterAs(cfg.task_name, metric.name, metric.mode, data_fingerprint,
                               force_champion=cfg.tracking.get("champion") == "force")


def train(cfg: DictConfig) -> dict[str, float]:
    started = time.perf_counter()
    family = check_config(cfg)  # parts of one family, its metric, types, ranges: one line, before anything is built
    tracking.check_tracking(cfg)  # a server that is down stops the run before any data is read
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    output_dir = Path(cfg.paths.output_dir)
    os.environ[JOB_DIR_ENV] = str(output_dir)  # for the extra DDP processes of a multirun job (rejoin_ddp_job)
    ckpt_path = resume_from(cfg.get("ckpt_path"), cfg.paths.checkpoint_dir)

    # Published weights bring their tokenizer (the data is encoded with it) and their encoder's sizes.
    start = published.start_for(cfg.task.get("pretrained"), cfg.model.get("_target_"))
    published_tokenizer = {"tokenizer_path": str(start.folder)} if start else {}
    datamodule = instantiate(cfg.data.datamodule, **published_tokenizer)
    if not isinstance(datamodule, FamilyDataModule):
        raise TransformerLabError(f"data.datamodule: {type(datamodule).__name__} lacks model_kwargs()/preprocessor "
                                  "(families.FamilyDataModule)")
    model_config = build_model_config(cfg.model, {**datamodule.model_kwargs(), **(start.config_fields() if start else {})})
    if ckpt_path:
        check_resumable(ckpt_path, model_config.to_dict())
    # The preprocessor's state goes in past Hydra: plain data (a tokenizer's JSON among it) that no
    # config merge or ${...} interpolation should touch.
    build_task = instantiate(cfg.task, model_config=model_config.to_dict(), _convert_="all", _partial_=True)
    task = build_task(preprocessor=datamodule.preprocessor.to_state())
    # task.embeddings: where token embeddings start. A resume continues the checkpoint's weights instead.
    coverage = None
    if isinstance(task, TokenEmbeddings) and not ckpt_path:
        coverage = task.initialise_embeddings(cfg.paths.root_dir)

    if cfg.get("compile") and cfg.compile.enabled:
        # In place: parameter names, checkpoints and the logged model are the same as without it.
        task.model.compile(backend=cfg.compile.backend, mode=cfg.compile.mode)

    previous_run = tracking.read_run_reference(output_dir / tracking.RUN_REFERENCE) if ckpt_path else None
    loggers = tracking.build_loggers(cfg, previous_run and previous_run["run_id"])
    if previous_run:
        reopen_mlflow_run(loggers)
    record = tracking.RunRecord(cfg)
    # RandomState is not optional: without it a resumed run is not the run it continues.
    requeue = CheckpointOnRequeue(requeue_checkpoint(cfg.paths.checkpoint_dir))  # does nothing outside SLURM/submitit
    callbacks = [*instantiate_collection(cfg.get("callbacks")), RandomState(), requeue, record]
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    if rank_zero_only.rank == 0:  # before fit the trainer does not know its rank; Lightning reads the launcher's
        n_params = sum(p.numel() for p in task.model.parameters())
        print(f"{cfg.task_name}: {type(task.model).__name__}, {n_params / 1e6:.2f} M parameters, "
              f"{'resuming ' + ckpt_path if ckpt_path else 'from the start'}")

    try:
        trainer.fit(task, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except SystemExit:
        if requeue.requeued and record.logger:  # Lightning marked it FAILED; the next attempt reopens it
            record.logger.experiment.set_terminated(record.logger.run_id, "KILLED")
        raise

    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    scoring = {"datamodule": datamodule, "ckpt_path": best or None, "verbose": False, "weights_only": True}
    scores = trainer.validate(task, **scoring)[0]
    if cfg.get("test"):  # fine-tuning runs score the best checkpoint on their test split too
        scores.update(trainer.test(task, **scoring)[0])
    metrics = {name: float(value) for name, value in scores.items()}
    if trainer.is_global_zero:
        metrics_path = output_dir / "metrics.json"
        atomic_write_json(metrics_path, {**metrics, "epochs": trainer.current_epoch, "steps": trainer.global_step,
                                         "params": sum(p.numel() for p in task.model.parameters())})
        curves = plots.training_curves(output_dir / "history.csv", output_dir / "training_curves.png")
        if coverage is not None:
            record.log_metrics({"embeddings/word2vec_coverage": coverage})
        settings = {**OmegaConf.to_container(cfg.data.datamodule, resolve=True), **published_tokenizer}
        data_fingerprint = record.record_data(settings)  # None: no MLflow run to record it in
        record.finish([metrics_path, output_dir / "history.csv", curves], checkpoint=best or None)
        if record.logger and best and cfg.tracking.log_trained_model:
            logged_model.log_pipeline_model(record.logger, best, register_as(cfg, family, data_fingerprint)
                                            if data_fingerprint else None)
        if requeue.path is not None:  # the job is done: no later attempt will resume from its requeue state
            requeue.path.unlink(missing_ok=True)
        print_summary(cfg, metrics, output_dir, time.perf_counter() - started, record.link)
    return metrics
