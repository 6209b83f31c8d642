"""Train a tabular baseline: `python pipelines/train_baseline.py baseline=xgboost|logistic_regression`."""

import json

import _project  # noqa: E402

_project.bootstrap()  # the project root, its own Python, the warm interpreter
import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from transformer_lab.utils.cli import lightning_logs_through_hydra, entry_point, run  # noqa: E402
from transformer_lab.utils.validate import check_inputs  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="train_baseline")
@entry_point
def main(cfg: DictConfig) -> float | None:
    check_inputs(cfg, "data.prepared_dir")  # a missing input: one line, before torch loads
    # imported here, not at the top: --help and a rejected config answer before torch loads
    from transformer_lab.training.baselines import train_baseline
    lightning_logs_through_hydra()

    metrics = train_baseline(cfg)
    print(json.dumps(metrics, indent=1))
    return metrics.get("val/auroc")  # what a sweeper optimises


if __name__ == "__main__":
    run(main)  # a failed DVC stage keeps its previous outputs
