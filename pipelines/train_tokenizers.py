"""Train the WordPiece, byte-level BPE and character tokenizers on the prepared corpus and
encode it: `python pipelines/train_tokenizers.py [tokenizers.bpe.vocab_size=16000]`."""

import json

import _project  # noqa: E402

_project.bootstrap()  # the project root, its own Python, the warm interpreter
import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from transformer_lab.utils.cli import lightning_logs_through_hydra, entry_point, run  # noqa: E402
from transformer_lab.utils.validate import check_inputs  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="train_tokenizers")
@entry_point
def main(cfg: DictConfig) -> None:
    check_inputs(cfg, "data.prepared_dir")  # a missing input: one line, before torch loads
    # imported here, not at the top: --help and a rejected config answer before torch loads
    from transformer_lab.data.tokenizers import prepare_tokenizers
    lightning_logs_through_hydra()

    summary = prepare_tokenizers(cfg.data.prepared_dir, cfg.output_dir, OmegaConf.to_container(cfg.tokenizers))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    run(main)  # a failed DVC stage keeps its previous outputs
