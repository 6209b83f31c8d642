"""What a pipeline (pipelines.py) is given, checked without importing torch, so that
`pipelines/predict.py` and `pipelines/generate.py` refuse a bad call in one line before any model
loads: each option by name and range (OPTIONS), the options each task takes, and a model= path.

The options of a task are the keyword arguments of its pipeline's `run`, read from pipelines.py's
source rather than by importing it (which imports torch), as utils/validate.py reads a class's
parameter types: the one list of them is the code itself."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from transformer_lab.errors import TransformerLabError

PIPELINES_MODULE = "transformer_lab.inference.pipeline"
URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")  # runs:/, models:/, hf:NAME: looked up when the model loads


@dataclass(frozen=True)
class Option:
    """What one pipeline option accepts: a kind (int, float, bool, str choices), a range, and
    whether null is a value (null_means says what it means then)."""

    kind: type
    minimum: float | None = None   # inclusive
    above: float | None = None     # exclusive
    maximum: float | None = None   # inclusive
    choices: tuple[str, ...] = ()
    null_means: str | None = None
    note: str = ""

    def accepts(self, value) -> bool:
        if value is None:
            return self.null_means is not None
        if self.kind is bool or isinstance(value, bool):
            return self.kind is bool and isinstance(value, bool)
        if self.kind is str:
            return value in self.choices
        if not isinstance(value, int if self.kind is int else (int, float)):
            return False
        return ((self.minimum is None or value >= self.minimum) and (self.above is None or value > self.above)
                and (self.maximum is None or value <= self.maximum))

    def describe(self) -> str:
        if self.kind is str:
            return " or ".join(self.choices)
        kind = {int: "an integer", float: "a number", bool: "true or false"}[self.kind]
        if self.above is not None and self.maximum is not None:
            kind += f" in ({self.above}, {self.maximum}]"
        elif self.above is not None:
            kind += f" > {self.above}"
        elif self.minimum is not None:
            kind += f" >= {self.minimum}"
        return kind + (f", or null ({self.null_means})" if self.null_means else "") + self.note


# Every option a pipeline's `run` takes, by name: one meaning (and range) wherever it appears
OPTIONS = {
    "batch_size": Option(int, minimum=1),
    "top_k": Option(int, minimum=1, null_means="every label, or no cut"),
    "normalize": Option(bool),
    "doc_stride": Option(int, minimum=0, null_means="half a window"),
    "max_new_tokens": Option(int, minimum=1),
    "strategy": Option(str, choices=("greedy", "sample")),
    "temperature": Option(float, above=0, note=" (strategy=greedy takes the argmax)"),
    "top_p": Option(float, above=0, maximum=1, null_means="no nucleus cut"),
    "seed": Option(int, null_means="unseeded"),
    "stop_at_eos": Option(bool),
    "use_cache": Option(bool),
    "return_full_text": Option(bool),
    "num_beams": Option(int, minimum=1),
    "length_penalty": Option(float),
}


def check_option(name: str, value, rule: Option, prefix: str = "") -> None:
    if not rule.accepts(value):
        raise TransformerLabError(f"{prefix}{name}={value!r}: expected {rule.describe()}")


def check_options(task: str | None, options: dict, prefix: str = "") -> None:
    """Each option by name and range, before any model runs or input is read: a name that is no
    option of `task` is one error naming the task's options. task=None (the model's own task,
    not known before it loads): the values of the names any task takes. prefix: how the caller
    spells them (predict.py: options.)."""
    rules = task_options(task) if task is not None else OPTIONS
    for name, value in options.items():
        if name in rules:
            check_option(name, value, rules[name], prefix)
        elif task is not None:
            raise TransformerLabError(f"{prefix}{name}: not an option of {task}; its options: {', '.join(rules)}")


def check_model_source(model: str) -> None:
    """A model= that is a path (it has a `/`, or names a .ckpt) exists: else the line
    pipelines.model_path would give once torch has loaded. An MLflow run id or URI, hf:NAME and a
    published name (minilm) are looked up when the model loads."""
    if ("/" in model or model.endswith(".ckpt")) and not URI.match(model) and not Path(model).exists():
        raise TransformerLabError(f"model={model}: no such file or folder, MLflow run or published model")


def pipeline_tasks() -> list[str]:
    """The tasks pipelines.py has a pipeline for, in the order it defines them."""
    return list(_task_classes())


@functools.cache
def task_options(task: str) -> dict[str, Option]:
    """The options `task`'s pipeline takes, each with its rule: the keyword arguments of its `run`
    after the inputs, by the pipeline's own `rules` where it sets one, else by OPTIONS. What
    Pipeline.option_rules gives, without importing pipelines.py."""
    if task not in _task_classes():
        raise TransformerLabError(f"task={task}: not a pipeline task; choose one of {', '.join(pipeline_tasks())}")
    run = _inherited(_task_classes()[task], lambda cls: next(
        (s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "run"), None))
    rules = _inherited(_task_classes()[task], lambda cls: _class_value(cls, "rules"))
    own = {ast.literal_eval(key): _option(value) for key, value in zip(rules.keys, rules.values)} if rules else {}
    return {a.arg: own.get(a.arg) or OPTIONS[a.arg] for a in (run.args.args + run.args.kwonlyargs)[2:]}


@functools.cache
def _classes() -> dict[str, ast.ClassDef]:
    """pipelines.py's classes by name, from its source (finding it imports the package only)."""
    source = Path(importlib.util.find_spec(PIPELINES_MODULE).origin).read_text()
    return {node.name: node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)}


@functools.cache
def _task_classes() -> dict[str, ast.ClassDef]:
    """The classes that set a `task_name`, by it."""
    return {task: cls for cls in _classes().values() if (task := _class_value(cls, "task_name"))}


def _class_value(cls: ast.ClassDef, name: str):
    """What the class statement `name = ...` (or `name: T = ...`) of `cls` sets: the constant, or
    the expression when it is not one; None without such a statement."""
    for statement in cls.body:
        if isinstance(statement, ast.Assign):
            targets, value = statement.targets, statement.value
        elif isinstance(statement, ast.AnnAssign):
            targets, value = [statement.target], statement.value
        else:
            continue
        if value is not None and any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return value.value if isinstance(value, ast.Constant) else value
    return None


def _inherited(cls: ast.ClassDef, find):
    """find(cls), else what it finds in the first base of `cls` that pipelines.py defines, and so on
    (the pipelines derive from Pipeline alone)."""
    found = find(cls)
    bases = [_classes()[b.id] for b in cls.bases if isinstance(b, ast.Name) and b.id in _classes()]
    return found if found is not None or not bases else _inherited(bases[0], find)


def _option(node: ast.expr) -> Option:
    """An `Option(kind, setting=constant, ...)` of pipelines.py's source."""
    kinds = {"int": int, "float": float, "bool": bool, "str": str}
    if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Option"):
        raise ValueError(f"{PIPELINES_MODULE}: a rule that is not Option(...): {ast.unparse(node)}")
    return Option(*(kinds[a.id] if isinstance(a, ast.Name) else ast.literal_eval(a) for a in node.args),
                  **{k.arg: ast.literal_eval(k.value) for k in node.keywords})
