"""The code MLflow logs as a training run's model (serving.py: "models from code", no pickle)."""

import mlflow

from transformer_lab.serving import PipelineModel

mlflow.models.set_model(PipelineModel())
