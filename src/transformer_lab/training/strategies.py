"""Lightning strategies with what the project's training needs and Lightning lacks."""

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.plugins.precision.fsdp import FSDPPrecision
from lightning.pytorch.strategies import FSDPStrategy as LightningFSDPStrategy
from torch.distributed.fsdp import FullyShardedDataParallel


class NormClippingFSDPPrecision(FSDPPrecision):
    """FSDP precision that clips by the global gradient norm (the project's default,
    `trainer.gradient_clip_val`). Each rank holds a shard of the gradients, so the norm has to come
    from the root FSDP module (`torch.nn.utils.clip_grad_norm_` would clip each shard by its own);
    Lightning's plugin has no reference to that module and refuses."""

    def __init__(self, precision: Any, scaler: Any = None, module: FullyShardedDataParallel | None = None):
        super().__init__(precision, scaler)
        self.module = module

    def clip_grad_by_norm(self, optimizer: Any, clip_val: float) -> None:
        self.module.clip_grad_norm_(clip_val)


class FSDPStrategy(LightningFSDPStrategy):
    """Lightning's FSDPStrategy, with gradient clipping by norm (see NormClippingFSDPPrecision)."""

    def setup(self, trainer: "pl.Trainer") -> None:
        super().setup(trainer)
        if isinstance(self.model, FullyShardedDataParallel):
            plugin = self.precision_plugin
            self.precision_plugin = NormClippingFSDPPrecision(plugin.precision, plugin.scaler, self.model)
