"""Training, resuming, evaluating and predicting through the real Hydra configs and Lightning Trainer."""

import json
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, run
from mlflow import MlflowClient

from transformer_lab.errors import TransformerLabError
from transformer_lab.training.train import train
from transformer_lab.runtime.config import compose_config


def train_run(overrides: list[str], out_dir) -> dict:
    return train(compose_config("train", overrides, out_dir))


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, prepared_atis):
    """One tiny tracked training run shared by the tests that only read its results (registered: a
    debug run registers its model only when asked to)."""
    tmp = tmp_path_factory.mktemp("smoke")
    uri = f"sqlite:///{tmp}/mlflow.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        metrics = train_run(["debug=smoke", f"data.prepared_dir={prepared_atis}", "trainer.max_epochs=2",
                             "tracking.register=true"], tmp / "run")
    run_id = json.loads((tmp / "run" / "mlflow_run.json").read_text())["run_id"]
    return {"dir": tmp / "run", "uri": uri, "run_id": run_id, "metrics": metrics}


def test_training_writes_metrics_checkpoints_and_plots(smoke_run):
    out = smoke_run["dir"]
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("val/intent_acc", "val/token_acc", "val/non_o_token_acc", "val/slot_f1", "val/sentence_acc"):
        assert 0.0 <= metrics[key] <= 1.0
    assert metrics["steps"] == 8 and metrics["epochs"] == 2
    assert (out / "checkpoints" / "best.ckpt").is_file() and (out / "checkpoints" / "last.ckpt").is_file()
    history = (out / "history.csv").read_text().splitlines()
    assert history[0].startswith("epoch,step") and len(history) == 3
    assert (out / "training_curves.png").stat().st_size > 1000


def test_mlflow_run_has_params_per_step_metrics_tags_and_artifacts(smoke_run):
    client = MlflowClient(smoke_run["uri"])
    mlflow_run = client.get_run(smoke_run["run_id"])
    assert mlflow_run.info.status == "FINISHED"
    params = mlflow_run.data.params
    assert params["model.n_heads"] == "4" and params["task.lr"] == "0.001" and params["seed"] == "0"
    tags = mlflow_run.data.tags
    assert tags["hydra_overrides"].startswith("debug=smoke data.prepared_dir=")
    assert len(tags["git_commit"]) == 40 and tags["task_name"] == "atis"
    # what it was trained and scored on: debug=smoke's first 64 training examples, all 60 of dev
    assert tags["data_split_sizes"] == "train=64 validation=60" and len(tags["data_fingerprint"]) == 16
    assert "prepared_dir=" in tags["data_files"]
    assert len(client.get_metric_history(smoke_run["run_id"], "train/loss_step")) == 8  # one point per step
    assert mlflow_run.data.metrics["val/slot_f1"] == pytest.approx(smoke_run["metrics"]["val/slot_f1"])
    artifacts = {a.path for a in client.list_artifacts(smoke_run["run_id"])}
    assert {"config.yaml", "metrics.json", "history.csv", "training_curves.png", "checkpoints"} <= artifacts
    assert [a.path for a in client.list_artifacts(smoke_run["run_id"], "checkpoints")] == ["checkpoints/best.ckpt"]
    experiment = client.get_experiment(mlflow_run.info.experiment_id)
    assert experiment.name == "atis"


def test_seeded_runs_give_identical_metrics(tmp_path, smoke_overrides):
    first = train_run([*smoke_overrides, "logger=none", "seed=7"], tmp_path / "a")
    second = train_run([*smoke_overrides, "logger=none", "seed=7"], tmp_path / "b")
    assert first == second
    third = train_run([*smoke_overrides, "logger=none", "seed=8"], tmp_path / "c")
    assert third != first


