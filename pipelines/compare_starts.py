"""Compare one task fine-tuned from several starts: `python pipelines/compare_starts.py`
(defaults: sentiment from scratch, from the project's pre-trained BERT and from MiniLM)."""


import _project  # noqa: E402

_project.bootstrap()  # the project root, its own Python, the warm interpreter
import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from transformer_lab.utils.cli import lightning_logs_through_hydra, entry_point, run  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="compare_starts")
@entry_point
def main(cfg: DictConfig) -> None:
    # imported here, not at the top: --help and a config Hydra rejects answer before torch loads
    from transformer_lab.evaluation.transfer import compare
    lightning_logs_through_hydra()

    for start, scores in compare(cfg).items():
        print(f"{start:10s} " + " ".join(f"{k}={v:.4f}" for k, v in scores.items()))


if __name__ == "__main__":
    run(main)  # a failed DVC stage keeps its previous outputs
