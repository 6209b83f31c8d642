"""One job of a study: one variant with one seed, trained through `pipelines/train.py`'s own code
(same config tree, same Lightning task, an MLflow child run of the study's parent) or, for a
baseline that is no transformer, through its runner. Each job leaves `study_job.json` in its
folder: what the summary reads."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from transformer_lab.errors import TransformerLabError
from transformer_lab.studies.probes import PROBES_FILE, finite_or_none
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
    """The variant's declaration as {overrides: [...], runner: None | {_target_: ...}, group, x}."""
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
    study = cfg.study
    probes = list(study.get("probes") or [])
    shared = (study.get("group_overrides") or {}).get(spec.get("group"), [])  # what every variant of its group sets
    chosen = with_fallback(study, [*(study.get("base") or []), *shared, *spec.overrides], embedded)
    return [*chosen, f"seed={cfg.seed}", f"task_name={cfg.task_name}",
            "tracking.register=false", "tracking.log_trained_model=false",
            "callbacks.rich_progress_bar=null",  # dozens of short runs: each one's summary line says enough
            "+callbacks.study_probes._target_=transformer_lab.studies.probes.StudyProbes",
            f"+callbacks.study_probes.probes=[{','.join(probes)}]",
            f"+callbacks.study_probes.path={PROBES_FILE}",
            *(cfg.get("train_overrides") or [])]


def train_job(cfg: DictConfig, spec: DictConfig, output_dir: Path) -> dict:
    """Compose the training config inside the running study job (its Hydra output folder becomes
    the training run's) and train."""
    from hydra import compose

    from transformer_lab.families import check_config
    from transformer_lab.training.train import train

    train_cfg = compose("train", overrides=train_overrides(cfg, spec))
    check_config(train_cfg)
    started = time.perf_counter()
    metrics = train(train_cfg)
    seconds = time.perf_counter() - started
    written = json.loads((output_dir / "metrics.json").read_text())
    probes_path = output_dir / PROBES_FILE
    probes = json.loads(probes_path.read_text()) if probes_path.is_file() else {}
    return {"metrics": metrics, "params": written["params"], "seconds": seconds, "steps": written["steps"],
            "curve": probes.pop("curve", []), "probes": probes}


def runner_job(cfg: DictConfig, spec: DictConfig, output_dir: Path) -> dict:
    """A baseline that is not trained through pipelines/train.py (a CNN, a logistic regression, a
    constant prediction): its runner returns {metrics, params, seconds}."""
    from hydra.utils import instantiate

    runner = OmegaConf.to_container(spec.runner, resolve=True)
    runner = {key: with_fallback(cfg.study, [value])[0] if isinstance(value, str) and key != "_target_" else value
              for key, value in runner.items()}
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


def check_requirements(study: DictConfig, root: str | Path) -> None:
    """What the study reads but does not make (study.requires: path -> the command that makes it),
    named in one line before any job starts."""
    for path, command in (study.get("requires") or {}).items():
        if not Path(root, path).exists():
            raise TransformerLabError(f"study {study.name} reads {path}, which is not there yet: run `{command}` first")


def prepare_data(study: DictConfig, root: str | Path) -> None:
    """Run the study's data steps (study.prepare: `pipelines/<script>.py overrides...` lines) once,
    before its first job."""
    import shlex
    import subprocess
    import sys

    for line in study.get("prepare") or []:
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

