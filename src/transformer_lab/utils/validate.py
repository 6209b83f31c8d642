"""Config values checked at the edge: a wrong type or a value out of range is one line naming the key,
before anything is built or any data is read."""

from __future__ import annotations

import ast
import functools
import importlib.util
import types
import typing
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from transformer_lab.errors import TransformerLabError
from transformer_lab.utils.dvc_outputs import declared_outputs

_SCALARS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _accepts(hint, value) -> bool | None:
    """Whether `value` fits the annotation `hint`; None when the hint is not one this checks."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        verdicts = [_accepts(arm, value) for arm in typing.get_args(hint)]
        return None if None in verdicts else any(verdicts)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return None


def _describe(hint) -> str:
    arms = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return " or ".join(_SCALARS.get(arm, "null" if arm is type(None) else getattr(arm, "__name__", str(arm)))
                       for arm in arms)


def check_value(name: str, value, hint) -> None:
    """One setting against a type annotation (`int`, `float | None`, ...): one line naming it."""
    if _accepts(hint, value) is False:
        raise TransformerLabError(f"{name}={value!r}: expected {_describe(hint)}")


def check_types(node: DictConfig, where: str) -> None:
    """Every scalar key of `node` against the annotation of the parameter it sets in `node._target_`
    (a dataclass field or an `__init__` argument): `model.n_heads=abc` stops here, not deep inside.
    The annotations are read from the project's source, so this imports nothing (torch least)."""
    hints = parameter_types(node._target_) if "_target_" in node else None
    if hints is None:
        return
    for key in node:
        if key.startswith("_") or key not in hints or OmegaConf.is_missing(node, key):
            continue
        value = node[key]
        if isinstance(value, DictConfig) or OmegaConf.is_list(value):
            continue
        check_value(f"{where}.{key}", value, hints[key])


_HINTS = {"int": int, "float": float, "bool": bool, "str": str, "None": type(None)}
PROJECT_PACKAGE = "transformer_lab."


def parameter_types(target: str) -> dict[str, type | types.UnionType] | None:
    """The annotations check_value reads (int, float, bool, str, None and unions of them) of what the
    project class `target` takes: a dataclass's fields (its bases' first) or the arguments of the first
    `__init__` along its bases. Read from source: its module imports torch. None if not found there."""
    module, _, name = target.rpartition(".")
    found = _class_source(module, name) if target.startswith(PROJECT_PACKAGE) else None
    if found is None:
        return None
    annotations = _annotations(*found)
    return None if annotations is None else {k: h for k, h in annotations.items() if h is not None}


@functools.cache
def _module_source(module: str) -> ast.Module | None:
    try:
        spec = importlib.util.find_spec(module)  # imports its parent packages only
    except ModuleNotFoundError:
        return None
    origin = spec.origin if spec else None
    return ast.parse(Path(origin).read_text()) if origin and origin.endswith(".py") else None


def _class_source(module: str, name: str) -> tuple[ast.ClassDef, str] | None:
    """The class `name` as `module` defines or imports it (from the project's own modules), with the
    module that defines it."""
    tree = _module_source(module)
    for statement in tree.body if tree else ():
        if isinstance(statement, ast.ClassDef) and statement.name == name:
            return statement, module
        if isinstance(statement, ast.ImportFrom) and (statement.module or "").startswith(PROJECT_PACKAGE):
            for alias in statement.names:
                if (alias.asname or alias.name) == name:
                    return _class_source(statement.module, alias.name)
    return None


def _annotations(cls: ast.ClassDef, module: str) -> dict | None:
    bases = [_class_source(module, b.id) for b in cls.bases if isinstance(b, ast.Name)]
    if any(ast.unparse(d).split("(")[0].endswith("dataclass") for d in cls.decorator_list):
        fields = {}
        for base in reversed([b for b in bases if b]):
            fields.update(_annotations(*base) or {})
        fields.update({s.target.id: _hint(s.annotation) for s in cls.body
                       if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)})
        return fields
    init = next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
    if init is not None:
        return {a.arg: _hint(a.annotation) for a in init.args.args + init.args.kwonlyargs if a.annotation}
    # no __init__ of its own: the first base's that has one, as Python's method order finds it here
    return next((found for found in (_annotations(*b) for b in bases if b) if found is not None), None)


