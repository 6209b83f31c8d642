"""In-context learning, GPT-3 style: `python pipelines/few_shot.py model=MODEL task=sst2 shots=0,1,4,16`
(--help for more). Accuracy per K to few_shot.json in the run's folder and to MLflow."""


import sys  # noqa: E402

import _project  # noqa: E402

_project.bootstrap()  # the project root, its own Python, the warm interpreter
import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from transformer_lab.utils.cli import entry_point, rename_overrides, run  # noqa: E402

# model= and task= name the language model and the prompted task, but conf/ has model/ and task/
# groups: in the config they are model_source and the few_shot_task group
sys.argv = rename_overrides(sys.argv, {"model": "model_source", "task": "few_shot_task"})
if not {"-m", "--multirun"} & set(sys.argv):  # shots=0,1,4 is one list here, not a sweep
    sys.argv = [f"shots=[{a[6:]}]" if a.startswith("shots=") and not a.startswith("shots=[") else a
                for a in sys.argv]


@hydra.main(version_base="1.3", config_path="../conf", config_name="few_shot")
@entry_point
def main(cfg: DictConfig) -> None:
    # imported here, not at the top: --help and a config Hydra rejects answer before torch loads
    from transformer_lab.evaluation.few_shot import evaluate

    result = evaluate(cfg)
    for k, accuracy in result["accuracy_by_shots"].items():
        print(f"{result['task']} {k:>3}-shot accuracy {accuracy:.4f}")
    print(f"majority label {result['majority']:.4f}, {result['examples']} queries, {result['seconds']} s; "
          f"wrote {cfg.out}")


if __name__ == "__main__":
    run(main)
