"""Evaluation of a trained checkpoint on a prepared split: metrics, plots, and the same MLflow run."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import torch
from omegaconf import DictConfig

from transformer_lab import plots, tracking
from transformer_lab.checkpoints import load_task
from transformer_lab.data.atis import read_prepared_split
from transformer_lab.errors import TransformerLabError
from transformer_lab.evaluation import intent_confusion, per_slot_f1, score_predictions
from transformer_lab.tasks.joint_intent_slot import JointIntentSlotTask
from transformer_lab.utils.io import atomic_write_json, atomic_write_text


def _write_csv(path: Path, rows: list[dict]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


def mlflow_run_for(cfg: DictConfig, run_reference: dict | None, run_name: str = "evaluate"):
    """The training run's MLflow run if it still exists, else a new run (`run_name`) in the same experiment."""
    import mlflow
    from mlflow import MlflowClient

    uri = cfg.paths.mlflow_tracking_uri  # answering: every command checks it first (check_tracking)
    client = MlflowClient(uri)
    if run_reference:
        try:
            return client, client.get_run(run_reference["run_id"]).info.run_id
        except mlflow.exceptions.MlflowException as err:
            # Only a run that is gone gets a new one; a server that fails must not leave a duplicate.
            if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise TransformerLabError(f"MLflow {uri}: cannot read run {run_reference['run_id']} "
                                          f"({str(err).splitlines()[0][:200]})") from None
    experiment_id = tracking.experiment_id(client, cfg.task_name, cfg.paths.tracking_dir)
    return client, client.create_run(experiment_id, tags={"mlflow.runName": run_name}).info.run_id


def check_tracking(cfg: DictConfig) -> None:
    """An MLflow server that is down stops an evaluation before it reads anything."""
    if cfg.get("logger"):
        tracking.check_tracking_server(cfg.paths.mlflow_tracking_uri)


def evaluate(cfg: DictConfig) -> dict:
    """Joint intent + slot scores of a checkpoint on a prepared ATIS split."""
    check_tracking(cfg)
    torch.manual_seed(cfg.seed)
    output_dir = Path(cfg.paths.output_dir)
    task = load_task(cfg.checkpoint, JointIntentSlotTask, "train_atis")
    gold = read_prepared_split(cfg.data.prepared_dir, cfg.split)
    predicted = task.predict_words([g["words"] for g in gold])
    metrics = score_predictions(gold, predicted)
    slot_rows, confusion_rows = per_slot_f1(gold, predicted), intent_confusion(gold, predicted)

    metrics_path = output_dir / "metrics.json"
    atomic_write_json(metrics_path, {f"{cfg.split}/{k}": v for k, v in metrics.items()})
    _write_csv(output_dir / "per_slot_f1.csv", slot_rows)
    _write_csv(output_dir / "intent_confusion.csv", confusion_rows)
    figures = [
        plots.confusion_matrix(confusion_rows, output_dir / "intent_confusion.png", f"intent confusion ({cfg.split})"),
        plots.per_label_bars(slot_rows, "slot", "f1", output_dir / "per_slot_f1.png", f"slot F1 by type ({cfg.split})"),
    ]
    if cfg.get("logger"):
        client, run_id = mlflow_run_for(cfg, tracking.read_run_reference(cfg.run_reference))
        for name, value in metrics.items():
            client.log_metric(run_id, f"{cfg.split}/{name}", float(value))
        for path in [metrics_path, output_dir / "per_slot_f1.csv", output_dir / "intent_confusion.csv", *figures]:
            client.log_artifact(run_id, str(path), "evaluation")
    return metrics


