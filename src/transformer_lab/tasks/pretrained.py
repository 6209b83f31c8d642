"""Starting a fine-tuning model from pre-trained weights (a pre-training stage's checkpoint or
published weights), and how much of the pre-trained body then trains (`freeze`)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from transformer_lab.errors import TransformerLabError
from transformer_lab.models.interop import WeightsUnavailable
from transformer_lab.tasks.checkpoints import read_checkpoint

FREEZE = ("none", "embeddings", "encoder")



def load_pretrained(module: nn.Module, source: str | None, *, prefix: str, stage: str, hub_example: str,
                    is_published: Callable[[str], bool], from_published: Callable[[str], dict]) -> None:
    """Copy pre-trained weights into `module` (a model's body: embeddings and blocks).

    source: None (keep the random initialisation), published weights (is_published(source);
    from_published(source) gives the body's state dict), or a checkpoint of the pre-training task
    whose parameters for this body start with `prefix`. Sizes and vocabulary must match; a mismatch
    is one clear error.
    """
    if not source:
        return
    if is_published(source):
        try:
            state = from_published(source)
        except WeightsUnavailable as err:  # offline, or no such name: the user's setting, one line
            raise TransformerLabError(f"task.pretrained={source}: {err}") from None
    else:
        checkpoint = read_checkpoint(source, f"run `dvc repro {stage}` or set task.pretrained=null "
                                             f"(random start) or {hub_example}")
        state = {k[len(prefix):]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    ours = module.state_dict()
    mismatched = [f"{k} {tuple(v.shape)} vs {tuple(ours[k].shape)}" for k, v in state.items()
                  if k in ours and v.shape != ours[k].shape]
    if mismatched or set(state) != set(ours):
        detail = mismatched[0] if mismatched else f"missing {sorted(set(ours) - set(state))[:3]}"
        raise TransformerLabError(f"{source}: does not fit this model ({detail}); use the model size and "
                                  "tokenizer it was pre-trained with")
    module.load_state_dict(state)


class FrozenBody:
    """Mixin for a task whose model has a pre-trained BERT body: `task.freeze` fixes part of it.

    none: full fine-tuning. embeddings: the embedding layer stays fixed. encoder: embeddings and every
    block stay fixed (the body is a feature extractor under a trained pooler and head: the
    feature-based use of the BERT paper's section 5.3, or a probe). Frozen parameters get no gradient,
    so the optimiser (schedules.decay_groups) leaves them out, and frozen parts run in eval mode (no
    dropout in fixed features) even while the rest trains."""

    frozen: tuple[nn.Module, ...] = ()

    def freeze_body(self, body: nn.Module | None, what: str) -> None:
        if what not in FREEZE:
            raise TransformerLabError(f"task.freeze={what!r}; expected one of {', '.join(FREEZE)}")
        if what != "none" and body is None:
            raise TransformerLabError(f"task.freeze={what}: only the BERT tasks freeze a pre-trained body")
        self.frozen = {"none": (), "embeddings": (body.embeddings,),
                       "encoder": (body.embeddings, *body.blocks)}[what] if body is not None else ()
        for part in self.frozen:
            part.requires_grad_(False)
        self.train(self.training)

    def train(self, mode: bool = True):
        super().train(mode)
        for part in self.frozen:
            part.eval()
        return self