def test_resume_from_last_checkpoint_continues_the_run(tmp_path, smoke_overrides):
    out = tmp_path / "run"
    train_run([*smoke_overrides, "trainer.max_epochs=1"], out)
    run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]
    metrics = train_run([*smoke_overrides, "trainer.max_epochs=2", "ckpt_path=last"], out)
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["steps"] == 8 and saved["epochs"] == 2  # 4 steps from the first run + 4 more
    assert [line.split(",")[0] for line in (out / "history.csv").read_text().splitlines()[1:]] == ["0", "1"]
    assert json.loads((out / "mlflow_run.json").read_text())["run_id"] == run_id  # the same MLflow run goes on
    assert metrics["val/slot_f1"] >= 0


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, smoke_overrides):
    from transformer_lab.errors import TransformerLabError

    with pytest.raises(TransformerLabError, match="no checkpoint at .*last.ckpt"):
        train_run([*smoke_overrides, "ckpt_path=last"], tmp_path / "fresh")


@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_evaluate_logs_into_the_training_run(smoke_run, prepared_atis, tmp_path):
    result = run([PYTHON, ROOT / "pipelines" / "evaluate.py", "evaluate=atis", f"train_dir={smoke_run['dir']}",
                  f"data.prepared_dir={prepared_atis}", f"hydra.run.dir={tmp_path / 'eval'}"],
                 env={"MLFLOW_TRACKING_URI": smoke_run["uri"]})
    assert result.returncode == 0, result.stderr
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert set(metrics) >= {"test/intent_acc", "test/slot_f1", "test/sentence_acc", "test/non_o_token_acc"}
    rows = (tmp_path / "eval" / "intent_confusion.csv").read_text().splitlines()
    assert rows[0] == "actual,predicted" and len(rows) == 61
    client = MlflowClient(smoke_run["uri"])
    logged = client.get_run(smoke_run["run_id"]).data.metrics
    assert logged["test/slot_f1"] == pytest.approx(metrics["test/slot_f1"])
    assert {a.path for a in client.list_artifacts(smoke_run["run_id"], "evaluation")} >= {
        "evaluation/intent_confusion.png", "evaluation/per_slot_f1.png", "evaluation/metrics.json"}


@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_predict_prints_intent_and_a_tag_per_word(smoke_run):
    text = "cheapest flight to fly from MIT to Mars"
    result = run([PYTHON, ROOT / "pipelines" / "predict.py", f"text={text}", f"model={smoke_run['dir']}",
                  f"hydra.run.dir={smoke_run['dir']}/predict"])
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed["words"] == text.split() and len(printed["tags"]) == len(text.split())
    assert isinstance(printed["intent"], str)
    assert all(tag == "O" or tag[:2] in ("B-", "I-") for tag in printed["tags"])

    missing = run([PYTHON, ROOT / "pipelines" / "predict.py", "text=hello", "model=/nonexistent.ckpt",
                   f"hydra.run.dir={smoke_run['dir']}/predict"])
    assert missing.returncode == 2 and missing.stderr.strip().startswith("error: model=/nonexistent.ckpt: no such")


def test_pipelines_read_a_run_from_its_folder_its_mlflow_run_and_the_registry(smoke_run):
    import torch

    from transformer_lab import pipeline

    checkpoint = torch.load(smoke_run["dir"] / "checkpoints" / "best.ckpt", weights_only=True)
    assert checkpoint["family"] == "joint_intent_slot"  # what tells a pipeline which task reads it
    text = "flights from boston to denver"
    expected = pipeline(model=str(smoke_run["dir"]))(text)
    assert expected["words"] == text.split() and isinstance(expected["intent"], str)
    run_id, uri = smoke_run["run_id"], smoke_run["uri"]
    for model in (run_id, f"runs:/{run_id}"):
        assert pipeline(model=model, tracking_uri=uri)(text) == expected
    client = MlflowClient(uri)
    client.create_registered_model("atis_tagger")
    version = client.create_model_version("atis_tagger", f"runs:/{run_id}/model", run_id=run_id)
    client.set_registered_model_alias("atis_tagger", "champion", version.version)
    assert pipeline(model="models:/atis_tagger@champion", tracking_uri=uri)(text) == expected
    assert pipeline(model=f"models:/atis_tagger/{version.version}", tracking_uri=uri)(text) == expected
    with pytest.raises(TransformerLabError, match="model=models:/atis_tagger@nobody: "):
        pipeline(model="models:/atis_tagger@nobody", tracking_uri=uri)


