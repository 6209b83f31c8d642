"""Train a model: `python pipelines/train.py [experiment=atis/full] [model.n_heads=8] [-m model.n_heads=1,2,4]`;
resume a run: `python pipelines/train.py hydra.run.dir=RUN_DIR ckpt_path=last [trainer.max_epochs=30]`."""

import sys

import _project  # noqa: E402

_project.bootstrap()  # the project root, its own Python, the warm interpreter
import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from transformer_lab.families import check_config  # noqa: E402  (also registers metric_mode)
from transformer_lab.utils.cli import lightning_logs_through_hydra, entry_point, rejoin_ddp_job, resume_run_arguments, run  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
@entry_point
def main(cfg: DictConfig) -> float | None:
    check_config(cfg)  # family, types, ranges, GPUs: one line before any data is read (torch only to count GPUs)
    from transformer_lab.training.train import train  # here, not at the top: --help and config errors answer at once
    lightning_logs_through_hydra()

    metrics = train(cfg)
    return metrics.get(cfg.optimized_metric)  # what a sweeper optimises


if __name__ == "__main__":
    rejoin_ddp_job()  # an extra DDP process of one multirun job runs that job, not the sweep
    sys.argv[1:] = resume_run_arguments(sys.argv[1:])  # hydra.run.dir=DIR ckpt_path=last: DIR's own config
    run(main)  # a failed DVC stage keeps its previous outputs
