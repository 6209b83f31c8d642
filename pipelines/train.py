"""Train a model: `python pipelines/train.py [experiment=atis] [model.n_heads=8] [-m model.n_heads=1,2,4]`."""

import os
from pathlib import Path

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parents[1]))

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from transformer_lab.train import train  # noqa: E402
from transformer_lab.utils.cli import pipeline, rejoin_ddp_job  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
@pipeline
def main(cfg: DictConfig) -> float | None:
    metrics = train(cfg)
    return metrics.get(cfg.optimized_metric)  # what a sweeper optimises


if __name__ == "__main__":
    rejoin_ddp_job()  # an extra DDP process of one multirun job runs that job, not the sweep
    main()
