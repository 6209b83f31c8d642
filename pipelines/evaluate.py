"""Evaluate a family's trained model(s): `python pipelines/evaluate.py evaluate=FAMILY [key=value ...]`.

FAMILY is one of conf/evaluate/ (atis, elmo, multimodal, tabular, translation, vit, word2vec); that
file holds the family's settings and names its evaluator (`evaluator._target_`, the function in
transformer_lab/evaluation/), which is the only one imported. Examples:
    python pipelines/evaluate.py evaluate=vit [train_dir=DIR] [split=test|validation]
    python pipelines/evaluate.py evaluate=atis checkpoint=PATH split=dev
    python pipelines/evaluate.py evaluate=tabular --cfg job     (the composed config, nothing run)
Scores go to the run folder's metrics.json and into the MLflow run that trained the model."""


import sys

import _project  # noqa: E402

_project.bootstrap()  # the project root, its own Python, the warm interpreter
import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from transformer_lab.utils.cli import lightning_logs_through_hydra, entry_point, run  # noqa: E402
from transformer_lab.utils.validate import check_inputs  # noqa: E402

# What an evaluator reads first, where its family's config names it (the comparisons, tabular and
# multimodal, name no checkpoint: they read the training folders in `models`; word2vec names no data).
INPUTS = ("checkpoint", "data.prepared_dir")
_ABSENT = object()


def metrics_lines(family: str, cfg: DictConfig, metrics: dict) -> list[str]:
    """What the evaluation prints: a line per model for a comparison (tabular, multimodal), else one line."""
    if metrics and all(isinstance(scores, dict) for scores in metrics.values()):
        return [f"{model:20s} " + " ".join(f"{k}={v:.4f}" for k, v in scores.items()) for model, scores in metrics.items()]
    if family == "atis":  # its scores are named without the split, and come with counts
        return [" ".join(f"{cfg.split}/{k}={v:.4f}" for k, v in metrics.items() if isinstance(v, float))]
    number = ".4g" if family == "elmo" else ".4f"  # a perplexity in the hundreds, beside counts
    return [" ".join(f"{k}={v:{number}}" for k, v in metrics.items())]


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
@entry_point
def main(cfg: DictConfig) -> None:
    family = HydraConfig.get().runtime.choices["evaluate"]
    named = [key for key in INPUTS if OmegaConf.select(cfg, key, default=_ABSENT) is not _ABSENT]
    check_inputs(cfg, *named)  # a missing input: one line, before torch loads
    # resolved here, not at the top: --help and a rejected config answer before torch loads, and
    # only this family's evaluator is imported
    evaluate = hydra.utils.instantiate(cfg.evaluator)  # _partial_: the function, not a call
    lightning_logs_through_hydra()

    for line in metrics_lines(family, cfg, evaluate(cfg)):
        print(line)


def general_help() -> str:
    """`--help` before a family is chosen (Hydra can compose no config without one): how to choose."""
    families = ", ".join(sorted(p.stem for p in (_project.ROOT / "conf" / "evaluate").glob("*.yaml")))
    return (f"usage: python pipelines/evaluate.py evaluate=FAMILY [key=value ...]\n"
            f"FAMILY: {families}\n"
            f"A family's settings, config groups and config: python pipelines/evaluate.py evaluate=FAMILY --help")


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]) and not any(a.startswith("evaluate=") for a in sys.argv[1:]):
        print(general_help())
        sys.exit(0)
    run(main)  # a failed DVC stage keeps its previous outputs
