"""Run a study of the course's claims: `python pipelines/study.py study=NAME` (conf/study/NAME.yaml).

Its variants x seeds are one Hydra multirun (each job one MLflow child run under the parent
`study/NAME`); at the end `studies/NAME/summary.json` and `figure.png` hold every variant's score
over the seeds and the computed verdict. One variant or other seeds: `variant=qkv seed=0,1`."""

import sys

import _project

_project.bootstrap()  # the project root, its own Python, the warm interpreter
import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import transformer_lab.families  # noqa: F401  (registers metric_mode for the training configs)
from transformer_lab.utils.cli import entry_point, lightning_logs_through_hydra, run


@hydra.main(version_base="1.3", config_path="../conf", config_name="study")
@entry_point
def main(cfg: DictConfig) -> float | None:
    from transformer_lab.studies.jobs import run_job  # here: --help and config errors answer at once

    lightning_logs_through_hydra()
    hydra_config = HydraConfig.get()
    return run_job(cfg, hydra_config.runtime.output_dir, hydra_config.sweep.dir)


if __name__ == "__main__":
    from transformer_lab.studies.jobs import sweep_every_variant

    sys.argv[1:] = sweep_every_variant(sys.argv[1:])  # variant=<all the study's variants> unless some are named
    sys.exit(run(main))