def evaluate_word2vec(cfg: DictConfig) -> dict:
    """Export the trained vectors (word2vec text format), score them on WordSim-353, SimLex-999
    and the Google analogies, list nearest neighbours and draw a 2-D map."""
    import json

    from transformer_lab import word_vectors
    from transformer_lab.tasks.word2vec import Word2VecTask

    check_tracking(cfg)

    task = load_task(cfg.checkpoint, Word2VecTask, "pretrain_word2vec")
    words, vectors = task.vectors()
    output_dir = Path(cfg.paths.output_dir)
    word_vectors.save_word2vec_format(output_dir / "vectors.txt", words, vectors)
    kv = word_vectors.keyed_vectors(words, vectors)
    metrics = word_vectors.intrinsic_scores(kv)
    metrics["vocab_size"] = len(words)
    neighbours = word_vectors.nearest_neighbours(kv, list(cfg.probe_words))
    rows = word_vectors.projection(kv, cfg.projection_words)

    atomic_write_json(output_dir / "metrics.json", metrics)
    atomic_write_text(output_dir / "neighbours.json", json.dumps(neighbours, indent=1) + "\n")
    _write_csv(output_dir / "projection.csv", rows)
    figure = plots.word_map(rows, output_dir / "projection.png")
    if cfg.get("logger"):
        client, run_id = mlflow_run_for(cfg, tracking.read_run_reference(cfg.run_reference))
        for name, value in metrics.items():
            client.log_metric(run_id, f"eval/{name}", float(value))
        for artifact in (output_dir / "metrics.json", output_dir / "neighbours.json", figure):
            client.log_artifact(run_id, str(artifact), "evaluation")
    return metrics


def evaluate_vit(cfg: DictConfig) -> dict:
    """Accuracy and macro-F1 of a ViT checkpoint on a prepared image split, the confusion matrix,
    a grid of misclassified images and the last layer's [CLS] attention over the patches."""
    from torchmetrics.functional.classification import multiclass_accuracy, multiclass_f1_score

    from transformer_lab.data.images import ImageDataModule, read_split
    from transformer_lab.tasks.image_classification import ImageClassificationTask

    check_tracking(cfg)
    torch.manual_seed(cfg.seed)
    output_dir = Path(cfg.paths.output_dir)
    task = load_task(cfg.checkpoint, ImageClassificationTask, "train_vit")
    datamodule = ImageDataModule(cfg.data.prepared_dir)
    datamodule.setup()
    dataset = datamodule.sets["validation" if cfg.split == "validation" else "test"]
    raw_images, labels = read_split(cfg.data.prepared_dir, cfg.split)
    predictions = torch.cat([task.predict_images(dataset.images[i:i + 256])[0] for i in range(0, len(labels), 256)])
    targets = torch.from_numpy(labels)
    classes = datamodule.classes
    n = len(classes)
    metrics = {f"{cfg.split}/acc": multiclass_accuracy(predictions, targets, n, average="micro").item(),
               f"{cfg.split}/macro_f1": multiclass_f1_score(predictions, targets, n, average="macro").item(),
               f"{cfg.split}/n_images": len(labels)}

    rows = [{"actual": classes[a], "predicted": classes[p]} for a, p in zip(labels.tolist(), predictions.tolist())]
    wrong = torch.nonzero(predictions != targets).flatten()[:cfg.max_misclassified].tolist()
    figures = [
        plots.confusion_matrix(rows, output_dir / "confusion.png", f"confusion ({cfg.split})"),
        plots.image_grid(raw_images[wrong], [f"{classes[labels[i]]} → {classes[predictions[i]]}" for i in wrong],
                         output_dir / "misclassified.png", f"misclassified {cfg.split} images (true → predicted), "
                         f"{int((predictions != targets).sum())} of {len(labels)}"),
    ]
    if task.model.config.attention == "global":  # windowed attention has no [CLS] token to read
        shown = list(range(min(cfg.attention_maps, len(labels))))
        _, weights = task.predict_images(dataset.images[shown], return_weights=True)
        grid = task.model.config.image_size // task.model.config.patch_size
        last = weights[-1].mean(dim=1)  # (images, 1 + patches, 1 + patches), mean over heads
        if task.model.config.pool == "cls":  # what the classifier reads: the [CLS] row
            maps, what = last[:, 0, 1:], "[CLS] attention over patches"
        else:  # mean pooling reads every patch: the attention each patch receives, averaged over patches
            maps, what = last[:, 1:, 1:].mean(dim=1), "attention each patch receives (mean over patch queries)"
        figures.append(plots.attention_maps(raw_images[shown], maps.view(-1, grid, grid).numpy(),
                                            [f"{classes[labels[i]]} → {classes[predictions[i]]}" for i in shown],
                                            output_dir / "attention.png", f"last layer: {what}, mean of heads"))

    metrics_path = output_dir / "metrics.json"
    atomic_write_json(metrics_path, metrics)
    _write_csv(output_dir / "confusion.csv", rows)
    if cfg.get("logger"):
        client, run_id = mlflow_run_for(cfg, tracking.read_run_reference(cfg.run_reference))
        for name, value in metrics.items():
            client.log_metric(run_id, name, float(value))
        for path in [metrics_path, output_dir / "confusion.csv", *figures]:
            client.log_artifact(run_id, str(path), "evaluation")
    return metrics


