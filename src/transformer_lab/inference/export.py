"""Trained models out of the project: a Hugging Face folder (config.json, model.safetensors and
the tokenizer's files) that `transformers` loads with its own classes, e.g.

    transformers.pipeline("text-classification", model=DIR)

A family's registry entry (families.py, `export=Export(...)`) names the `transformers` class it
becomes and the converter module (inference/hf_bert.py, inference/hf_gpt2.py) that builds that
class's config, weights and tokenizer; the weights go through the models' name tables
(models/bert.py, models/gpt.py) and are loaded into that class strictly before anything is
written, so a folder that is written is one `transformers` reads whole. JointBERT (intent +
slots) has no `transformers` class: its encoder is exported as a BertModel and the two heads
beside it (joint_heads.safetensors, their labels in joint_heads.json).

`out` is written whole or not at all, and only where nothing is lost: a new or empty folder, or
an earlier export of the same family (its transformer_lab_export.json names the family and the
files written; a folder with files added is refused). A file, a folder of other files, the
model's own folder (or one holding it) and a DVC output (or a folder in or around one) are refused
in one line, untouched. A new folder inside the model's stage folder is fine: DVC tracks that
stage's checkpoints/ and metrics, not the folder.

torch and `transformers` load when the model is exported, not with this module: `pipelines/export.py`
checks out= before the model loads (`check_out_is_a_folder`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from transformer_lab.errors import TransformerLabError
from transformer_lab.families import FAMILIES, Export
from transformer_lab.utils.dvc_outputs import declared_outputs
from transformer_lab.utils.io import atomic_directory

if TYPE_CHECKING:
    import torch

EXPORT_RECORD = "transformer_lab_export.json"  # what was exported into a folder: a rerun may replace it
DVC_TEMPLATE = re.compile(r"\$\{[^}]*\}")  # ${item.model} in a dvc.yaml path: one path component


def model_paths(source: str) -> list[Path]:
    """The model's own folder (a stage's: the checkpoint's, or the one above its checkpoints/) and
    checkpoint when model= is a local path; none for an MLflow run, whose files are MLflow's copy."""
    from transformer_lab.inference.pipeline import model_path

    path = Path(source)
    if not path.exists():
        return []
    checkpoint = model_path(source).resolve()  # a stage folder's checkpoints/best.ckpt (or last.ckpt)
    if path.is_dir():
        return [path.resolve(), checkpoint]
    return [checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent, checkpoint]


def dvc_output_near(out: Path) -> str | None:
    """How `out` (resolved) meets a DVC output, which `dvc repro` deletes before rerunning its stage
    and `dvc commit` takes whole: 'inside X, an output of DVC stage S (dvc.yaml)'; None if it does not."""
    for project in (out, *out.parents):
        if (project / "dvc.yaml").is_file():
            where = out.relative_to(project).parts
            for stage, declared in declared_outputs(project):
                parts = Path(declared).parts
                if all(re.fullmatch("[^/]+".join(map(re.escape, DVC_TEMPLATE.split(part))), name)
                       for part, name in zip(parts, where)):
                    how = "is" if len(where) == len(parts) else "inside" if len(where) > len(parts) else "holds"
                    return f"{how} {declared}, an output of DVC stage {stage} ({project / 'dvc.yaml'})"
        if (project / ".dvc").is_dir():  # the DVC project's root
            return None
    return None


def check_out_is_a_folder(out: str | Path) -> None:
    """What check_out refuses first, and without the model: an `out` that is a file."""
    if Path(out).exists() and not Path(out).is_dir():
        raise TransformerLabError(f"out={out}: a file, not a folder; name a new folder (or an earlier export "
                                  "to replace)")


