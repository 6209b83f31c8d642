"""Starting a fine-tuning model from pre-trained weights: a pre-training stage's checkpoint or
published weights from the Hugging Face hub ("hf:NAME")."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from transformer_lab.checkpoints import read_checkpoint
from transformer_lab.errors import TransformerLabError

HUB_PREFIX = "hf:"


def load_pretrained(module: nn.Module, source: str | None, *, prefix: str, from_hub: Callable[[str], dict],
                    stage: str, hub_example: str) -> None:
    """Copy pre-trained weights into `module` (a model's body: embeddings and blocks).

    source: None (keep the random initialisation), a checkpoint of the pre-training task whose
    parameters for this body start with `prefix`, or "hf:NAME" (from_hub(NAME) gives the
    body's state dict). Sizes and vocabulary must match; a mismatch is one clear error.
    """
    if not source:
        return
    if source.startswith(HUB_PREFIX):
        state = from_hub(source[len(HUB_PREFIX):])
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
