"""Few-shot prompting from the command line (pipelines/few_shot.py): accuracy per K on a task's
evaluation split, beside always answering the majority label; a JSON file and an MLflow run."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from transformer_lab.inference.few_shot import few_shot_accuracy, load_language_model, majority_accuracy, read_sst2
from transformer_lab.tracking import runs as tracking
from transformer_lab.tracking.evaluations import mlflow_run_for
from transformer_lab.utils.io import atomic_write_json


def evaluate(cfg: DictConfig) -> dict:
    tracking.check_tracking(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    task = cfg.few_shot_task
    data_dir = Path(task.data_dir)
    train = read_sst2(data_dir / task.train_file)
    evaluation = read_sst2(data_dir / task.eval_file)[: cfg.examples]
    shots = [int(k) for k in cfg.shots]
    verbalisers = {str(k): v for k, v in task.verbalisers.items()}
    lm = load_language_model(str(cfg.model_source))
    start = time.perf_counter()
    scores = few_shot_accuracy(lm, train, evaluation, shots, verbalisers, seed=cfg.seed, template=task.template,
                               progress=True)
    result = {"accuracy_by_shots": {str(k): round(v, 4) for k, v in scores.items()},
              "majority": round(majority_accuracy(evaluation), 4), "examples": len(evaluation),
              "task": task.name, "model": str(cfg.model_source), "context": lm.max_len, "seed": cfg.seed,
              "seconds": round(time.perf_counter() - start, 1)}
    atomic_write_json(cfg.out, result)
    if cfg.get("logger"):
        client, run_id = mlflow_run_for(cfg, None, run_name=f"{task.name} {Path(str(cfg.model_source)).name}")
        for key, value in {"model": cfg.model_source, "task": task.name, "shots": shots, "examples": len(evaluation),
                           "seed": cfg.seed, "template": task.template}.items():
            client.log_param(run_id, key, str(value))
        for k, accuracy in scores.items():
            client.log_metric(run_id, "accuracy", accuracy, step=k)  # MLflow charts it against K
            client.log_metric(run_id, f"accuracy_{k}_shot", accuracy)
        client.log_metric(run_id, "majority", result["majority"])
        client.log_artifact(run_id, str(cfg.out))
        client.set_terminated(run_id)
    return result
