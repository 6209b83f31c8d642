"""Tag an utterance: `python pipelines/predict.py text="cheapest flight from boston to denver"`."""


import _project  # noqa: E402,F401  (PROJECT_ROOT; the project's own Python)

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from transformer_lab.checkpoints import load_task  # noqa: E402
from transformer_lab.predict import format_prediction, predict_text  # noqa: E402
from transformer_lab.tasks.joint_intent_slot import JointIntentSlotTask  # noqa: E402
from transformer_lab.utils.cli import pipeline, run  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="predict")
@pipeline
def main(cfg: DictConfig) -> None:
    text = str(cfg.text)  # required: checked before the checkpoint is read
    print(format_prediction(predict_text(load_task(cfg.checkpoint, JointIntentSlotTask, "train_atis"), text)))


if __name__ == "__main__":
    run(main)  # a failed DVC stage keeps its previous outputs
