"""One job of a study: one variant with one seed, trained through `pipelines/train.py`'s own code
(same config tree, same Lightning task, an MLflow child run of the study's parent) or, for a
baseline that is no transformer, through its runner. Each job leaves `study_job.json` in its
folder: what the summary reads.

A study that declares `pretrain` (and variants that add their own `pretrain` overrides) makes every
job two trainings: a pre-training run in the job's `pretrain/` folder (no MLflow run of its own),
then the trained variant fine-tuned from its last checkpoint (its weights, sizes and tokenizer), the
pre-training's scores and seconds recorded beside the fine-tuned ones as `pretrain/...`."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from transformer_lab.errors import TransformerLabError
from transformer_lab.utils.io import atomic_write_json

JOB_FILE = "study_job.json"


def sweep_every_variant(arguments: list[str]) -> list[str]:
    """The command line with `variant=` sweeping every variant the study declares, unless it names
    some (or no study, which Hydra then asks for)."""
    asks_only = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i"}  # composed in run mode: no sweep
    if any(a.lstrip("+").startswith("variant=") for a in arguments) or asks_only & set(arguments):
        return arguments
    study = [a.split("=", 1)[1] for a in arguments if a.startswith("study=")]
    if not study:
        return arguments
    root = os.environ.get("PROJECT_ROOT") or Path(__file__).resolve().parents[3]  # set by the entry point's bootstrap
    path = Path(root, "conf", "study", f"{study[-1]}.yaml")
    if not path.is_file():
        return arguments  # Hydra names the options there are
    names = list(OmegaConf.load(path).study.variants)
    # --multirun: a study is a sweep even where Hydra cannot compose it (it then names the real mistake,
    # not the variant list); first, as argparse wants the overrides together
    return ["--multirun", every_variant(names), *arguments]


def every_variant(names) -> str:
    """The `variant=` override that sweeps the given variants (quoted: names hold @ and dots)."""
    return "variant=" + ",".join(f"'{name}'" for name in names)


def variant_spec(study: DictConfig, variant: str) -> DictConfig:
    """The variant's declaration as {overrides: [...], pretrain: [...] | false, runner: None | {_target_: ...},
    group, x}."""
    if variant not in study.variants:
        raise TransformerLabError(f"variant={variant}: study {study.name} has variants "
                                  f"{', '.join(study.variants)}")
    spec = study.variants[variant]
    if isinstance(spec, (ListConfig, list)):  # the short form: a list of overrides
        spec = OmegaConf.create({"overrides": list(spec)})
    return spec


def on_embedded_data(study: DictConfig) -> bool:
    """True where the real data the study names (study.shared_data) is absent, as in a clone
    without ../shared: the study then runs on the embedded data (study.fallback)."""
    return bool(study.get("shared_data")) and not Path(study.shared_data).exists()


def with_fallback(study: DictConfig, overrides: list[str], embedded: bool | None = None) -> list[str]:
    """overrides, each one study.fallback names replaced by its embedded-data counterpart where the
    real data is absent (embedded=None) or as asked."""
    if not (on_embedded_data(study) if embedded is None else embedded):
        return list(overrides)
    fallback = study.get("fallback") or {}
    return [fallback.get(override, override) for override in overrides]


def train_overrides(cfg: DictConfig, spec: DictConfig, embedded: bool | None = None) -> list[str]:
    """pipelines/train.py's overrides for this job: the study's shared ones, the variant's, the seed,
    the study's experiment, and a probe callback; nothing registered, no model logged (a study's
    runs are measurements, not candidates for serving), no progress bar."""
    from transformer_lab.studies.probes import PROBES_FILE  # probes.py imports Lightning: in the job, not at start-up

    study = cfg.study
    probes = list(study.get("probes") or [])
    shared = (study.get("group_overrides") or {}).get(spec.get("group"), [])  # what every variant of its group sets
    chosen = with_fallback(study, [*(study.get("base") or []), *shared, *(spec.get("overrides") or [])], embedded)
    return [*chosen, f"seed={cfg.seed}", f"task_name={cfg.task_name}",
            "tracking.register=false", "tracking.log_trained_model=false",
            "callbacks.rich_progress_bar=null",  # dozens of short runs: each one's summary line says enough
            "+callbacks.study_probes._target_=transformer_lab.studies.probes.StudyProbes",
            f"+callbacks.study_probes.probes=[{','.join(probes)}]",
            f"+callbacks.study_probes.path={PROBES_FILE}",
            *(cfg.get("train_overrides") or [])]


def pretrain_overrides(cfg: DictConfig, spec: DictConfig, embedded: bool | None = None) -> list[str] | None:
    """pipelines/train.py's overrides of the job's pre-training (study.pretrain, then the variant's
    pretrain), or None where the job pre-trains nothing (the study declares no pre-training, or the
    variant says `pretrain: false`): the seed, no MLflow run of its own (the job's run is the
    fine-tuned one), no progress bar."""
    study = cfg.study
    if spec.get("pretrain") is False or (study.get("pretrain") is None and spec.get("pretrain") is None):
        return None
    chosen = with_fallback(study, [*(study.get("pretrain") or []), *(spec.get("pretrain") or [])], embedded)
    return [*chosen, f"seed={cfg.seed}", "logger=none", "tracking.register=false", "tracking.log_trained_model=false",
            "callbacks.rich_progress_bar=null", *(cfg.get("train_overrides") or [])]


def pretrain_job(cfg: DictConfig, spec: DictConfig, output_dir: Path) -> dict:
    """The job's pre-training, in output_dir/pretrain: {"start": the overrides that fine-tune from
    its last checkpoint, "metrics": its scores, steps and seconds as pretrain/...}."""
    from hydra import compose

    from transformer_lab.families import check_config
    from transformer_lab.training.train import train

    run_dir = output_dir / "pretrain"
    pretrain_cfg = compose("train", overrides=[*pretrain_overrides(cfg, spec), f"++paths.output_dir={run_dir}"])
    check_config(pretrain_cfg)
    started = time.perf_counter()
    metrics = train(pretrain_cfg)
    seconds = time.perf_counter() - started
    written = json.loads((run_dir / "metrics.json").read_text())
    measured = {**metrics, "seconds": seconds, "steps": written["steps"]}
    return {"start": start_from(run_dir / "checkpoints" / "last.ckpt", run_dir, written["steps"]),
            "metrics": {f"pretrain/{name}": float(value) for name, value in measured.items()}}


def start_from(checkpoint: Path, folder: Path, steps: int) -> list[str]:
    """Overrides that fine-tune from a pre-training checkpoint, which must hold the weights after the
    run's last step (`steps`): its encoder's weights, its sizes and the tokenizer it was trained with
    (which travels in the checkpoint; written to folder)."""
    from transformer_lab.tasks.checkpoints import read_checkpoint

    saved = read_checkpoint(checkpoint)
    if saved.get("global_step") != steps:
        raise TransformerLabError(f"{checkpoint}: saved at step {saved.get('global_step')}, but the pre-training "
                                  f"ended at step {steps}; end it at an epoch's end (trainer.max_epochs)")
    hparams = saved["hyper_parameters"]
    tokenizer = folder / "tokenizer.json"
    tokenizer.write_text(hparams["preprocessor"]["tokenizer"])
    sizes = hparams["model_config"]
    return [f"task.pretrained={checkpoint}", f"data.datamodule.tokenizer_path={tokenizer}",
            *(f"model.{key}={sizes[key]}" for key in ("n_layers", "d_model", "n_heads", "d_ff", "max_len"))]


def train_job(cfg: DictConfig, spec: DictConfig, output_dir: Path) -> dict:
    """Compose the training config inside the running study job (its Hydra output folder becomes
    the training run's) and train; first pre-train, where the study does."""
    from hydra import compose

    from transformer_lab.families import check_config
    from transformer_lab.studies.probes import PROBES_FILE
    from transformer_lab.training.train import train

    pretrained = pretrain_job(cfg, spec, output_dir) if pretrain_overrides(cfg, spec) is not None else {}
    train_cfg = compose("train", overrides=[*train_overrides(cfg, spec), *pretrained.get("start", [])])
    check_config(train_cfg)
    started = time.perf_counter()
    metrics = train(train_cfg)
    seconds = time.perf_counter() - started
    written = json.loads((output_dir / "metrics.json").read_text())
    probes_path = output_dir / PROBES_FILE
    probes = json.loads(probes_path.read_text()) if probes_path.is_file() else {}
    if pretrained:
        seconds += pretrained["metrics"]["pretrain/seconds"]  # the job's training time: both runs
        metrics = {**metrics, **pretrained["metrics"]}
        log_into_job_run(cfg, output_dir, pretrained["metrics"])
    return {"metrics": metrics, "params": written["params"], "seconds": seconds, "steps": written["steps"],
            "curve": probes.pop("curve", []), "probes": probes}


def log_into_job_run(cfg: DictConfig, output_dir: Path, metrics: dict) -> None:
    """The pre-training's scores, steps and seconds as metrics of the job's MLflow run (the fine-tuned
    one, which the training recorded in output_dir), where it has one."""
    from transformer_lab.tracking import runs as tracking

    reference = tracking.read_run_reference(output_dir / tracking.RUN_REFERENCE)
    if reference is None:  # logger=none
        return
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    MlflowClient(reference.get("tracking_uri") or cfg.paths.mlflow_tracking_uri).log_batch(
        reference["run_id"], metrics=[Metric(name, value, now, 0) for name, value in metrics.items() if math.isfinite(value)])


def runner_job(cfg: DictConfig, spec: DictConfig, output_dir: Path) -> dict:
    """A baseline that is not trained through pipelines/train.py (a CNN, a logistic regression, a
    constant prediction): its runner returns {metrics, params, seconds}."""
    from hydra.utils import instantiate

    runner = arguments_with_fallback(cfg.study, spec.runner)
    started = time.perf_counter()
    result = instantiate(runner, seed=cfg.seed, output_dir=str(output_dir), _convert_="all")
    result.setdefault("seconds", time.perf_counter() - started)
    if cfg.get("logger") and "mlflow" in cfg.logger:
        record_runner_run(cfg, runner, result)
    return {"curve": [], "probes": {}, "steps": None, **result}


def record_runner_run(cfg: DictConfig, runner: dict, result: dict) -> str:
    """A baseline's job is an MLflow child run of the study like every trained variant's: its
    settings as params, its scores as metrics, nested under the study's parent run."""
    from hydra.core.hydra_config import HydraConfig
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    from transformer_lab.tracking import runs as tracking
    from transformer_lab.tracking.sweeps import sweep_parent_run_id

    client = MlflowClient(cfg.paths.mlflow_tracking_uri)
    experiment = tracking.experiment_id(client, cfg.task_name, cfg.paths.tracking_dir)
    overrides = tracking.hydra_overrides()
    tags = {"hydra_overrides": " ".join(overrides) or "(none)", "task_name": cfg.task_name, "runner": runner["_target_"]}
    parent = sweep_parent_run_id(HydraConfig.get().sweep.dir) if HydraConfig.initialized() else None
    if parent:
        tags["mlflow.parentRunId"] = parent
    run_id = client.create_run(experiment, run_name=tracking.run_name(cfg.task_name, overrides), tags=tags).info.run_id
    params = {"variant": cfg.variant, "seed": cfg.seed, "params": result["params"],
              **{f"runner.{key}": value for key, value in runner.items()}}
    now = int(time.time() * 1000)
    metrics = [Metric(name, float(value), now, 0) for name, value in result["metrics"].items()
               if value is not None and math.isfinite(float(value))]
    metrics.append(Metric("train_seconds", float(result["seconds"]), now, 0))
    client.log_batch(run_id, metrics=metrics, params=[Param(key, str(value)[:6000]) for key, value in params.items()])
    client.set_terminated(run_id, "FINISHED")
    return run_id


def arguments_with_fallback(study: DictConfig, call: DictConfig, embedded: bool | None = None) -> dict:
    """A runner's or a data step's {_target_, arguments}, resolved, each string argument that
    study.fallback names replaced by its embedded-data counterpart (a path, a source) where the real
    data is absent (embedded=None) or as asked."""
    call = OmegaConf.to_container(call, resolve=True)
    return {key: with_fallback(study, [value], embedded)[0] if isinstance(value, str) and key != "_target_" else value
            for key, value in call.items()}


def check_requirements(study: DictConfig, root: str | Path) -> None:
    """What the study reads but does not make (study.requires: path -> the command that makes it),
    named in one line before any job starts."""
    for path, command in (study.get("requires") or {}).items():
        if not Path(root, path).exists():
            raise TransformerLabError(f"study {study.name} reads {path}, which is not there yet: run `{command}` first")


def prepare_data(study: DictConfig, root: str | Path) -> None:
    """Run the study's data steps (study.prepare: `pipelines/<script>.py overrides...` lines, or a
    function and its arguments, {_target_: ..., key: value}) once, before its first job."""
    import shlex
    import subprocess
    import sys

    from hydra.utils import instantiate

    for line in study.get("prepare") or []:
        if not isinstance(line, str):  # a function of the project's own, called here
            call = arguments_with_fallback(study, line)
            print(f"study {study.name}: {call['_target_']}", flush=True)
            instantiate(call, _convert_="all")
            continue
        script, *overrides = shlex.split(line)
        command = [sys.executable, str(Path(root, "pipelines", script)), *with_fallback(study, overrides)]
        print(f"study {study.name}: {' '.join(command[1:])}", flush=True)
        done = subprocess.run(command, cwd=root, check=False)
        if done.returncode:
            raise TransformerLabError(f"study.prepare: `{line}` failed (exit {done.returncode})")


PREPARED = "study_data_prepared"  # in the sweep folder: the study's data steps have run


def prepare_once(cfg: DictConfig, sweep_dir: str | Path | None) -> None:
    """The study's requirements checked and its data steps run before its first job trains; in a job,
    not a Hydra callback, so that a failure stops the job with its one line (Hydra only warns about
    a callback's error, and the jobs would train on stale data)."""
    marker = Path(sweep_dir, PREPARED) if sweep_dir else None
    if marker is not None and marker.is_file():
        return
    check_requirements(cfg.study, cfg.paths.root_dir)
    prepare_data(cfg.study, cfg.paths.root_dir)
    if marker is not None:
        marker.write_text("")


def run_job(cfg: DictConfig, output_dir: str | Path, sweep_dir: str | Path | None = None) -> float | None:
    """Run the job `cfg.variant` x `cfg.seed` of `cfg.study`; returns the study's metric (what a
    sweeper would optimise) and records the job in output_dir/study_job.json."""
    from transformer_lab.studies.probes import finite_or_none

    output_dir = Path(output_dir)
    spec = variant_spec(cfg.study, cfg.variant)
    prepare_once(cfg, sweep_dir)
    result = (runner_job if spec.get("runner") else train_job)(cfg, spec, output_dir)
    metric = cfg.study.metric
    if metric not in result["metrics"]:
        raise TransformerLabError(f"study.metric={metric}: variant {cfg.variant} recorded only "
                                  f"{', '.join(sorted(result['metrics']))}")
    value = float(result["metrics"][metric])
    record = {"variant": cfg.variant, "seed": int(cfg.seed), "value": finite_or_none(value),
              "params": int(result["params"]), "seconds": round(float(result["seconds"]), 2),
              "steps": result.get("steps"), "metrics": {k: finite_or_none(float(v)) for k, v in result["metrics"].items()},
              "curve": result["curve"], "probes": result["probes"]}
    atomic_write_json(output_dir / JOB_FILE, record)
    return record["value"]

