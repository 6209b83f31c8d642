"""Write a trained model as a Hugging Face folder that `transformers` loads (see --help)."""


import _project  # noqa: E402,F401  (PROJECT_ROOT; the project's own Python)

import sys  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from transformer_lab.utils.cli import pipeline, rename_overrides, run  # noqa: E402

# model= names what to export, but conf/ has a model/ group: in the config it is model_source
sys.argv = rename_overrides(sys.argv, {"model": "model_source"})


@hydra.main(version_base="1.3", config_path="../conf", config_name="export")
@pipeline
def main(cfg: DictConfig) -> None:
    from transformer_lab.errors import TransformerLabError
    from transformer_lab.export import export_hf
    from transformer_lab.pipelines import load_model

    if cfg.format != "hf":
        raise TransformerLabError(f"format={cfg.format}: only hf (a Hugging Face folder) is written")
    loaded = load_model(str(cfg.model_source), cfg.get("tracking_uri"))
    folder = export_hf(loaded, cfg.out)
    print(f"{loaded.family} -> {folder} ({', '.join(sorted(p.name for p in folder.iterdir()))})")


if __name__ == "__main__":
    run(main)