def _hint(node: ast.expr):
    """An annotation as a type check_value reads, else None (a list, a dict, a Literal, a class)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
        return _hint(ast.parse(node.value, mode="eval").body)
    if isinstance(node, ast.Constant) and node.value is None:
        return type(None)
    if isinstance(node, ast.Name):
        return _HINTS.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _hint(node.left), _hint(node.right)
        return None if left is None or right is None else left | right
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Optional":
        inner = _hint(node.slice)
        return None if inner is None else inner | None
    return None


def check_trainer(trainer: DictConfig, choice: str | None = None) -> None:
    """The trainer's settings that Lightning, or the tasks' learning-rate schedules, would fail on only
    once the data is read. `choice`: the conf/trainer/ option, to name it. A GPU accelerator is checked
    against the machine, which imports torch (not Lightning)."""
    max_epochs, max_steps = trainer.get("max_epochs"), trainer.get("max_steps", -1)
    check_value("trainer.max_epochs", max_epochs, int | None)
    check_value("trainer.max_steps", max_steps, int)
    if max_epochs is not None and max_epochs < -1:
        raise TransformerLabError(f"trainer.max_epochs={max_epochs}: expected a number of epochs, 0 or more")
    if max_steps < -1:
        raise TransformerLabError(f"trainer.max_steps={max_steps}: expected a number of steps, or -1 for no limit")
    # Lightning reads max_epochs -1 (or null beside a max_time) as no limit; the tasks size their schedules
    # by trainer.estimated_stepping_batches, which is then infinite unless max_steps bounds it (OverflowError).
    if (max_epochs == -1 or (max_epochs is None and trainer.get("max_time"))) and max_steps == -1:
        steps = "trainer.max_steps" if "max_steps" in trainer else "+trainer.max_steps"
        raise TransformerLabError(f"trainer.max_epochs={'null' if max_epochs is None else max_epochs}: training "
                                  "without an end, which the learning-rate schedules cannot size; give a number "
                                  f"of epochs, or {steps}=N")
    accumulate = trainer.get("accumulate_grad_batches", 1)
    check_value("trainer.accumulate_grad_batches", accumulate, int)
    if accumulate < 1:
        raise TransformerLabError(f"trainer.accumulate_grad_batches={accumulate}: expected 1 or more batches a step")
    devices = trainer.get("devices", "auto")
    if _accepts(int, devices) and (devices == 0 or devices < -1):
        raise TransformerLabError(f"trainer.devices={devices}: expected 1 or more, -1 (all of them) or auto")
    accelerator = trainer.get("accelerator")
    if accelerator in ("gpu", "cuda", "mps"):
        _check_gpus(accelerator, devices, f" (trainer={choice})" if choice else "")


def gpu_count(accelerator: str) -> int:
    """The devices of `accelerator` this machine has; "gpu" is CUDA's, else Apple's one MPS device, as in
    Lightning. Imports torch: call it only for a config that asks for a GPU."""
    import torch

    cuda, mps = torch.cuda.device_count(), int(torch.backends.mps.is_available())  # neither initialises CUDA
    return {"cuda": cuda, "mps": mps}.get(accelerator, cuda or mps)


def _check_gpus(accelerator: str, devices, chosen: str) -> None:
    available = gpu_count(accelerator)
    if available == 0:
        raise TransformerLabError(f"trainer.accelerator={accelerator}{chosen}: this machine has no GPU; on its CPUs, "
                                  "trainer=ddp_cpu (data parallel, 2 processes) or trainer=cpu")
    if _accepts(int, devices) and devices > available:
        raise TransformerLabError(f"trainer.devices={devices}{chosen}: this machine has {available} "
                                  f"GPU{'s' if available > 1 else ''}")


def check_batch_sizes(datamodule: DictConfig, where: str = "data.datamodule") -> None:
    """Every `*batch_size` of a datamodule that is a number is 1 or more (a word such as `auto` is the
    datamodule's to read, its type check_types')."""
    for key in datamodule:
        if str(key).endswith("batch_size") and not OmegaConf.is_missing(datamodule, key):
            value = datamodule[key]
            if _accepts(int, value) and value < 1:
                raise TransformerLabError(f"{where}.{key}={value}: expected 1 or more examples a batch")


def check_local_inputs(data: DictConfig) -> None:
    """With `data.source=local`, the `data.local_*` settings name what is read (a path, or a list or a
    mapping of paths, an entry of which may be null): each must exist. One line naming the path before
    the preparation imports its readers."""
    if data.get("source") != "local":
        return
    for key in [k for k in data if str(k).startswith("local_")]:
        value = data[key]
        paths = list(value.values()) if isinstance(value, DictConfig) else list(value) \
            if isinstance(value, ListConfig) else [value]
        if not [path for path in paths if path not in (None, "")]:
            raise TransformerLabError(f"data.{key} is required with data.source=local: pass data.{key}=PATH")
        for path in paths:
            if path not in (None, "") and not Path(path).exists():
                raise TransformerLabError(f"{path}: not found (data.{key}, read with data.source=local)")


def check_inputs(cfg: DictConfig, *keys: str) -> None:
    """The files and folders a stage reads, named by `keys` of its config, exist: else one line naming
    the first one missing and the DVC stage that writes it, before the stage imports its readers."""
    for key in keys:
        path = Path(OmegaConf.select(cfg, key, throw_on_missing=True))
        if not path.exists():
            stage = stage_writing(path, cfg.paths.root_dir)
            raise TransformerLabError(f"{path}: not found ({key}){f'; run `dvc repro {stage}`' if stage else ''}")


def stage_writing(path: str | Path, root: str | Path) -> str | None:
    """The stage of root/dvc.yaml whose outputs hold `path`, if one does (a stage with a matrix aside:
    its outputs are templates, which no path equals)."""
    try:
        relative = Path(path).resolve().relative_to(Path(root).resolve())
    except ValueError:
        return None
    for name, output in declared_outputs(Path(root)):
        if relative == Path(output) or Path(output) in relative.parents:
            return name
    return None
