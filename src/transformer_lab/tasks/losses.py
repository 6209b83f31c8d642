"""Cross-entropy over a large vocabulary, with a backward that allocates nothing as large as the logits.

`F.cross_entropy` is log-softmax then NLL: its backward writes a full-size zero tensor with
-1/N at the targets, then log-softmax's backward reads that and the saved log-probabilities
and writes the gradient. The gradient is simply softmax - one-hot, scaled: here it is made in
place from the saved log-probabilities (exp, subtract 1 at the targets, scale), so the
backward allocates nothing new, where torch's allocates and fills two tensors as large as the
logits (positions x vocabulary: in a small GPT the largest of the step).
`benchmarks/throughput.py --loss torch|project` measures the difference. The loss is the same
value; the gradient agrees to rounding.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from transformer_lab.data.bert import IGNORE_INDEX


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
        # bf16/fp16 logits (autocast) upcast to fp32, as F.cross_entropy under autocast
        log_probs = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        kept = targets != ignore_index
        safe_targets = targets.where(kept, 0)
        picked = log_probs.gather(1, safe_targets[:, None]).squeeze(1)
        count = kept.sum()
        ctx.save_for_backward(log_probs, safe_targets, kept, count)  # a second backward fails on their version
        ctx.logits_dtype = logits.dtype
        return -(picked * kept).sum() / count  # nan when every target is ignored, as F.cross_entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss: torch.Tensor):
        log_probs, safe_targets, kept, count = ctx.saved_tensors
        grad = log_probs.exp_()  # softmax, in the saved buffer: nothing else reads it
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
