"""Write a trained model as a Hugging Face folder that `transformers` loads (see --help)."""


import sys  # noqa: E402

import _project  # noqa: E402

_project.bootstrap()  # the project root, its own Python, the warm interpreter
import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from transformer_lab.errors import TransformerLabError  # noqa: E402
from transformer_lab.inference.export import check_out_is_a_folder, export_hf  # noqa: E402  (torch loads in export_hf)
from transformer_lab.inference.options import check_model_source  # noqa: E402
from transformer_lab.utils.cli import entry_point, rename_overrides, run  # noqa: E402

# model= names what to export, but conf/ has a model/ group: in the config it is model_source
sys.argv = rename_overrides(sys.argv, {"model": "model_source"})


@hydra.main(version_base="1.3", config_path="../conf", config_name="export")
@entry_point
def main(cfg: DictConfig) -> None:
    # what needs no model, one line before torch loads: the format, model= and out=
    if cfg.format != "hf":
        raise TransformerLabError(f"format={cfg.format}: only hf (a Hugging Face folder) is written")
    if OmegaConf.is_missing(cfg, "model_source"):
        raise TransformerLabError("model= is required: a .ckpt, a stage's folder, runs:/ID or models:/NAME@ALIAS")
    check_model_source(str(cfg.model_source))
    check_out_is_a_folder(cfg.out)  # out= missing: "out is required"
    from transformer_lab.inference.pipeline import load_model

    loaded = load_model(str(cfg.model_source), cfg.get("tracking_uri"))
    folder = export_hf(loaded, cfg.out)
    print(f"{loaded.family} -> {folder} ({', '.join(sorted(p.name for p in folder.iterdir()))})")


if __name__ == "__main__":
    run(main)