@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_predict_files_of_inputs_to_jsonl_and_refuses_a_bad_line(smoke_run, tmp_path):
    from transformer_lab import pipeline

    texts = ["flights from boston to denver", "what is the cheapest fare", "show me ground transportation"]
    (tmp_path / "inputs.txt").write_text("\n".join(texts) + "\n")
    out = tmp_path / "predictions.jsonl"
    result = run([PYTHON, ROOT / "pipelines" / "predict.py", f"model={smoke_run['dir']}",
                  f"input={tmp_path / 'inputs.txt'}", f"output={out}", f"hydra.run.dir={tmp_path}/predict"])
    assert result.returncode == 0, result.stderr[-2000:]
    expected = pipeline(model=str(smoke_run["dir"]))(texts)
    assert [json.loads(line) for line in out.read_text().splitlines()] == json.loads(json.dumps(expected))

    (tmp_path / "bad.jsonl").write_text('{"text": "flights to boston"}\n{"txt": "typo"}\n')
    result = run([PYTHON, ROOT / "pipelines" / "predict.py", f"model={smoke_run['dir']}",
                  f"input={tmp_path / 'bad.jsonl'}", f"output={tmp_path / 'bad_out.jsonl'}",
                  f"hydra.run.dir={tmp_path}/predict"])
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {tmp_path / 'bad.jsonl'}:2: field 'text' is missing or empty"
    assert not (tmp_path / "bad_out.jsonl").exists()  # nothing half-written


def test_logged_mlflow_model_is_the_pipeline_and_the_registry_names_a_champion(smoke_run):
    import mlflow
    import pandas as pd

    from transformer_lab import pipeline

    client = MlflowClient(smoke_run["uri"])
    model_uri = client.get_run(smoke_run["run_id"]).data.tags["model_uri"]
    mlflow.set_tracking_uri(smoke_run["uri"])
    texts = ["flights from boston to denver", "what is the cheapest fare"]
    logged = mlflow.pyfunc.load_model(model_uri)
    assert logged.metadata.get_input_schema().input_names() == ["text"]  # the signature, from the input example
    expected = pipeline(model=str(smoke_run["dir"]))(texts)
    assert logged.predict(pd.DataFrame({"text": texts})) == expected
    champion = client.get_model_version_by_alias("atis", "champion")  # the run's task_name names the model
    assert champion.run_id == smoke_run["run_id"]
    assert champion.tags["data_fingerprint"] == client.get_run(smoke_run["run_id"]).data.tags["data_fingerprint"]
    assert mlflow.pyfunc.load_model("models:/atis@champion").predict(pd.DataFrame({"text": texts})) == expected


