"""Generate text with a trained GPT:

    python pipelines/generate.py prompt="KING RICHARD:" max_new_tokens=200 strategy=sample \
        temperature=0.8 top_k=40 top_p=0.95 seed=1 [checkpoint=...ckpt]

The checkpoint holds the tokenizer it was trained with.
"""


import sys  # noqa: E402

import _project  # noqa: E402

_project.bootstrap()  # the project root, its own Python, the warm interpreter
import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from transformer_lab.inference.generate import check_settings, generate  # noqa: E402  (torch loads in generate())
from transformer_lab.utils.cli import lightning_logs_through_hydra, entry_point, run  # noqa: E402
from transformer_lab.utils.overrides import quote_free_text  # noqa: E402
from transformer_lab.utils.validate import check_inputs  # noqa: E402

sys.argv = quote_free_text(sys.argv, ("prompt",))  # commas, brackets, emoji: as typed


@hydra.main(version_base="1.3", config_path="../conf", config_name="generate")
@entry_point
def main(cfg: DictConfig) -> None:
    check_settings(cfg)  # a bad setting or a missing checkpoint: one line, before torch loads
    check_inputs(cfg, "checkpoint")
    lightning_logs_through_hydra()

    result = generate(cfg)
    for index, sample in enumerate(result["samples"]):
        print(f"--- sample {index} ---\n{cfg.prompt}{sample}")
    print(f"{result['new_tokens']} tokens at {result['tokens_per_s']:.0f} tokens/s")


if __name__ == "__main__":
    run(main)  # a failed DVC stage keeps its previous outputs
