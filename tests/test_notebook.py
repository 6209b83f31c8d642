"""The notebooks execute against real runs: compare_runs in a real MLflow store, use_trained_models
and attention on smoke-sized trained models."""

import json

import nbformat
import pytest
from conftest import ROOT
from nbclient import NotebookClient
from test_experiments import tiny_data_dir  # noqa: F401  (the fixture: tiny copies of the prepared data)
from test_train import train_run

pytestmark = pytest.mark.slow


def test_compare_runs_notebook_executes(tmp_path, smoke_overrides):
    for heads in (1, 2):
        train_run([*smoke_overrides, f"model.n_heads={heads}"], tmp_path / f"run{heads}")
    notebook = nbformat.read(ROOT / "notebooks" / "compare_runs.ipynb", as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert "2 runs in experiment 'atis'" in text
    assert "val/slot_f1 (higher is better)" in text  # the metric the runs were selected on, not a fixed one
    tables = [o["data"]["text/plain"] for o in outputs if "data" in o and "text/plain" in o["data"]]
    assert any("model.n_heads" in t for t in tables)
    assert any("image/png" in o.get("data", {}) for o in outputs)


@pytest.fixture(scope="module")
def smoke_models(tiny_data_dir, tmp_path_factory) -> dict[str, str]:
    """The models the two notebooks read, each a real smoke-sized training run (debug=smoke)."""
    from omegaconf import open_dict

    from transformer_lab.training.train import train
    from transformer_lab.runtime.config import compose_config

    root = tmp_path_factory.mktemp("notebook_models")
    runs = {"sentiment": "bert/sentiment_minilm", "encoder": "bert/sentiment_minilm", "ner": "bert/ner",
            "qa": "bert/qa", "fill-mask": "bert/pretrain", "generation": "gpt/pretrain", "gpt": "gpt/pretrain",
            "vit": "vit/digits"}
    folders = {}
    for experiment in sorted(set(runs.values())):
        cfg = compose_config("train", [f"experiment={experiment}", "debug=smoke", "logger=none",
                                       f"paths.data_dir={tiny_data_dir}"], root / experiment)
        if cfg.task.get("pretrained") and cfg.task.pretrained != "minilm":  # no pre-training stage output here
            with open_dict(cfg):
                cfg.task.pretrained = None
        train(cfg)
        folders[experiment] = str(root / experiment)
    return {name: folders[experiment] for name, experiment in runs.items()}


def execute(name: str, models: dict, monkeypatch, project_root):
    monkeypatch.setenv("TRANSFORMER_LAB_MODELS", json.dumps(models))
    (project_root / "notebooks").mkdir(exist_ok=True)  # the kernel's working folder: PROJECT_ROOT is its parent
    notebook = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(project_root / "notebooks")}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    return "".join(o.get("text", "") for o in outputs), outputs


def test_use_trained_models_notebook_runs_every_pipeline(smoke_models, monkeypatch, tiny_data_dir):
    text, outputs = execute("use_trained_models", smoke_models, monkeypatch, tiny_data_dir.parent)
    assert "no model at" not in text, text
    assert "'a gripping, funny and moving film': " in text  # sentiment, every label scored
    assert text.count(" -> {'answer': ") == 3  # three questions answered from the passage
    assert "Where was Anne Clark born? ->" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the similarity matrix


def test_attention_notebook_draws_encoder_gpt_and_vit_maps(smoke_models, monkeypatch, tiny_data_dir):
    project = tiny_data_dir.parent  # data/prepared/images of the tiny data stands in for the project's
    text, outputs = execute("attention", smoke_models, monkeypatch, project)
    assert "no model at" not in text, text
    assert "layers," in text and "heads; predicted" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 3  # encoder, GPT, ViT
