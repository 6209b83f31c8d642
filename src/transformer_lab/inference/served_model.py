"""The code MLflow logs as a training run's model (served.py: "models from code", no pickle)."""

import mlflow

from transformer_lab.inference.served import PipelineModel

mlflow.models.set_model(PipelineModel())
