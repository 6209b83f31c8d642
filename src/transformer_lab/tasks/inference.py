"""How every task predicts: a `predict` method wrapped in `@inference`.

    @inference
    def predict(self, inputs, batch_size=256):
        ...  # encode, run the model batch_size rows at a time, decode

The decorator, not each method, owns the bookkeeping that is easy to get wrong: no autograd
graph, no dropout, and the module handed back in the mode it came in, so that predicting in the
middle of training (a callback, a notebook) neither changes the training run nor the predictions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import torch
from torch import nn


def inference(method: Callable) -> Callable:
    """Run a module's method under torch.no_grad() with every submodule in eval mode, and put
    each submodule back in its own earlier mode afterwards, also when the method raises.

    Per submodule rather than one `train(was_training)`: a module may hold parts in eval mode on
    purpose (a frozen body), and a blanket train() would switch them back on. Only the flags of
    the submodules in training mode are switched (the tasks' own train() overrides differ from
    eval() only in what they keep in eval mode): for a loaded model, already in eval mode, that
    is none, where eval() and a restore of every mode cost 1.5 ms a call on a 6-layer BERT task."""

    @functools.wraps(method)
    def wrapper(self: nn.Module, *args, **kwargs):
        training = [module for module in self.modules() if module.training]
        for module in training:
            module.training = False
        try:
            with torch.no_grad():
                return method(self, *args, **kwargs)
        finally:
            for module in training:
                module.training = True

    return wrapper


def batches(batch: dict, batch_size: int, device: torch.device) -> Iterator[dict]:
    """An encoded batch (a dict of equally long tensors or lists) in slices of batch_size rows,
    tensors moved to `device`."""
    rows = len(next(iter(batch.values())))
    for start in range(0, rows, batch_size):
        yield {key: value[start:start + batch_size].to(device) if torch.is_tensor(value)
               else value[start:start + batch_size] for key, value in batch.items()}
