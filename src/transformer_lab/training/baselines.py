"""The baselines beside the TabTransformer on the same rows and split: XGBoost (gradient-boosted
trees, early stopping on the validation rows) and scikit-learn's logistic regression. Both read
the one-hot categoricals and the standardised continuous columns (+ missing indicators) of the
same train-fitted encoder, and are scored by the same torchmetrics definitions as the task.

A baseline's folder holds the estimator and the preprocessor of its rows (preprocessor.json: the
table's schema and the encoder), so `pipeline("tabular-classification", model=FOLDER)` reads raw
rows as it does for the TabTransformer."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from transformer_lab.data.tabular import EncodedRows, TabularEncoder, TabularPreprocessor, encoded_splits, read_schema
from transformer_lab.errors import TransformerLabError
from transformer_lab.tasks.checkpoints import ESTIMATOR_FILE, PREPROCESSOR_FILE, XGBOOST_FILE
from transformer_lab.tasks.tabular_classification import score_probabilities
from transformer_lab.tracking import runs as tracking
from transformer_lab.training import logged_model
from transformer_lab.utils.io import atomic_write_json


def is_xgboost(estimator) -> bool:
    return type(estimator).__module__.startswith("xgboost")


def fit(estimator, encoder: TabularEncoder, train: EncodedRows, validation: EncodedRows):
    """Fit on the training rows; XGBoost also watches the validation rows for early stopping."""
    if is_xgboost(estimator):
        estimator.fit(encoder.one_hot(train), train.labels,
                      eval_set=[(encoder.one_hot(validation), validation.labels)], verbose=False)
    else:
        estimator.fit(encoder.one_hot(train), train.labels)
    return estimator


def predict(estimator, encoder: TabularEncoder, rows: EncodedRows) -> np.ndarray:
    """Class probabilities (rows, n_classes), as TabularClassificationTask.predict gives them."""
    return estimator.predict_proba(encoder.one_hot(rows))


def score(estimator, encoder: TabularEncoder, rows: EncodedRows) -> dict[str, float]:
    probabilities = torch.from_numpy(predict(estimator, encoder, rows)).float()
    return score_probabilities(probabilities, torch.from_numpy(rows.labels))


def save(estimator, directory: Path) -> Path:
    """XGBoost in its own binary format (portable across versions), scikit-learn with skops:
    neither is a pickle, so loading one runs no code."""
    if is_xgboost(estimator):
        estimator.save_model(directory / XGBOOST_FILE)
        return directory / XGBOOST_FILE
    import skops.io

    skops.io.dump(estimator, directory / ESTIMATOR_FILE)
    return directory / ESTIMATOR_FILE


def load(directory: str | Path, stage: str):
    directory = Path(directory)
    if (directory / XGBOOST_FILE).is_file():
        import xgboost

        estimator = xgboost.XGBClassifier()
        estimator.load_model(directory / XGBOOST_FILE)
        return estimator
    if (directory / ESTIMATOR_FILE).is_file():
        import skops.io

        path = directory / ESTIMATOR_FILE
        untrusted = skops.io.get_untrusted_types(file=path)
        if untrusted:  # skops' default trust covers scikit-learn's own estimators and numpy
            raise TransformerLabError(f"{path}: refused to load: it holds types that are not trusted "
                                      f"({', '.join(untrusted[:3])})")
        return skops.io.load(path)
    raise TransformerLabError(f"{directory}: no trained model (checkpoints/best.ckpt, {XGBOOST_FILE} or "
                              f"{ESTIMATOR_FILE}); train first (`dvc repro {stage}`)")


class FittedBaseline:
    """A fitted baseline with its preprocessor: raw table rows in, class probabilities out, as
    TabularClassificationTask.predict (what the tabular-classification pipeline calls)."""

    def __init__(self, estimator, preprocessor: TabularPreprocessor):
        self.estimator, self.preprocessor = estimator, preprocessor

    @classmethod
    def load(cls, directory: str | Path, stage: str = "train_xgboost") -> FittedBaseline:
        path = Path(directory) / PREPROCESSOR_FILE
        if not path.is_file():
            raise TransformerLabError(f"{path}: missing (baselines save it since they became pipelines); "
                                      f"retrain: `dvc repro {stage}`")
        return cls(load(directory, stage), TabularPreprocessor.from_state(json.loads(path.read_text())))

    def predict(self, rows, batch_size: int | None = None) -> torch.Tensor:
        """Class probabilities (rows, n_classes); batch_size is the task's argument, unused here."""
        # one error naming a row without a feature column or with a number that is not finite (which
        # scikit-learn would answer with a raw ValueError, and XGBoost with an answer from an inf)
        encoded = self.preprocessor.encode(rows)
        return torch.from_numpy(predict(self.estimator, self.preprocessor.encoder, encoded)).float()


def train_baseline(cfg: DictConfig) -> dict[str, float]:
    """Fit `cfg.baseline` on the prepared table, score validation and test, save the model and
    record everything in an MLflow run of the task's experiment."""
    tracking.check_tracking(cfg)  # a server that is down stops the run before any data is read
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    encoded, encoder = encoded_splits(cfg.data.prepared_dir, cfg.data.datamodule.get("fold"))
    estimator = instantiate(cfg.baseline)

    start = time.perf_counter()
    fit(estimator, encoder, encoded["train"], encoded["validation"])
    metrics = {"train_seconds": round(time.perf_counter() - start, 3)}
    for split, prefix in (("validation", "val"), ("test", "test")):
        metrics.update({f"{prefix}/{k}": v for k, v in score(estimator, encoder, encoded[split]).items()})
    if is_xgboost(estimator):
        metrics["best_iteration"] = int(estimator.best_iteration)

    model_path = save(estimator, output_dir)
    preprocessor = TabularPreprocessor(read_schema(cfg.data.prepared_dir), encoder)
    preprocessor_path = output_dir / PREPROCESSOR_FILE
    atomic_write_json(preprocessor_path, preprocessor.to_state())
    metrics_path = output_dir / "metrics.json"
    atomic_write_json(metrics_path, metrics)
    record = tracking.RunRecord(cfg)  # what train() records, without a Trainer
    logger = tracking.find_mlflow_logger(tracking.build_loggers(cfg))
    record.start(logger)
    record.log_metrics(metrics)
    record.split_sizes = {split: len(encoded[split].labels) for split in ("train", "validation", "test")}
    record.record_data({"prepared_dir": cfg.data.prepared_dir, "fold": cfg.data.datamodule.get("fold")})
    record.finish([metrics_path, model_path, preprocessor_path])
    if record.logger and cfg.tracking.log_trained_model:
        logged_model.log_pipeline_model(record.logger, output_dir)
    if logger:
        logger.finalize("success")
    return metrics
