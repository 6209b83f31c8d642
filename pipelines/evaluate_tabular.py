"""Compare the tabular models on one split: `python pipelines/evaluate_tabular.py [split=test]`."""


import _project  # noqa: E402

_project.bootstrap()  # the project root, its own Python, the warm interpreter
import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from transformer_lab.utils.cli import lightning_logs_through_hydra, pipeline, run  # noqa: E402
from transformer_lab.utils.validate import check_inputs  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate_tabular")
@pipeline
def main(cfg: DictConfig) -> None:
    check_inputs(cfg, "data.prepared_dir")  # a missing input: one line, before torch loads
    # imported here, not at the top: --help and a rejected config answer before torch loads
    from transformer_lab.evaluation.tabular import evaluate
    lightning_logs_through_hydra()

    for model, scores in evaluate(cfg).items():
        print(f"{model:20s} " + " ".join(f"{k}={v:.4f}" for k, v in scores.items()))


if __name__ == "__main__":
    run(main)  # a failed DVC stage keeps its previous outputs
