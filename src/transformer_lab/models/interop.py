"""Parameter-name tables for converting to and from Hugging Face `transformers` checkpoints."""

from __future__ import annotations

import re


def rename(name: str, table: list[tuple[str, str]]) -> str | None:
    """The first (source, target) prefix pair of `table` that matches `name`, applied; None if
    none does. "{i}" in a pair stands for a layer number."""
    for source, target in table:
        match = re.match("^" + re.escape(source).replace(r"\{i\}", r"(\d+)"), name)
        if match:
            filled = target.replace("{i}", match.group(1)) if match.groups() else target
            return filled + name[match.end():]
    return None


class WeightsUnavailable(OSError):
    """Published weights that could not be loaded (offline, or no such name); the task that asked
    for them reports it as the user's error (tasks/pretrained.py)."""
