"""Config values checked at the edge: a wrong type is one line naming the key, before anything is built."""

from __future__ import annotations

import dataclasses
import types
import typing

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from transformer_lab.errors import TransformerLabError

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
    (a dataclass field or an `__init__` argument): `model.n_heads=abc` stops here, not deep inside."""
    target = get_object(node._target_) if "_target_" in node else None
    if target is None:
        return
    try:
        hints = typing.get_type_hints(target if dataclasses.is_dataclass(target) else target.__init__)
    except (NameError, TypeError):
        return
    for key in node:
        if key.startswith("_") or key not in hints or OmegaConf.is_missing(node, key):
            continue
        value = node[key]
        if isinstance(value, DictConfig) or OmegaConf.is_list(value):
            continue
        check_value(f"{where}.{key}", value, hints[key])
