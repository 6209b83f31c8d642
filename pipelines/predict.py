"""Any trained model on raw inputs (transformer_lab.pipeline), the task inferred from the model:

    python pipelines/predict.py text="cheapest flight from boston to denver"   # the ATIS tagger
    python pipelines/predict.py model=artifacts/bert/sentiment_minilm text="a gripping, funny film"
    python pipelines/predict.py model=artifacts/bert/qa question="Who wrote it?" context="..."
    python pipelines/predict.py model=artifacts/bert/pretrain text="the [MASK] sat" +options.top_k=3
    python pipelines/predict.py model=minilm task=feature-extraction text="a sentence to embed"
    python pipelines/predict.py model=artifacts/vit/train image=digit.png
    python pipelines/predict.py model=artifacts/tabular/xgboost row='{island: Biscoe, sex: female, ...}'
    python pipelines/predict.py model=models:/sentiment@champion input=reviews.txt output=out.jsonl

model= is a checkpoint, a stage's output folder, an MLflow run id or URI (runs:/..., models:/...),
or a published encoder (minilm). Prints the pipeline's output as JSON; with input= (txt, jsonl
or csv) writes one JSON line per input to output=.
"""


import json  # noqa: E402
import sys  # noqa: E402

import _project  # noqa: E402

_project.bootstrap()  # the project root, its own Python, the warm interpreter
import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from transformer_lab.inference.predict import predict  # noqa: E402
from transformer_lab.utils.cli import entry_point, rename_overrides, run  # noqa: E402
from transformer_lab.utils.overrides import quote_free_text  # noqa: E402

# model= and task= name what to predict with, but conf/ has model/ and task/ groups: in the config
# they are model_source and pipeline_task
sys.argv = rename_overrides(sys.argv, {"model": "model_source", "task": "pipeline_task"})
sys.argv = quote_free_text(sys.argv, ("text", "text_pair", "question", "context"))  # commas, brackets: as typed


@hydra.main(version_base="1.3", config_path="../conf", config_name="predict")
@entry_point
def main(cfg: DictConfig) -> None:
    result = predict(cfg)
    if cfg.get("input") is None:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        print(f"{len(result)} predictions -> {cfg.output}")


if __name__ == "__main__":
    run(main)  # a failed DVC stage keeps its previous outputs
