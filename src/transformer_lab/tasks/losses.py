"""Cross-entropy over a large vocabulary, with a backward that allocates nothing as large as the logits.

`F.cross_entropy` is log-softmax then NLL: its backward writes a full-size zero tensor with
-1/N at the targets, then log-softmax's backward reads that and the saved log-probabilities
and writes the gradient. The gradient is simply softmax - one-hot, scaled: here the forward
keeps the softmax itself, and the backward makes the gradient from it in place (subtract 1 at
the targets, scale), so it allocates nothing new and takes no exponential: torch's allocates
and fills two tensors as large as the logits (positions x vocabulary: in a small GPT the
largest of the step), and exponentiating saved log-probabilities would cost a pass as long
as the softmax. The loss reads log p only at the targets; where a target's probability is
below float32's normal range (a loss over 87 nats), that row's log-probability comes from
log-softmax instead, so the value stays exact.
`benchmarks/throughput.py --loss torch|project` measures the difference. The loss is the same
value to rounding; the gradient agrees to rounding.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from transformer_lab.data.bert import IGNORE_INDEX


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
        ctx.logits_dtype = logits.dtype  # bf16/fp16 (autocast) upcast to fp32, as F.cross_entropy under autocast
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        probs = torch.softmax(logits, dim=-1)
        kept = targets != ignore_index
        safe_targets = targets.where(kept, 0)
        picked = probs.gather(1, safe_targets[:, None]).squeeze(1)
        log_picked = picked.log()
        lost = (picked < torch.finfo(picked.dtype).tiny).nonzero().squeeze(1)  # log p would lose digits or be -inf
        if len(lost):
            log_picked[lost] = torch.log_softmax(logits[lost], dim=-1).gather(1, safe_targets[lost, None]).squeeze(1)
        count = kept.sum()
        ctx.save_for_backward(probs, safe_targets, kept, count)  # a second backward fails on their version
        return -(log_picked * kept).sum() / count  # nan when every target is ignored, as F.cross_entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss: torch.Tensor):
        probs, safe_targets, kept, count = ctx.saved_tensors
        grad = probs  # the saved softmax becomes the gradient: nothing else reads it
        grad[torch.arange(len(safe_targets), device=grad.device), safe_targets] -= 1
        grad.mul_(kept[:, None] * (grad_loss / count))  # ignored rows get no gradient
        return grad.to(ctx.logits_dtype), None, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Mean cross-entropy of `logits` (n, classes) against `targets` (n,), as
    `F.cross_entropy(logits, targets, ignore_index=ignore_index)`, with a cheaper backward.
    One backward per forward (the saved buffer becomes the gradient)."""
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"logits (n, classes) and targets (n,) expected, got {tuple(logits.shape)} and "
                         f"{tuple(targets.shape)}")
    return _CrossEntropy.apply(logits, targets, ignore_index)
