"""What a study measures besides its score, as one Lightning callback added to a study's training
runs (`callbacks.study_probes`):

- always, the validation curve: step, seconds since training started and every validation metric
  at each validation (a loss against steps *and* against seconds);
- `attention_at_init`: on the first training batch, before any step, each attention layer's
  softmax entropy (in nats, over the real keys), the share of saturated rows (largest weight at
  least 0.99: nearly one-hot, where the softmax passes almost no gradient) and the norm of the loss's
  gradient with respect to the scores, dL/ds = w * (dL/dw - sum(w * dL/dw)), exact from the weights;
- `gradients_at_init`: the gradient norm of each block's parameters on that batch;
- `expert_load`: after training, the share of tokens each expert of every mixture-of-experts
  layer took on the last validation batch.

Probes at initialisation run in eval mode (no dropout), under a forked random state with the
samplers' own generators put back, and leave no gradient behind: a run with probes trains on the
same batches from the same weights as one without (tests/test_studies.py).
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import lightning as L
import torch
from torch import nn

from transformer_lab.models.attention import MultiHeadAttention
from transformer_lab.models.blocks import MixtureOfExperts, TransformerBlock
from transformer_lab.utils.io import atomic_write_json

PROBES_FILE = "study_probes.json"
SATURATED = 0.99  # a row whose largest weight reaches this is nearly one-hot
PROBE_NAMES = ("attention_at_init", "gradients_at_init", "expert_load")


@contextlib.contextmanager
def silent_logging(task: L.LightningModule):
    """A task's training_step, called outside the training loop, logs nothing."""
    names = [name for name in ("log", "log_dict", "log_throughput") if hasattr(task, name)]
    for name in names:
        setattr(task, name, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        for name in names:
            delattr(task, name)  # the class's methods again


@contextlib.contextmanager
def captured_attention(model: nn.Module):
    """Every attention module returns its softmax weights, kept with their gradient: yields the
    list the weights of each call are appended to."""
    captured: list[torch.Tensor] = []

    def ask_for_weights(module, args, kwargs):
        return args, {**kwargs, "return_weights": True}

    def keep(module, args, kwargs, output):
        weights = output[1]
        if weights is not None and weights.requires_grad:
            weights.retain_grad()
            captured.append(weights)

    handles = []
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            handles.append(module.register_forward_pre_hook(ask_for_weights, with_kwargs=True))
            handles.append(module.register_forward_hook(keep, with_kwargs=True))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def attention_statistics(weights: list[torch.Tensor]) -> dict[str, float]:
    """Entropy, saturated rows and the scores' gradient norm over every layer's weights (batch,
    heads, queries, keys), once the loss has been back-propagated through them."""
    entropies, saturated, gradient_norms = [], [], []
    for w in weights:
        w = w.detach().float()
        entropy = -(w * torch.log(w.clamp_min(1e-30))).sum(-1)  # masked keys have weight 0
        rows = w.sum(-1) > 0.5  # real rows (a fully masked row sums to 0)
        entropies.append(entropy[rows].mean().item())
        saturated.append((w.amax(-1)[rows] >= SATURATED).float().mean().item())
    for w in weights:
        if w.grad is None:
            continue
        g, wd = w.grad.float(), w.detach().float()
        score_grad = wd * (g - (wd * g).sum(-1, keepdim=True))
        gradient_norms.append(score_grad.norm().item())
    stats = {"init/attention_entropy": sum(entropies) / len(entropies),
             "init/saturated_rows": sum(saturated) / len(saturated)}
    if gradient_norms:
        stats["init/score_grad_norm"] = sum(gradient_norms) / len(gradient_norms)
    return stats


def finite_or_none(value: float) -> float | None:
    """JSON has no NaN: a value that is not finite is recorded as null."""
    return value if math.isfinite(value) else None


def sampler_generators(loader) -> list[torch.Generator]:
    """The random generators of a data loader's samplers (a sampler with its own torch.Generator
    is not covered by fork_rng, which forks torch's global one)."""
    found = []
    for sampler in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        generator = getattr(sampler, "generator", None)
        if isinstance(generator, torch.Generator) and generator not in found:
            found.append(generator)
    return found


def transformer_blocks(model: nn.Module) -> list[TransformerBlock]:
    return [module for module in model.modules() if isinstance(module, TransformerBlock)]


class StudyProbes(L.Callback):
    def __init__(self, probes: list[str] | None = None, path: str = PROBES_FILE):
        unknown = sorted(set(probes or []) - set(PROBE_NAMES))
        if unknown:
            raise ValueError(f"study.probes: unknown {', '.join(unknown)}; known: {', '.join(PROBE_NAMES)}")
        self.probes = list(probes or [])
        self.path = Path(path)
        self.record: dict = {"curve": []}
        self.started: float | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if {"attention_at_init", "gradients_at_init"} & set(self.probes):
            self.record.update(self.at_initialisation(trainer, pl_module))
        self.started = time.perf_counter()

    def at_initialisation(self, trainer: L.Trainer, task: L.LightningModule) -> dict[str, float]:
        modes = {module: module.training for module in task.modules()}  # a frozen part stays in eval
        loader = trainer.train_dataloader
        generators = sampler_generators(loader)
        states = [generator.get_state() for generator in generators]
        with torch.random.fork_rng(devices=[]):
            batch = next(iter(loader))
            batch = task.transfer_batch_to_device(batch, task.device, 0)
            task.eval()
            try:
                with captured_attention(task) as weights, silent_logging(task), torch.enable_grad():
                    loss = task.training_step(batch, 0)
                    loss = loss["loss"] if isinstance(loss, dict) else loss
                    loss.backward()
                stats = {"init/loss": loss.item()}
                if "attention_at_init" in self.probes and weights:
                    stats.update(attention_statistics(weights))
                if "gradients_at_init" in self.probes:
                    for index, block in enumerate(transformer_blocks(task)):
                        grads = [p.grad.norm() ** 2 for p in block.parameters() if p.grad is not None]
                        stats[f"init/grad_norm_block_{index}"] = float(torch.stack(grads).sum().sqrt()) if grads else 0.0
            finally:
                task.zero_grad(set_to_none=True)
                for module, training in modes.items():
                    module.training = training
                for generator, state in zip(generators, states):
                    generator.set_state(state)  # the batch drawn here is drawn again by training
        return {name: finite_or_none(value) for name, value in stats.items()}

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self.started is None:
            return
        point = {"step": trainer.global_step, "seconds": round(time.perf_counter() - self.started, 3)}
        point.update({name: finite_or_none(float(value)) for name, value in trainer.callback_metrics.items()
                      if name.startswith("val/") and value.numel() == 1})
        self.record["curve"].append(point)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if "expert_load" in self.probes:
            loads = []
            for module in pl_module.modules():
                if isinstance(module, MixtureOfExperts) and module.last_choice is not None:
                    counts = torch.bincount(module.last_choice.flatten(), minlength=len(module.experts)).float()
                    loads.append(sorted((counts / counts.sum()).tolist(), reverse=True))
            if loads:
                self.record["expert_load"] = [sum(column) / len(loads) for column in zip(*loads)]
                self.record["expert_load_max"] = max(max(load) for load in loads)
        if trainer.is_global_zero:
            atomic_write_json(Path(trainer.default_root_dir) / self.path, self.record)
