"""Reading checkpoints: a checkpoint is data, never code.

Every checkpoint is read with `torch.load(weights_only=True)`: tensors, numbers, strings and
containers of them, nothing that can run when unpickled. A Lightning checkpoint of this project
holds only such values (weights, optimiser and scheduler state, loop counters, hyper-parameters
as plain dicts and lists, the random state of `callbacks.RandomState`), so nothing is
allow-listed.
"""

from __future__ import annotations

import inspect
import pickle
import zipfile
from pathlib import Path

import torch

from transformer_lab.errors import TransformerLabError

FAMILY_KEY = "family"
# A fitted tabular baseline (baselines.py) has no checkpoint: its folder holds the estimator in its
# own format (XGBoost's, or skops for scikit-learn; neither a pickle) and the preprocessor as JSON.
XGBOOST_FILE, ESTIMATOR_FILE, PREPROCESSOR_FILE = "model.ubj", "model.skops", "preprocessor.json"
BASELINE_FILES = (XGBOOST_FILE, ESTIMATOR_FILE, PREPROCESSOR_FILE)


def is_baseline_folder(directory: str | Path) -> bool:
    return any((Path(directory) / name).is_file() for name in (XGBOOST_FILE, ESTIMATOR_FILE))


class NamesItsFamily:
    """A task mixin: every checkpoint it writes names its family (families.py), so that a pipeline
    handed a checkpoint, a stage's folder or an MLflow run knows the task class that reads it. A
    LightningModule hook, not a callback: Lightning leaves callbacks out of weights-only checkpoints."""

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        from transformer_lab.families import family_of_task

        checkpoint[FAMILY_KEY] = family_of_task(f"{type(self).__module__}.{type(self).__name__}").name


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def read_checkpoint(path: str | Path, missing_hint: str = "") -> dict:
    """The checkpoint at `path` as plain data; one clear error for a missing file (`missing_hint`
    says what to do), a file that is not a PyTorch checkpoint, or one that would need to run code."""
    path = Path(path)
    if not path.is_file():
        raise TransformerLabError(f"{path}: checkpoint not found{'; ' + missing_hint if missing_hint else ''}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        blocked = [line.strip() for line in str(err).splitlines() if "GLOBAL" in line]
        if not blocked:
            raise TransformerLabError(f"{path}: not a PyTorch checkpoint (unreadable as one)") from None
        # weights_only refuses every global it does not know: unpickling it would run that code
        raise TransformerLabError(f"{path}: refused to load: it holds Python objects, not only weights, and "
                                  f"unpickling it could run code ({blocked[0][:160]})") from None
    except (RuntimeError, EOFError, ValueError, zipfile.BadZipFile, OSError) as err:
        raise TransformerLabError(f"{path}: not a PyTorch checkpoint ({_first_line(err)[:160]})") from None
    if not isinstance(checkpoint, dict) or not {"state_dict", "hyper_parameters"} <= set(checkpoint):
        raise TransformerLabError(f"{path}: not a transformer-lab checkpoint (a Lightning checkpoint with "
                                  "'state_dict' and 'hyper_parameters')")
    return checkpoint


def load_task(path: str | Path, task_class: type, stage: str):
    """The trained `task_class` (a LightningModule of tasks/) saved at `path`, on the CPU in eval
    mode; `stage` is the DVC stage that trains it, named in errors."""
    checkpoint = read_checkpoint(path, f"train first (`dvc repro {stage}`)")
    hparams = dict(checkpoint["hyper_parameters"])
    signature = inspect.signature(task_class.__init__).parameters
    named = {n: p for n, p in signature.items() if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    if not any(p.kind == p.VAR_KEYWORD for p in signature.values()):
        hparams = {k: v for k, v in hparams.items() if k in named}  # a base class's own, as Lightning does
    missing = sorted(n for n, p in named.items() if p.default is p.empty and n not in hparams)
    if missing == ["preprocessor"]:  # this task's checkpoint, from before the preprocessor travelled in it
        raise TransformerLabError(f"{path}: saved without its preprocessor state (a checkpoint of an older "
                                  f"version, which predict cannot read raw inputs with); retrain: `dvc repro {stage}`")
    if missing:
        raise TransformerLabError(f"{path}: not a {task_class.__name__} checkpoint (its hyper-parameters lack "
                                  f"{missing[:3]}); use the one `dvc repro {stage}` writes")
    if "pretrained" in hparams:
        hparams["pretrained"] = None  # the saved weights replace the pre-trained start anyway
    try:
        task = task_class(**hparams)
    except (TypeError, ValueError, KeyError) as err:  # e.g. another family's model config
        raise TransformerLabError(f"{path}: not a {task_class.__name__} checkpoint "
                                  f"({_first_line(err)[:200]})") from None
    try:
        task.load_state_dict(checkpoint["state_dict"])
    except RuntimeError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        raise TransformerLabError(f"{path}: its weights do not fit {task_class.__name__} "
                                  f"({(lines[1:] or lines)[0][:200]})") from None
    task.on_load_checkpoint(checkpoint)
    return task.eval()