def check_out(out: str | Path, family: str, source: str) -> None:
    """Refuses, in one line and before anything is written, an `out` whose replacing would lose
    something (see the module docstring)."""
    check_out_is_a_folder(out)
    folder = Path(out).resolve()
    for held in model_paths(source):
        if folder == held:
            raise TransformerLabError(f"out={out}: the folder of model={source} (its checkpoints, metrics and "
                                      "history); export to another folder")
        if folder in held.parents:
            raise TransformerLabError(f"out={out}: holds model={source}; export to another folder")
    dvc = dvc_output_near(folder)
    if dvc:
        raise TransformerLabError(f"out={out}: {dvc}, which `dvc repro` deletes; export to a folder outside "
                                  "DVC's outputs")
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if not names:
        return
    try:
        record = json.loads((folder / EXPORT_RECORD).read_text())
        exported, files = (record["format"], record["family"]), set(record["files"])
    except (OSError, ValueError, TypeError, KeyError):
        listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise TransformerLabError(f"out={out}: holds files that are not an export ({listed}); name a new or "
                                  "empty folder, or an earlier export to replace") from None
    if exported != ("hf", family):
        raise TransformerLabError(f"out={out}: holds a {exported[1]} export ({exported[0]}), not a {family} one; "
                                  "name another folder")
    added = [name for name in names if name not in files | {EXPORT_RECORD}]
    if added:
        raise TransformerLabError(f"out={out}: an earlier export with files added ({', '.join(added[:3])}), "
                                  "which replacing it would delete; move them out or name another folder")


def export_spec(loaded) -> Export:
    """How the registry says the loaded model's family is exported, or one error naming the families
    that are."""
    entry = FAMILIES.get(loaded.family)
    spec = entry.export if entry else None
    if spec is None:
        exportable = [name for name, declared in FAMILIES.items() if declared.export]
        raise TransformerLabError(f"model={loaded.source} is a {loaded.family} model: format=hf exports "
                                  f"{', '.join(exportable)}")
    return spec


# Options `transformers`' BERT and GPT-2 classes have no setting for: a model trained with another
# value would load there and compute something else without a word (the studies' ablations).
HF_EXPRESSIBLE = {"attention_projections": "qkv", "attention_scaled": True, "residual": True, "layer_norm": True,
                  "pool": "cls"}


def check_expressible(config, architecture: str) -> None:
    """One line naming the first setting of the model's config that `architecture` cannot express."""
    for field, expressible in HF_EXPRESSIBLE.items():
        value = getattr(config, field, expressible)
        if value != expressible:
            raise TransformerLabError(f"format=hf: the model has {field}={value!r}, which transformers' {architecture} "
                                      f"cannot express (it would compute {field}={expressible!r}); the checkpoint "
                                      "still loads with transformer_lab.pipeline")


def hf_state(spec: Export, converter, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trained model's weights under the `transformers` class's names: those it has a place for
    (spec.omit: not), renamed by the converter, less the prefix the class's names lack (spec.body)."""
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(spec.omit)}
    return {k.removeprefix(spec.body): v for k, v in converter.state_dict(state).items()}


def export_hf(loaded, out: str | Path) -> Path:
    """Write the trained model `loaded` (pipeline.LoadedModel) as a Hugging Face folder at `out`, as
    its family's registry entry says (families.Export); nothing is left at `out` if anything fails."""
    import importlib

    import transformers
    from hydra.utils import get_object

    spec = export_spec(loaded)
    family, task = loaded.family, loaded.task
    check_out(out, family, loaded.source)
    converter = importlib.import_module(spec.converter)
    config, architecture = task.model.config, spec.architecture
    check_expressible(config, architecture)
    labels = getattr(task.preprocessor, spec.labels) if spec.labels else None
    model = getattr(transformers, architecture)(converter.config(config, labels, architecture))
    missing, unexpected = model.load_state_dict(hf_state(spec, converter, task.model), strict=False)
    missing = [k for k in missing if not k.endswith(("position_ids", "decoder.bias", "masked_bias", "attn.bias"))]
    if missing or unexpected:
        raise TransformerLabError(f"{architecture}: the converted weights do not fit (missing {missing[:3]}, "
                                  f"unexpected {unexpected[:3]})")
    with atomic_directory(out) as folder:
        model.eval().save_pretrained(folder, safe_serialization=True)
        converter.tokenizer(task.preprocessor, config.max_len).save_pretrained(folder)
        if spec.beside:
            get_object(spec.beside)(task, folder)
        (folder / EXPORT_RECORD).write_text(json.dumps({
            "format": "hf", "family": family, "architecture": architecture, "model": loaded.source,
            "files": sorted(p.name for p in folder.iterdir())}, indent=2) + "\n")
    return Path(out)
