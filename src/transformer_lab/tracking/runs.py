"""MLflow bookkeeping around a Lightning run: context tags, the resolved config, artifacts,
and a small run reference file that later DVC stages use to log into the same run."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger, MLFlowLogger
from lightning.pytorch.trainer.states import TrainerFn
from omegaconf import DictConfig, OmegaConf

from transformer_lab.errors import TransformerLabError
from transformer_lab.tracking.registry import DATA_FINGERPRINT
from transformer_lab.tracking.sweeps import sweep_parent_run_id
from transformer_lab.utils.dvc_outputs import declared_outputs, dvc_md5
from transformer_lab.utils.io import atomic_write_json
from transformer_lab.utils.resolvers import default_artifact_location

RUN_REFERENCE = "mlflow_run.json"
# MLflow's experiment kind: a model-training experiment, whose page is its run table rather than
# the GenAI overview (traces, token usage). MLflow 3.17's UI decides that by its own switch
# (GenAI | Model training, kept in the browser, GenAI at first) and not by the kind; the pages
# this project links to name the switch's setting (MODEL_TRAINING_PAGES).
EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"
MODEL_TRAINING_PAGES = "workflowType=machine_learning"


def experiment_id(client, name: str, tracking_dir: str) -> str:
    """The id of MLflow experiment `name`, a model-training experiment, created (artifacts where
    the loggers put them) if absent; one made before it had a kind gets it. Two jobs starting at
    once on one server both find it absent; the one that loses the race to create it reads the winner's."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment:
        if experiment.tags.get(EXPERIMENT_KIND) is None:
            client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)
        return experiment.experiment_id
    try:
        return client.create_experiment(name, artifact_location=default_artifact_location(tracking_dir, name),
                                        tags={EXPERIMENT_KIND: MODEL_TRAINING})
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS" or not (experiment := client.get_experiment_by_name(name)):
            raise
        return experiment.experiment_id


