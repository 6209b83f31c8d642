"""Evaluate a trained Vision Transformer: `python pipelines/evaluate_vit.py [train_dir=DIR] [split=test]`."""

import os
from pathlib import Path

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parents[1]))

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from transformer_lab.evaluate import evaluate_vit  # noqa: E402
from transformer_lab.utils.cli import pipeline  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate_vit")
@pipeline
def main(cfg: DictConfig) -> None:
    metrics = evaluate_vit(cfg)
    print(" ".join(f"{k}={v:.4f}" for k, v in metrics.items()))


if __name__ == "__main__":
    main()
