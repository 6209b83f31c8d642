"""Evaluate a checkpoint on a prepared split: `python pipelines/evaluate.py [checkpoint=PATH] [split=test]`."""

import os
from pathlib import Path

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parents[1]))

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from transformer_lab.evaluate import evaluate  # noqa: E402
from transformer_lab.utils.cli import pipeline  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
@pipeline
def main(cfg: DictConfig) -> None:
    metrics = evaluate(cfg)
    print(" ".join(f"{cfg.split}/{k}={v:.4f}" for k, v in metrics.items() if isinstance(v, float)))


if __name__ == "__main__":
    main()