def check_tracking_server(tracking_uri: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, before any data is read, when an MLflow server named by `tracking_uri` does
    not answer (MLflow's own client would retry for minutes). Local stores need no check."""
    if not tracking_uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{tracking_uri.rstrip('/')}/health", timeout=timeout_s) as response:
            if response.status == 200:
                return
            reason = f"HTTP {response.status}"
    except urllib.error.HTTPError as err:
        reason = f"HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        reason = str(getattr(err, "reason", err))
    raise TransformerLabError(
        f"MLflow tracking server {tracking_uri} does not answer ({reason}): start it (`mlflow server --host "
        "127.0.0.1 --port 5000 ...`), point MLFLOW_TRACKING_URI at one that runs, unset it for the local store, "
        "or pass logger=none")


IGNORED_IN_RUN_NAMES = ("hydra.", "paths.", "data.prepared_dir", "ckpt_path", "train_dir", "checkpoint")


def run_name(task_name: str, overrides: list[str]) -> str:
    """A name that tells runs apart in the MLflow UI: the DVC stage (and `dvc exp` experiment) that
    runs it, else the task and the overrides that made it, else the task and the time."""
    stage, experiment = os.environ.get("DVC_STAGE"), os.environ.get("DVC_EXP_NAME")
    if stage:
        return f"{stage} [{experiment}]" if experiment else stage
    chosen = [o for o in overrides if not o.lstrip("+~").startswith(IGNORED_IN_RUN_NAMES)]
    name = " ".join([task_name, *chosen]) if chosen else f"{task_name} {time.strftime('%Y-%m-%d %H:%M:%S')}"
    return name[:250]


def hydra_overrides() -> list[str]:
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def config_choices() -> dict[str, str]:
    """The config files the run was composed of, by group (experiment=bert/sentiment, model=bert, ...);
    Hydra's own groups left out."""
    if not HydraConfig.initialized():
        return {}
    choices = HydraConfig.get().runtime.choices
    return {group: str(option) for group, option in choices.items() if option is not None and not group.startswith("hydra")}


def sweep_parent() -> str | None:
    """In a multirun, the MLflow run of the whole sweep (see hydra_callbacks.SweepRecord)."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return sweep_parent_run_id(HydraConfig.get().sweep.dir)


CHAMPION_SETTINGS = ("auto", "force")  # tracking.champion: by the score on the same data, or this run whatever it scored


def check_tracking(cfg: DictConfig) -> None:
    """An MLflow server that is down, or a tracking setting that means nothing, stops a command before
    it reads any data."""
    champion = (cfg.get("tracking") or {}).get("champion", "auto")
    if champion not in CHAMPION_SETTINGS:
        raise TransformerLabError(f"tracking.champion={champion!r} is not one of {', '.join(CHAMPION_SETTINGS)}")
    interval = (cfg.get("tracking") or {}).get("system_metrics_s")
    if interval is not None and (isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0):
        raise TransformerLabError(f"tracking.system_metrics_s={interval!r}: seconds between samples, > 0 (null: off)")
    if cfg.get("logger"):
        check_tracking_server(cfg.paths.mlflow_tracking_uri)


def build_loggers(cfg: DictConfig, resume_run_id: str | None = None) -> list[Logger]:
    """The run's loggers (`logger` group). The MLflow one gets a run name that tells runs apart
    (unless the config names one), and a resumed run continues its own MLflow run."""
    loggers = []
    for name, entry in (cfg.get("logger") or {}).items():
        if not (isinstance(entry, DictConfig) and "_target_" in entry):
            continue  # a logger switched off by an override (logger.mlflow=null)
        extra = {}
        if name == "mlflow":
            from lightning.pytorch.utilities import rank_zero_only
            from mlflow import MlflowClient

            if rank_zero_only.rank != 0:
                # Only rank 0 logs. The other ranks of a torchrun/SLURM launch start at the same moment,
                # and even constructing a client would race rank 0 to create a fresh store's tables.
                continue
            # created here, race-safe: the logger's own create fails when another job creates it first
            experiment_id(MlflowClient(entry.tracking_uri), entry.experiment_name, cfg.paths.tracking_dir)
            extra["run_name"] = entry.get("run_name") or run_name(cfg.task_name, hydra_overrides())
            if resume_run_id:
                extra["run_id"] = resume_run_id
        loggers.append(instantiate(entry, **extra))
    return loggers


def without_password(uri: str) -> str:
    """A store's URI as it may be printed: a password in it (postgresql://user:secret@host) masked."""
    parts = urllib.parse.urlsplit(uri)
    if not parts.password:
        return uri
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))


def sqlite_file(uri: str) -> Path | None:
    return Path(uri.removeprefix("sqlite:///")).resolve() if uri.startswith("sqlite:///") else None


# stores `mlflow ui --backend-store-uri` opens; any other (databricks, ...) has its own UI
UI_OPENS = ("sqlite", "postgresql", "mysql", "mssql", "file", "")


def run_link(tracking_uri: str, experiment_id: str, run_id: str, project_store: str | Path) -> str:
    """Where a person finds the run: its page on the server it went to; in the project's own store
    (project_store, the SQLite file `make ui` serves), that page after `make ui`; in another store,
    the store and the command that shows it."""
    page = f"#/experiments/{experiment_id}/runs/{run_id}?{MODEL_TRAINING_PAGES}"
    shown = without_password(tracking_uri)
    if tracking_uri.startswith(("http://", "https://")):
        return f"{shown.rstrip('/')}/{page}"
    if sqlite_file(tracking_uri) == Path(project_store).resolve():
        return f"http://127.0.0.1:5000/{page} after `make ui` (store {shown})"
    if urllib.parse.urlsplit(tracking_uri).scheme.split("+")[0] in UI_OPENS:
        return f"run {run_id} in {shown}: `mlflow ui --backend-store-uri {shown}`, then http://127.0.0.1:5000/{page}"
    return f"run {run_id} of experiment {experiment_id} in {shown}"