def evaluate_tabular(cfg: DictConfig) -> dict:
    """Every trained tabular model (TabTransformer, MLP, XGBoost, logistic regression) scored on the
    same prepared split with the same metrics: a comparison table (JSON + CSV) and a bar chart,
    each model's scores logged into its own run, the comparison into a run of its own."""
    from transformer_lab import baselines
    from transformer_lab.data.tabular import fold_rows, read_prepared
    from transformer_lab.tasks.tabular_classification import TabularClassificationTask, score_probabilities

    check_tracking(cfg)
    torch.manual_seed(cfg.seed)
    output_dir = Path(cfg.paths.output_dir)
    table, schema, encoder = read_prepared(cfg.data.prepared_dir)
    rows = encoder.transform(fold_rows(table, None)[cfg.split])
    labels = torch.from_numpy(rows.labels)
    comparison = []
    for name, directory in cfg.models.items():
        stage = f"train_tabular@{name}" if name.startswith("tab_") else f"train_{name}"
        checkpoint = Path(directory, "checkpoints", "best.ckpt")
        if checkpoint.is_file():
            task = load_task(checkpoint, TabularClassificationTask, stage)
            probabilities = task.predict_probabilities(torch.from_numpy(rows.categorical),
                                                       torch.from_numpy(rows.continuous))
        else:
            probabilities = torch.from_numpy(
                baselines.predict_probabilities(baselines.load(directory, stage), encoder, rows)).float()
        comparison.append({"model": name, **score_probabilities(probabilities, labels)})

    metric_names = ["auroc", "acc", "f1"]
    metrics = {r["model"]: {f"{cfg.split}/{m}": r[m] for m in metric_names} for r in comparison}
    metrics_path = output_dir / "comparison.json"
    atomic_write_json(metrics_path, metrics)
    _write_csv(output_dir / "comparison.csv", comparison)
    figure = plots.model_comparison(comparison, metric_names, output_dir / "comparison.png",
                                    f"{schema.name}: {cfg.split} split, {len(labels)} rows")
    if cfg.get("logger"):
        for name, directory in cfg.models.items():
            reference = tracking.read_run_reference(Path(directory, tracking.RUN_REFERENCE))
            if reference:
                client, run_id = mlflow_run_for(cfg, reference)
                for key, value in metrics[name].items():
                    client.log_metric(run_id, f"eval/{key}", float(value))
        client, run_id = mlflow_run_for(cfg, None, run_name="comparison")
        for name, scores in metrics.items():
            for key, value in scores.items():
                client.log_metric(run_id, f"{name}/{key}", float(value))
        for path in (metrics_path, output_dir / "comparison.csv", figure):
            client.log_artifact(run_id, str(path))
        client.set_terminated(run_id)
    return metrics
