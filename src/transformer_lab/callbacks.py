"""Lightning callbacks of this project."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import lightning as L

from transformer_lab.utils.io import atomic_write_text


class MetricsHistory(L.Callback):
    """Appends each training epoch's logged metrics (train and validation) to a CSV, a DVC plot, on rank 0."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.rows: list[dict] = []

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        row = {"epoch": trainer.current_epoch, "step": trainer.global_step}
        for name, value in sorted(trainer.callback_metrics.items()):
            if value.numel() == 1 and not name.endswith("_step"):
                row[name.removesuffix("_epoch")] = round(float(value), 6)
        self.rows.append(row)
        columns = list(dict.fromkeys(k for r in self.rows for k in r))
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, columns, restval=math.nan)
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write_text(self.path, buffer.getvalue())

    def state_dict(self) -> dict:
        return {"rows": self.rows}

    def load_state_dict(self, state_dict: dict) -> None:
        self.rows = list(state_dict.get("rows", []))
