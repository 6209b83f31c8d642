"""Checks that the data sources share, each failing as one DataError that says what is wrong."""

from __future__ import annotations

from pathlib import Path

from transformer_lab.errors import DataError


def require_file(path: str | Path, expected: str, missing: str = "file not found", setting: str = "") -> Path:
    """`path` as a Path when it is a file. A directory there is "PATH: is a directory, expected
    <expected>", nothing there "PATH: <missing>"; `setting` (the option that named the path) is
    added in parentheses to both."""
    path = Path(path)
    where = f" ({setting})" if setting else ""
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected {expected}{where}")
    if not path.is_file():
        raise DataError(f"{path}: {missing}{where}")
    return path


def require_two_classes(source: str, what: str, classes) -> None:
    """A classifier needs two classes or more: `what` (e.g. "target column 'y'") with one names it."""
    classes = sorted(map(str, classes))
    if len(classes) == 1:
        raise DataError(f"{source}: {what} has one class ({classes[0]!r}): a classifier needs at least 2")
    if not classes:
        raise DataError(f"{source}: {what} has no classes: a classifier needs at least 2")
