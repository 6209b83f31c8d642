"""Evaluation of trained models, one module per family; their scores go into the training run
they score (tracking/evaluations.py)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from transformer_lab.utils.io import atomic_write_text


def write_csv(path: Path, rows: list[dict]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())
