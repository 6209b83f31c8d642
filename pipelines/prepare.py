"""Prepare a data set: `python pipelines/prepare.py [data=atis] [data.source=builtin|local|hub] [data.local_dir=DIR]`."""

import json

import _project  # noqa: E402

_project.bootstrap()  # the project root, its own Python, the warm interpreter
import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from transformer_lab.utils.cli import lightning_logs_through_hydra, entry_point, run  # noqa: E402
from transformer_lab.utils.validate import check_local_inputs  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="prepare")
@entry_point
def main(cfg: DictConfig) -> None:
    check_local_inputs(cfg.data)  # a missing file: one line, before torch loads
    # imported here, not at the top: --help and a rejected config answer before torch loads
    from transformer_lab.data.prepare import prepare
    lightning_logs_through_hydra()

    summary = prepare(cfg)
    print(f"prepared {cfg.data.name} from {cfg.data.source} into {cfg.data.prepared_dir}")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    run(main)  # a failed DVC stage keeps its previous outputs
