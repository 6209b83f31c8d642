"""Tag an utterance: `python pipelines/predict.py text="cheapest flight from boston to denver"`."""

import os
from pathlib import Path

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parents[1]))

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from transformer_lab.checkpoints import load_task  # noqa: E402
from transformer_lab.predict import format_prediction, predict_text  # noqa: E402
from transformer_lab.tasks.joint_intent_slot import JointIntentSlotTask  # noqa: E402
from transformer_lab.utils.cli import pipeline  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="predict")
@pipeline
def main(cfg: DictConfig) -> None:
    print(format_prediction(predict_text(load_task(cfg.checkpoint, JointIntentSlotTask, "train_atis"), str(cfg.text))))


if __name__ == "__main__":
    main()