@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_the_champion_moves_only_to_a_better_run_on_the_same_data(tmp_path):
    import mlflow
    from transformer_lab.tracking.registry import register

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    code = tmp_path / "identity.py"  # the smallest model MLflow logs from code
    code.write_text("import mlflow\n\nclass Identity(mlflow.pyfunc.PythonModel):\n"
                    "    def predict(self, context, model_input, params=None):\n        return model_input\n\n"
                    "mlflow.models.set_model(Identity())\n")
    mlflow.set_experiment("atis")
    runs = []
    for score in (0.80, 0.90, 0.85, 0.95, 0.50):
        with mlflow.start_run() as run:
            mlflow.log_metric("val/slot_f1", score)
            runs.append((run.info.run_id, mlflow.pyfunc.log_model(name="model", python_model=str(code)).model_uri))

    def register_run(number: int, data: str, force: bool = False):
        run_id, uri = runs[number]
        return register(uri, "atis", run_id, "val/slot_f1", "max", data, force=force)

    first, better, worse = register_run(0, "full"), register_run(1, "full"), register_run(2, "full")
    assert (first.version, first.champion) == (1, True) and first.reason == "no champion before"
    assert (better.version, better.champion) == (2, True)
    assert better.reason == "val/slot_f1 0.9 beats champion version 1's 0.8 on the same data"
    assert (worse.version, worse.champion) == (3, False)
    assert worse.reason == "val/slot_f1 0.85 does not beat champion version 2's 0.9 on the same data"
    # a higher score on other data (a debug run's few examples) does not take the alias ...
    elsewhere = register_run(3, "smoke")
    assert (elsewhere.version, elsewhere.champion) == (4, False)
    assert elsewhere.reason.startswith("champion version 2 was scored on other data (full; this run: smoke)")
    assert int(mlflow.MlflowClient().get_model_version_by_alias("atis", "champion").version) == 2
    # ... unless asked to, whatever the score
    forced = register_run(4, "smoke", force=True)
    assert (forced.version, forced.champion) == (5, True) and "tracking.champion=force" in forced.reason
    assert int(mlflow.MlflowClient().get_model_version_by_alias("atis", "champion").version) == 5
    assert mlflow.MlflowClient().get_model_version("atis", "5").tags["data_fingerprint"] == "smoke"
    # a lower metric is better for a loss
    assert register(runs[2][1], "loss_model", runs[2][0], "val/slot_f1", "min", "full").champion
    assert register(runs[0][1], "loss_model", runs[0][0], "val/slot_f1", "min", "full").champion


@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_a_debug_run_registers_nothing_and_its_summary_names_its_store(tmp_path, smoke_overrides, capsys):
    from mlflow import MlflowClient

    train_run(smoke_overrides, tmp_path / "run")
    printed = capsys.readouterr().out
    assert MlflowClient().search_registered_models() == []
    assert "model registry: not registered: a debug run (debug=smoke); tracking.register=true registers it" in printed
    run_id = json.loads((tmp_path / "run" / "mlflow_run.json").read_text())["run_id"]
    store = f"sqlite:///{tmp_path}/mlflow.db"  # the test's own store (conftest), not the project's `make ui` serves
    [link] = [line for line in printed.splitlines() if line.startswith("  MLflow ")]
    assert store in link and run_id in link and "make ui" not in link