# Datamodule settings that change how batches are drawn or how training inputs are perturbed, not
# which examples a run trains and is scored on: runs that differ only in them are scored on the same data.
NOT_DATA_SETTINGS = frozenset({"batch_size", "eval_batch_size", "num_workers", "shuffle", "word_dropout",
                               "crop_padding", "horizontal_flip"})


def content_hash(path: Path) -> str:
    """SHA-256 of a file, or of a folder's files: their names (relative to it) and contents."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(f"{file.relative_to(path) if path.is_dir() else ''}\0".encode())
        with open(file, "rb") as stream:
            digest.update(hashlib.file_digest(stream, "sha256").digest())
    return digest.hexdigest()


def _leaves(value, key: str = ""):
    if isinstance(value, dict):
        for name, item in value.items():
            yield from _leaves(item, f"{key}.{name}" if key else str(name))
    elif isinstance(value, (list, tuple)):
        for number, item in enumerate(value):
            yield from _leaves(item, f"{key}.{number}")
    else:
        yield key, value


def names_a_file(value) -> bool:
    """A setting that names a file or folder the run reads (a path, and one that exists)."""
    return isinstance(value, str) and os.sep in value and Path(value).exists()


def data_record(settings: dict, split_sizes: dict[str, int | str]) -> dict[str, str]:
    """Tags saying which data a run was trained and scored on: `data_fingerprint`, a hash of the
    datamodule's settings (but NOT_DATA_SETTINGS) and of the examples per split, in which a file or
    folder a setting names counts by its content, not its place (the same prepared data in another
    clone, or in `dvc exp run --queue`'s temporary copy, is the same data); `data_split_sizes`; and
    `data_files`, the files read with the start of their hash. A model becomes champion by its score
    only over a champion of the same fingerprint (serving.register)."""
    identity, files = {}, []
    for key, value in _leaves(settings):
        if key.rsplit(".", 1)[-1] in NOT_DATA_SETTINGS:
            continue
        if names_a_file(value):
            digest = content_hash(Path(value))
            files.append(f"{key}={value} (sha256 {digest[:12]})")
            value = digest
        identity[key] = value
    identity["split_sizes"] = split_sizes
    fingerprint = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {DATA_FINGERPRINT: fingerprint,
            "data_split_sizes": " ".join(f"{split}={size}" for split, size in split_sizes.items()),
            "data_files": "; ".join(files) or "(none: no setting names a file)"}


# settings that name a file the run reads that is not its examples
NOT_DATA_INPUTS = frozenset({"tokenizer_path"})


def data_inputs(settings: dict, split_sizes: dict[str, int | str], data_name: str, fingerprint: str,
                root_dir: str | Path) -> list:
    """The data a run read, as MLflow datasets (the run table's Dataset column): one for each file or
    folder a datamodule setting names, its digest the hash dvc.lock records for it (so runs on two
    versions of the prepared data differ in the table), its source the path and the DVC stage that
    writes it; data that no setting names as a file (built in, from the hub) is named by the run's
    data fingerprint. Each profile is the examples per split."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    writers = {path: stage for stage, path in declared_outputs(Path(root_dir))}
    profile = json.dumps({"examples": split_sizes})
    files = [(key, value) for key, value in _leaves(settings)
             if key.rsplit(".", 1)[-1] not in NOT_DATA_INPUTS and names_a_file(value)]
    datasets = []
    for key, value in files:
        shown = shown_value(value, root_dir) or Path(value).name
        source = {"uri": shown, "setting": f"data.datamodule.{key}", "dvc_stage": writers.get(shown)}
        name = data_name if len(files) == 1 else f"{data_name} ({key})"
        datasets.append(Dataset(name, dvc_md5(value).removesuffix(".dir"), "local", json.dumps(source), profile=profile))
    if not datasets:
        settings_shown = {key: value for key, value in _leaves(settings) if shown_value(value, root_dir) is not None
                          and key.rsplit(".", 1)[-1] not in NOT_DATA_SETTINGS | NOT_DATA_INPUTS}
        datasets.append(Dataset(data_name, fingerprint, "code", json.dumps(settings_shown, default=str), profile=profile))
    return [DatasetInput(dataset, [InputTag("mlflow.data.context", "training")]) for dataset in datasets]


def examples_in(loaders, batches: list[int | float], world_size: int) -> int | str | None:
    """How many examples a split's loader(s) give in `batches` batches per process (None: a stream of
    unknown length)."""
    loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
    counts = [scored_examples(loader, scored, world_size) for loader, scored in zip(loaders, batches)]
    if not counts or None in counts:
        return None
    return counts[0] if len(counts) == 1 else "+".join(map(str, counts))


def scored_examples(loader, batches: int | float, world_size: int) -> int | str | None:
    """How many of a loader's examples `batches` batches per process cover (None: a stream of unknown length)."""
    try:
        total, available = len(loader.dataset), len(loader)
    except TypeError:
        return None
    if batches >= available:
        return total
    if loader.batch_size:
        return min(total, int(batches) * loader.batch_size * world_size)
    return f"{int(batches)} of {available} batches"


def find_mlflow_logger(loggers: list[Logger] | Logger | None) -> MLFlowLogger | None:
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        if isinstance(logger, MLFlowLogger):
            return logger
    return None


def git_commit(root_dir: str) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root_dir, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def flatten(config: dict, prefix: str = "") -> dict[str, object]:
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


# What sets runs apart: the run's settings, by the top-level keys of the config. The rest (callbacks,
# logger, paths, tracking) is plumbing, kept whole in the run's config.yaml.
COMPARED_KEYS = ("seed", "optimized_metric", "test", "trainer", "compile", "data", "model", "task", "baseline")
# settings that change what a run logs or shows, or how fast it reads, not what it trains
NOT_COMPARED = frozenset({"trainer.default_root_dir", "trainer.enable_model_summary", "trainer.enable_progress_bar",
                          "trainer.log_every_n_steps", "data.datamodule.num_workers"})
NOT_COMPARED_GROUPS = ("data.prepare.",)  # how the data stage prepares it: the prepared data is the dataset input
CLASS_PATH = re.compile(r"^([A-Za-z_]\w*\.)+[A-Z]\w*$")  # transformer_lab.models.bert.BertClassifierConfig


def shown_value(value, root_dir: str | Path) -> str | None:
    """A setting as the compare view shows it: a path under the project as its relative path; None
    for what is not compared (a path elsewhere, which says where a clone is rather than what ran;
    a class path; an unset value)."""
    if value is None:
        return None
    text = str(value)
    if CLASS_PATH.match(text):
        return None
    if "://" in text or os.path.isabs(text):
        try:
            return Path(text).resolve().relative_to(Path(root_dir).resolve()).as_posix()
        except ValueError:
            return None
    return text


def comparable_params(resolved: dict, choices: dict[str, str], root_dir: str | Path) -> dict[str, str]:
    """The run's params: the settings a person compares runs by (COMPARED_KEYS, flattened), the config
    files chosen (`config.<group>`), no `_target_`, no class path, no absolute path. A setting of
    `data` that its datamodule repeats is shown once, as the datamodule's."""
    params = {f"config.{group}": option for group, option in choices.items()}
    flat = flatten({key: resolved[key] for key in COMPARED_KEYS if key in resolved})
    for key, value in flat.items():
        name = key.rsplit(".", 1)[-1]
        if name.startswith("_") or key in NOT_COMPARED or key.startswith(NOT_COMPARED_GROUPS):
            continue
        if key.startswith("data.") and not key.startswith("data.datamodule.") and \
                flat.get("data.datamodule." + key.removeprefix("data."), object()) == value:
            continue
        shown = shown_value(value, root_dir)
        if shown is not None:
            params[key] = shown[:6000]  # MLflow's longest param value
    return params


def log_run_context(logger: MLFlowLogger, cfg: DictConfig, overrides: list[str] | None = None,
                    parent_run_id: str | None = None, choices: dict[str, str] | None = None) -> None:
    """Params = the settings a person compares runs by (comparable_params); tags = git commit, DVC
    stage and experiment, the command line's overrides as one line, the sweep's parent run;
    artifact = the whole resolved config as YAML."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    client, run_id = logger.experiment, logger.run_id
    params = comparable_params(resolved, choices or {}, cfg.paths.root_dir)
    existing = client.get_run(run_id).data.params
    # MLflow params are immutable: a resumed run records what changed (max_epochs, ckpt_path) as tags.
    for key, value in params.items():
        if key in existing and existing[key] != value:
            client.set_tag(run_id, f"resumed_with.{key}", value)
    logger.log_hyperparams({k: v for k, v in params.items() if k not in existing})
    tags = {
        "git_commit": git_commit(cfg.paths.root_dir),
        "dvc_stage": os.environ.get("DVC_STAGE"),
        "dvc_experiment": os.environ.get("DVC_EXP_NAME"),  # set by `dvc exp run`
        "hydra_overrides": " ".join(overrides or []) or None,
        "task_name": cfg.get("task_name"),
        "mlflow.parentRunId": parent_run_id,  # MLflow's own tag: the UI nests this run under its sweep
    }
    for key, value in tags.items():
        if value:
            client.set_tag(run_id, key, value)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "config.yaml")
        path.write_text(OmegaConf.to_yaml(resolved))
        client.log_artifact(run_id, str(path))


def log_artifacts(logger: MLFlowLogger, paths: list[str | Path], artifact_path: str | None = None) -> None:
    for path in paths:
        if path is not None and Path(path).exists():
            logger.experiment.log_artifact(logger.run_id, str(path), artifact_path)


FAILURE_TAG = "failure"  # a failed sweep job's run: the one-line reason


def record_failed_job(cfg: DictConfig, output_dir: str | Path, overrides: list[str], parent_run_id: str | None,
                      reason: str) -> str:
    """A sweep job that failed ends as a FAILED MLflow run whose tag `failure` holds the one-line
    reason: the job's own run if it got as far as creating one, else a run created now, named and
    nested under the sweep as its run would have been, its overrides as params (what sets it apart
    in the compare view). Returns the run's id."""
    from mlflow import MlflowClient
    from mlflow.entities import Param

    entry = cfg.logger.mlflow
    client = MlflowClient(entry.tracking_uri)
    reference = read_run_reference(Path(output_dir) / RUN_REFERENCE)
    if reference:
        run_id = reference["run_id"]
    else:
        experiment = experiment_id(client, entry.experiment_name, cfg.paths.tracking_dir)
        tags = {"hydra_overrides": " ".join(overrides) or "(none)", "task_name": cfg.task_name}
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        name = entry.get("run_name") or run_name(cfg.task_name, overrides)
        run_id = client.create_run(experiment, run_name=name, tags=tags).info.run_id
        params = [override.lstrip("+").partition("=") for override in overrides if not override.startswith("~")]
        shown = [(key, shown_value(value, cfg.paths.root_dir)) for key, equals, value in params if equals]
        client.log_batch(run_id, params=[Param(key, value) for key, value in shown if value is not None])
    client.set_tag(run_id, FAILURE_TAG, reason[:5000])
    client.set_terminated(run_id, "FAILED")
    return run_id


def write_run_reference(path: str | Path, logger: MLFlowLogger) -> None:
    atomic_write_json(path, {
        "run_id": logger.run_id,
        "experiment_id": logger.experiment_id,
        "tracking_uri": logger._tracking_uri,
    })


def read_run_reference(path: str | Path) -> dict | None:
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else None


class RunRecord(Callback):
    """The MLflow bookkeeping of a training run. At the start: params (the resolved config), tags
    (git commit, DVC stage, overrides, sweep) and the run reference that later stages log into.
    At the end: the run's files, best checkpoint and model. A Lightning callback for `train()`;
    the baselines, which have no Trainer, call `start` and `finish` themselves."""

    def __init__(self, cfg: DictConfig):
        self.cfg, self.overrides, self.parent_run_id = cfg, hydra_overrides(), sweep_parent()
        self.choices = config_choices()
        self.logger: MLFlowLogger | None = None
        self.split_sizes: dict[str, int | str] = {}  # examples trained on and scored on, counted as the trainer goes
        self.system_metrics = None  # MLflow's monitor of CPU, memory (and GPU) use, while the run trains

    def start(self, logger: MLFlowLogger | None) -> None:
        if logger is None or self.logger is not None:
            return
        self.logger = logger
        log_run_context(logger, self.cfg, self.overrides, self.parent_run_id, self.choices)
        write_run_reference(Path(self.cfg.paths.output_dir) / RUN_REFERENCE, logger)
        interval = (self.cfg.get("tracking") or {}).get("system_metrics_s")
        if interval:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            # resume_logging: a resumed run's samples go on from its last step
            self.system_metrics = SystemMetricsMonitor(logger.run_id, sampling_interval=interval, resume_logging=True,
                                                       tracking_uri=logger._tracking_uri)
            self.system_metrics.start()

    def stop_system_metrics(self) -> None:
        if self.system_metrics is not None:
            self.system_metrics.finish()
            self.system_metrics = None

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self.stop_system_metrics()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":  # the samples cover training; validation and test of the best checkpoint follow
            self.stop_system_metrics()

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit" and trainer.is_global_zero:  # one process records the run
            self.start(find_mlflow_logger(trainer.loggers))

    def on_train_start(self, trainer, pl_module) -> None:
        self._count("train", trainer.train_dataloader, [float("inf")], trainer.world_size)

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.state.fn == TrainerFn.VALIDATING:  # trainer.validate, whose scores the run reports
            # limit_val_batches lets a debug run score a few batches of the validation set
            self._count("validation", trainer.val_dataloaders, trainer.num_val_batches, trainer.world_size)

    def _count(self, split: str, loaders, batches: list[int | float], world_size: int) -> None:
        count = examples_in(loaders, batches, world_size)
        if count is not None:
            self.split_sizes[split] = count

    def log_metrics(self, metrics: dict[str, float]) -> None:
        if self.logger:
            self.logger.log_metrics(metrics)

    def record_data(self, settings: dict) -> str | None:
        """Record the data the run was trained and scored on: tags (data_record: the datamodule's
        settings and the examples counted), the examples per split as params (`data.examples.<split>`),
        and the data as MLflow datasets (data_inputs). Returns the data fingerprint."""
        if self.logger is None:
            return None
        client, run_id = self.logger.experiment, self.logger.run_id
        tags = data_record(settings, self.split_sizes)
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
        existing = client.get_run(run_id).data.params
        sizes = {f"data.examples.{split}": str(size) for split, size in self.split_sizes.items()}
        self.logger.log_hyperparams({key: value for key, value in sizes.items() if key not in existing})
        data_name = (self.cfg.get("data") or {}).get("name") or self.choices.get("data") or "data"
        client.log_inputs(run_id, data_inputs(settings, self.split_sizes, str(data_name), tags[DATA_FINGERPRINT],
                                              self.cfg.paths.root_dir))
        return tags[DATA_FINGERPRINT]

    def finish(self, files: list[str | Path], checkpoint: str | None = None) -> None:
        """files: under the run's artifacts; checkpoint: under checkpoints/. The run's model is logged
        by the stage that trained it (training/logged_model.py), not here: tracking knows no model."""
        self.stop_system_metrics()
        if self.logger is None:
            return
        log_artifacts(self.logger, files)
        if checkpoint:
            log_artifacts(self.logger, [checkpoint], "checkpoints")

    @property
    def link(self) -> str | None:
        if self.logger is None:
            return None
        return run_link(self.logger._tracking_uri, self.logger.experiment_id, self.logger.run_id,
                        Path(self.cfg.paths.tracking_dir, "mlflow.db"))  # the store `make ui` serves
