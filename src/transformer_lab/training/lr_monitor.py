"""The learning rate of every family, logged one way: Lightning's LearningRateMonitor."""

from __future__ import annotations

from lightning.pytorch.callbacks import LearningRateMonitor as LightningLearningRateMonitor


class LearningRateMonitor(LightningLearningRateMonitor):
    """Lightning's monitor, with one curve per schedule and none without a logger. The optimisers
    here give their parameter groups (matrices with weight decay; biases and gains without) one
    rate, which Lightning would log once per group (`train/lr/pg1`, `train/lr/pg2`); it is logged
    once, as `train/lr`, unless the groups' rates differ. A run without a logger (logger=none)
    has nothing to log into, where Lightning's monitor would refuse to start."""

    def on_train_start(self, trainer, *args, **kwargs) -> None:
        if trainer.loggers:
            super().on_train_start(trainer, *args, **kwargs)

    def on_train_batch_start(self, trainer, *args, **kwargs) -> None:
        if trainer.loggers:
            super().on_train_batch_start(trainer, *args, **kwargs)

    def on_train_epoch_start(self, trainer, *args, **kwargs) -> None:
        if trainer.loggers:
            super().on_train_epoch_start(trainer, *args, **kwargs)

    def _extract_stats(self, trainer, interval: str) -> dict[str, float]:
        stats = super()._extract_stats(trainer, interval)
        merged: dict[str, float] = {}
        for key, value in stats.items():
            schedule, _, group = key.rpartition("/pg")
            if not (schedule and group.isdigit()):
                merged[key] = value
            elif merged.setdefault(schedule, value) != value:
                return stats  # groups at different rates: a curve each
        return merged
