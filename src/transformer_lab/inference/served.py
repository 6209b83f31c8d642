"""A trained model as an MLflow `pyfunc`: the pipeline (inference/pipeline.py) on the run's checkpoint.

The pyfunc is logged as code (MLflow's "models from code": served_model.py), with the run's
checkpoint (a baseline: its model file and preprocessor.json) as its one artifact: loading it
unpickles nothing, and it predicts what `transformer_lab.pipeline` predicts. Its input is a table
(pandas DataFrame, or JSON `dataframe_records` when served) with the pipeline's fields as columns:
text (and text_pair); question and context; image (an image file's bytes, base64-encoded); a table
row's own columns.

    mlflow.pyfunc.load_model("models:/atis@champion").predict(pd.DataFrame({"text": ["flights to boston"]}))
    mlflow models serve -m models:/atis@champion --env-manager local -p 5001

The training stage logs it explicitly (training/logged_model.py); tracking/ never imports this module.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from importlib.metadata import version
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INTERNAL_ERROR, INVALID_PARAMETER_VALUE

from transformer_lab.errors import TransformerLabError

log = logging.getLogger(__name__)

MODEL_CODE = Path(__file__).with_name("served_model.py")


def input_example(run) -> pd.DataFrame:
    """One input row for the pipeline `run` (pipeline.Pipeline): what the logged model's
    signature is inferred from; each task declares its own (Pipeline.input_example)."""
    return pd.DataFrame([run.input_example()])


def signature(run, example: pd.DataFrame):
    """The logged model's input signature: the example's column types, or `any` for every column
    of a task whose cells have no one type (Pipeline.typed_cells: a table row's cells are numbers
    or missing markers, "?")."""
    from mlflow.models import ModelSignature, infer_signature
    from mlflow.types.schema import AnyType, ColSpec, Schema

    if not run.typed_cells:
        return ModelSignature(inputs=Schema([ColSpec(AnyType(), column) for column in example.columns]))
    return infer_signature(example)


def records_to_inputs(task: str, frame: pd.DataFrame) -> list:
    """The pipeline inputs of a pyfunc input table's rows, each read as the pipeline of `task`
    reads a served row (Pipeline.served_input)."""
    from transformer_lab.inference.pipeline import PIPELINES

    read = PIPELINES[task].served_input
    return [read(record, f"input row {number}") for number, record in enumerate(frame.to_dict(orient="records"))]


class ServedError(MlflowException):
    """What the served model answers when it cannot predict: the HTTP status of error_code and JSON
    with the one-line message, nothing more. MLflow's scoring server answers other exceptions with
    the server's stack trace, and writes the whole input table before the message of this one
    ("Failed to predict data '...'"): the client sent that table, and the trace is the server's business."""

    def __init__(self, message: str, error_code: int):
        super().__init__(message, error_code=error_code)
        self.reason = message

    def serialize_as_json(self) -> str:
        return json.dumps({**json.loads(super().serialize_as_json()), "message": self.reason})


# The signature comes from the input example and records_to_inputs checks every row: MLflow's
# type-hint validation, which it asks for when the class is defined, would check less.
warnings.filterwarnings("ignore", message=r".*Add type hints to the `predict` method")


class PipelineModel(mlflow.pyfunc.PythonModel):
    """transformer_lab.pipeline on the checkpoint artifact, as an MLflow pyfunc."""

    def load_context(self, context) -> None:
        from transformer_lab.inference.pipeline import pipeline

        self.pipeline = pipeline(model=context.artifacts["checkpoint"])

    def predict(self, context, model_input, params=None) -> list:
        """The pipeline's answers; a bad row is answered (served: HTTP 400) with its one-line reason,
        any other failure (500) with its kind, its traceback going to the server's log."""
        if not isinstance(model_input, pd.DataFrame):
            model_input = pd.DataFrame(model_input if isinstance(model_input, list) else [model_input])
        try:
            return self.pipeline(records_to_inputs(self.pipeline.task_name, model_input), **(params or {}))
        except TransformerLabError as err:
            raise ServedError(str(err), INVALID_PARAMETER_VALUE) from None
        except Exception as err:
            log.exception("predict failed")
            raise ServedError(f"the model failed on this input ({type(err).__name__}); the server's log has "
                              "the details", INTERNAL_ERROR) from err


def log_pipeline_model(run_id: str, checkpoint: str | Path) -> str | None:
    """Log the pipeline of a checkpoint (or a fitted baseline's folder) into run `run_id` as a
    pyfunc; its URI, or None for a model no pipeline task reads (word2vec: its vectors are the
    run's artifact)."""
    import tempfile

    import torch

    from transformer_lab.inference.pipeline import pipeline
    from transformer_lab.tasks.checkpoints import BASELINE_FILES

    try:
        run = pipeline(model=str(checkpoint))
    except TransformerLabError:
        return None
    example = input_example(run)
    requirements = [f"torch=={torch.__version__.split('+')[0]}", "transformer-lab"]
    with tempfile.TemporaryDirectory() as staging, mlflow.start_run(run_id=run_id):  # reopens the finished run
        artifact = Path(checkpoint)
        if artifact.is_dir():  # a baseline: its model and preprocessor only, not the whole stage folder
            artifact = Path(staging) / "baseline"
            artifact.mkdir()
            for name in BASELINE_FILES:
                if (Path(checkpoint) / name).is_file():
                    shutil.copy2(Path(checkpoint) / name, artifact / name)
            requirements += [f"{d}=={version(d)}" for d in baseline_distributions(run.model.estimator)]
        info = mlflow.pyfunc.log_model(
            name="model", python_model=str(MODEL_CODE), artifacts={"checkpoint": str(artifact)},
            signature=signature(run, example), input_example=example,
            # Requirements named here: inferring them imports every package and takes long.
            pip_requirements=requirements)
    mlflow.MlflowClient().set_tag(run_id, "model_uri", info.model_uri)
    return info.model_uri


def baseline_distributions(estimator) -> list[str]:
    """The installed distributions of the estimator's package (xgboost-cpu or xgboost, scikit-learn)."""
    from importlib.metadata import packages_distributions

    module = type(estimator).__module__.split(".")[0]
    distributions = packages_distributions().get(module, [])
    return distributions[:1] + (["skops"] if module == "sklearn" else [])
