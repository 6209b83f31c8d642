"""Learning-rate schedules shared by the tasks."""

from __future__ import annotations

import math

import torch


def warmup_cosine(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int, min_ratio: float = 0.0):
    """Linear warm-up from 0 to the base rate, then cosine decay to min_ratio × base rate."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def warmup_linear(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int):
    """BERT's schedule: linear warm-up from 0 to the base rate, then linear decay to 0."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def warmup_constant(optimizer: torch.optim.Optimizer, warmup_steps: int):
    """Linear warm-up from 0 to the base rate, then the base rate until training stops: the
    FT-Transformer paper's schedule, where early stopping rather than a horizon ends training."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / max(1, warmup_steps)))


def warmup_inverse_sqrt(optimizer: torch.optim.Optimizer, warmup_steps: int):
    """The 2017 Transformer's schedule (section 5.3): linear warm-up, then decay with the inverse
    square root of the step. Here the base rate is the peak, reached at warmup_steps; the paper's
    d_model^-0.5 x min(step^-0.5, step x warmup^-1.5) is base rate = (d_model x warmup)^-0.5
    (7.0e-4 for the base model's 512 and 4,000 steps)."""

    def factor(step: int) -> float:
        step += 1
        return min(step / warmup_steps, (warmup_steps / step) ** 0.5)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def decay_groups(module: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only; biases, LayerNorm gains and embeddings' padding rows are left alone
    (as in nanoGPT and BERT)."""
    params = [p for p in module.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def adamw_with_warmup(module: torch.nn.Module, lr: float, weight_decay: float, total_steps: int,
                      warmup_steps: int, betas: tuple[float, float] = (0.9, 0.999), decay: str = "linear",
                      min_ratio: float = 0.0, eps: float = 1e-8, trainer=None) -> dict:
    """AdamW with decay on matrices only, linear warm-up, then linear decay to 0 (BERT), cosine
    decay to min_ratio × lr (GPT), inverse-square-root decay (the 2017 Transformer) or a constant
    rate (tables, with early stopping), stepped
    every optimiser step; as configure_optimizers returns it. trainer: the Lightning trainer, whose
    precision and gradient clipping decide whether the fused kernel may be used."""
    groups = decay_groups(module, weight_decay)
    # the fused kernel updates every tensor in one pass (about 3x faster than the per-tensor loop on CPU)
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for g in groups for p in g["params"])
    if trainer is not None and trainer.gradient_clip_val and "mixed" in str(trainer.precision):
        # Lightning refuses to clip gradients under mixed precision for an optimizer that unscales
        # them inside its own step, as the fused one does
        fused = False
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused)
    if decay == "linear":
        scheduler = warmup_linear(optimizer, total_steps, warmup_steps)
    elif decay == "cosine":
        scheduler = warmup_cosine(optimizer, total_steps, warmup_steps, min_ratio)
    elif decay == "inverse_sqrt":
        scheduler = warmup_inverse_sqrt(optimizer, warmup_steps)
    elif decay == "constant":
        scheduler = warmup_constant(optimizer, warmup_steps)
    else:
        raise ValueError(f"decay={decay!r}; expected 'linear', 'cosine', 'inverse_sqrt' or 'constant'")
    return {"optimizer": optimizer, "lr_scheduler": scheduled(scheduler)}


LEARNING_RATE = "train/lr"  # the metric of every family's rate (Lightning's LearningRateMonitor, conf/callbacks)


def scheduled(scheduler) -> dict:
    """A schedule as configure_optimizers returns it: stepped every optimiser step, its rate logged
    as LEARNING_RATE in every family."""
    return {"scheduler": scheduler, "interval": "step", "name": LEARNING_RATE}


def adamw_warmup_linear(module: torch.nn.Module, lr: float, weight_decay: float, warmup_ratio: float,
                        total_steps: int, betas: tuple[float, float] = (0.9, 0.999), trainer=None) -> dict:
    """BERT's optimiser: warm-up over warmup_ratio of the steps, then linear decay."""
    return adamw_with_warmup(module, lr, weight_decay, total_steps, int(warmup_ratio * total_steps), betas,
                             trainer=trainer)