def test_an_unknown_champion_setting_is_refused_before_any_data_is_read(tmp_path, smoke_overrides):
    with pytest.raises(TransformerLabError, match=r"^tracking.champion='sometimes' is not one of auto, force$"):
        train_run([*smoke_overrides, "++tracking.champion=sometimes"], tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_run_link_names_the_store_the_run_went_to(tmp_path):
    from transformer_lab.tracking.runs import run_link

    project_store = tmp_path / "mlflow.db"
    page = "#/experiments/3/runs/abc?workflowType=machine_learning"  # MLflow 3.17's UI in its Model training mode
    assert run_link("http://10.0.0.5:5001/", "3", "abc", project_store) == f"http://10.0.0.5:5001/{page}"
    assert run_link(f"sqlite:///{project_store}", "3", "abc", project_store) == (
        f"http://127.0.0.1:5000/{page} after `make ui` (store sqlite:///{project_store})")
    other = f"sqlite:///{tmp_path}/elsewhere/mlflow.db"
    assert run_link(other, "3", "abc", project_store) == (
        f"run abc in {other}: `mlflow ui --backend-store-uri {other}`, then http://127.0.0.1:5000/{page}")
    database = run_link("postgresql://team:s3cret@db.example:5432/mlflow", "3", "abc", project_store)
    assert "s3cret" not in database and "postgresql://team:***@db.example:5432/mlflow" in database


def test_the_data_fingerprint_follows_content_and_sizes_not_location(tmp_path):
    from transformer_lab.tracking.runs import data_record

    def fingerprint(settings, sizes=None):
        return data_record(settings, sizes or {"train": 300, "validation": 60})["data_fingerprint"]

    for copy in ("a", "b"):
        (tmp_path / copy / "prepared").mkdir(parents=True)
        (tmp_path / copy / "prepared" / "train.parquet").write_bytes(b"rows")
        (tmp_path / copy / "tokenizer.json").write_text("{}")
    settings = {"_target_": "transformer_lab.data.atis.AtisDataModule", "batch_size": 16, "max_examples": None,
                "prepared_dir": str(tmp_path / "a" / "prepared"), "tokenizer_path": str(tmp_path / "a" / "tokenizer.json")}
    same = fingerprint(settings)
    moved = {**settings, "prepared_dir": str(tmp_path / "b" / "prepared"),
             "tokenizer_path": str(tmp_path / "b" / "tokenizer.json")}
    assert fingerprint(moved) == same  # the same files in another clone
    assert fingerprint({**settings, "batch_size": 64}) == same  # how batches are drawn, not which examples
    assert fingerprint({**settings, "max_examples": 64}) != same
    assert fingerprint(settings, {"train": 64, "validation": 32}) != same
    (tmp_path / "b" / "prepared" / "train.parquet").write_bytes(b"other rows")
    assert fingerprint(moved) != same


def test_the_served_model_answers_a_bad_row_with_400_and_its_reason_only(smoke_run):
    import mlflow
    from mlflow.pyfunc import scoring_server
    from starlette.testclient import TestClient

    mlflow.set_tracking_uri(smoke_run["uri"])
    model_uri = MlflowClient(smoke_run["uri"]).get_run(smoke_run["run_id"]).data.tags["model_uri"]
    server = TestClient(scoring_server.init(mlflow.pyfunc.load_model(model_uri)))  # what `mlflow models serve` runs
    good = server.post("/invocations", json={"dataframe_records": [{"text": "flights to boston"}]})
    assert good.status_code == 200 and good.json()["predictions"][0]["words"] == ["flights", "to", "boston"]
    bad = server.post("/invocations", json={"dataframe_records": [{"text": "flights to boston"}, {"text": " "}]})
    assert bad.status_code == 400
    answer = bad.json()
    assert answer["error_code"] == "INVALID_PARAMETER_VALUE"
    assert answer["message"] == "input row 1: field 'text' is missing or empty"
    assert "stack_trace" not in answer and "Traceback" not in bad.text and "site-packages" not in bad.text


@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_the_served_champion_answers_http_requests_as_the_pipeline(smoke_run, tmp_path):
    import os
    import subprocess
    import time
    import urllib.request

    from conftest import free_port

    from transformer_lab import pipeline

    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": smoke_run["uri"],
           "PATH": f"{Path(PYTHON).parent}{os.pathsep}{os.environ['PATH']}"}  # its uvicorn
    server = subprocess.Popen([str(Path(PYTHON).parent / "mlflow"), "models", "serve", "-m", "models:/atis@champion",
                               "--env-manager", "local", "--host", "127.0.0.1", "-p", str(port)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        texts = ["flights from boston to denver"]
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", method="POST",
                                         data=json.dumps({"dataframe_records": [{"text": t} for t in texts]}).encode(),
                                         headers={"Content-Type": "application/json"})
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    answer = json.loads(response.read())
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise AssertionError(server.stdout.read().decode()[-3000:] if server.poll() is not None else
                                         "the server did not answer within 120 s")
                time.sleep(1)
        assert answer["predictions"] == pipeline(model=str(smoke_run["dir"]))(texts)
    finally:
        server.terminate()
        server.wait(timeout=30)


def _word2vec_file(path, words, dim=32):
    import numpy as np

    from transformer_lab.data.word_vectors import save_word2vec_format

    vectors = np.random.default_rng(0).normal(size=(len(words), dim)).astype(np.float32)
    save_word2vec_format(path, words, vectors)
    return vectors


def test_embeddings_start_from_word2vec_vectors(tmp_path, smoke_overrides, prepared_atis):
    import torch
    from mlflow import MlflowClient

    vocab = json.loads((prepared_atis / "vocab.json").read_text())
    vectors = _word2vec_file(tmp_path / "vectors.txt", vocab[3:13] + ["not-in-atis"])
    overrides = [*smoke_overrides, "model.d_model=32", "task.lr=0",  # lr 0: the weights stay as initialised
                 "task.embeddings.init=word2vec", f"task.embeddings.vectors={tmp_path / 'vectors.txt'}"]
    train_run(overrides, tmp_path / "run")
    from transformer_lab.tasks.checkpoints import load_task
    from transformer_lab.tasks.joint_intent_slot import JointIntentSlotTask

    task = load_task(tmp_path / "run/checkpoints/last.ckpt", JointIntentSlotTask, "train_atis")
    table = task.model.get_input_embeddings().weight[3:13].detach()
    ratios = table / torch.from_numpy(vectors[:10])
    torch.testing.assert_close(ratios, torch.full_like(ratios, ratios[0, 0].item()))  # the same vectors, one scale
    [mlflow_run] = MlflowClient().search_runs([MlflowClient().get_experiment_by_name("atis").experiment_id])
    assert mlflow_run.data.metrics["embeddings/word2vec_coverage"] == pytest.approx(10 / len(vocab))
    assert mlflow_run.data.params["task.embeddings.init"] == "word2vec"


def test_a_resumed_run_keeps_its_trained_embeddings(tmp_path, smoke_overrides, prepared_atis, monkeypatch):
    """The word2vec start applies once: a resumed run starts training from the checkpoint's weights
    (it does not even read the vectors again)."""
    import torch

    from transformer_lab.tasks.joint_intent_slot import JointIntentSlotTask

    started = []  # the embedding table when training starts: after Lightning has restored a checkpoint
    monkeypatch.setattr(JointIntentSlotTask, "on_train_start",
                        lambda self: started.append(self.model.get_input_embeddings().weight.detach().clone()))
    vocab = json.loads((prepared_atis / "vocab.json").read_text())
    vectors = torch.from_numpy(_word2vec_file(tmp_path / "vectors.txt", vocab[3:13]))
    overrides = [*smoke_overrides, "logger=none", "model.d_model=32", "task.embeddings.init=word2vec",
                 f"task.embeddings.vectors={tmp_path / 'vectors.txt'}"]
    train_run([*overrides, "trainer.max_epochs=1"], tmp_path / "run")
    ratios = started[0][3:13] / vectors
    torch.testing.assert_close(ratios, torch.full_like(ratios, ratios[0, 0].item()))  # the first run: word2vec
    trained = torch.load(tmp_path / "run/checkpoints/last.ckpt", weights_only=True)["state_dict"]
    (tmp_path / "vectors.txt").unlink()
    train_run([*overrides, "trainer.max_epochs=2", "ckpt_path=last"], tmp_path / "run")
    assert torch.equal(started[1], trained["model.encoder.token_embedding.weight"])
    assert not torch.equal(started[1], started[0])


def test_an_unknown_embedding_init_is_refused_by_name(tmp_path, smoke_overrides):
    from transformer_lab.errors import TransformerLabError

    with pytest.raises(TransformerLabError,
                       match=r"task.embeddings.init='fasttext' is not one of random, word2vec, glove"):
        train_run([*smoke_overrides, "logger=none", "task.embeddings.init=fasttext"], tmp_path / "run")


def test_word2vec_vectors_of_the_wrong_size_are_a_clear_error(tmp_path, smoke_overrides):
    import numpy as np

    from transformer_lab.data.word_vectors import save_word2vec_format
    from transformer_lab.errors import TransformerLabError

    save_word2vec_format(tmp_path / "v.txt", ["flights"], np.ones((1, 100), dtype=np.float32))
    with pytest.raises(TransformerLabError, match="vectors have 100 dimensions but model.d_model=128"):
        train_run([*smoke_overrides, "task.embeddings.init=word2vec", f"task.embeddings.vectors={tmp_path / 'v.txt'}"],
                  tmp_path / "run")


@pytest.mark.slow  # a Hydra multirun of three jobs, two of which train
def test_a_failing_sweep_job_is_recorded_and_the_other_jobs_still_run(tmp_path, smoke_overrides):
    from conftest import sweep_runs

    uri = f"sqlite:///{tmp_path}/sweep.db"
    # n_heads=3 composes (it is an int) but fails inside its job: 128 dimensions do not split into 3 heads
    result = run([PYTHON, ROOT / "pipelines" / "train.py", "-m", "model.n_heads=4,3,2", *smoke_overrides,
                  "tracking.log_trained_model=false", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                 env={"MLFLOW_TRACKING_URI": uri})
    reason = "model: d_model=128 is not divisible by n_heads=3"
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"error: 1 of 3 jobs failed: #1 (model.n_heads=3) {reason}" in result.stderr.splitlines()
    assert all((tmp_path / "sweep" / job / "metrics.json").is_file() for job in ("0", "2"))  # the job after it ran
    parent, runs = sweep_runs(uri, "atis")
    assert parent.info.status == "FAILED"
    assert parent.data.metrics["jobs_total"] == 3 and parent.data.metrics["jobs_failed"] == 1
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in runs)
    by_heads = {r.data.params["model.n_heads"]: r for r in runs}
    assert by_heads["4"].info.status == by_heads["2"].info.status == "FINISHED"
    failed = by_heads["3"]
    assert failed.info.status == "FAILED" and failed.data.tags["failure"] == reason
    assert failed.info.run_name.startswith("atis model.n_heads=3")  # named as its run would have been


def test_a_failed_sweep_job_is_recorded_counted_and_handed_on_as_finished(tmp_path, capsys):
    """SweepRecord's side of the multirun above, in-process: what Hydra's launcher hands it."""
    from conftest import sweep_runs
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobReturn, JobStatus
    from hydra.types import RunMode
    from omegaconf import open_dict, read_write

    from transformer_lab.tracking.sweeps import SweepRecord
    from transformer_lab.utils.resolvers import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        config = compose("train", ["debug=smoke", f"hydra.sweep.dir={tmp_path / 'sweep'}"], return_hydra_config=True)
    with open_dict(config):
        config.hydra.mode = RunMode.MULTIRUN
    record = SweepRecord()
    record.on_multirun_start(config)
    reason = "model: d_model=128 is not divisible by n_heads=3"
    for job, (heads, error) in enumerate([(4, None), (3, TransformerLabError(reason))]):
        with read_write(config.hydra.job), read_write(config.hydra.runtime):  # what the launcher sets per job
            config.hydra.job.num, config.hydra.runtime.output_dir = job, str(tmp_path / "sweep" / str(job))
        HydraConfig.instance().set_config(config)
        job_return = JobReturn(overrides=[f"model.n_heads={heads}", "debug=smoke"], status=JobStatus.COMPLETED)
        if error:
            wrapped = RuntimeError("instantiating")
            wrapped.__cause__ = error  # as Hydra's instantiate wraps it
            job_return.status, job_return.return_value = JobStatus.FAILED, wrapped
        record.on_job_end(config, job_return)
        # the sweeper goes on: no job it is handed back raises
        assert job_return.status == JobStatus.COMPLETED and (error is None or job_return.return_value is None)
    with pytest.raises(SystemExit) as exit_code:
        record.on_multirun_end(config)
    assert exit_code.value.code == 2
    assert capsys.readouterr().err == f"error: 1 of 2 jobs failed: #1 (model.n_heads=3) {reason}\n"
    parent, [failed] = sweep_runs(config.paths.mlflow_tracking_uri, "atis")  # job 0 did not run here: no run
    assert parent.info.status == "FAILED" and parent.data.metrics == {"jobs_total": 2, "jobs_failed": 1}
    assert failed.info.status == "FAILED" and failed.data.tags["failure"] == reason
    assert failed.data.tags["mlflow.parentRunId"] == parent.info.run_id and failed.data.params["model.n_heads"] == "3"
