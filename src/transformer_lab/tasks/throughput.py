"""Tokens per second for the pre-training tasks, logged every step."""

from __future__ import annotations

import time


class TokenThroughput:
    """A LightningModule mixin: `log_throughput(n_tokens)` in training_step logs train/tokens_per_s
    (over the epoch so far)."""

    _epoch_start: float = 0.0
    _epoch_tokens: int = 0

    def on_train_epoch_start(self) -> None:
        self._epoch_start, self._epoch_tokens = time.perf_counter(), 0

    def log_throughput(self, n_tokens: int) -> None:
        self._epoch_tokens += n_tokens
        self.log("train/tokens_per_s", self._epoch_tokens / (time.perf_counter() - self._epoch_start),
                 on_step=True, on_epoch=False)
