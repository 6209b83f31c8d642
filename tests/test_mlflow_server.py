"""A tiny training logged to a real `mlflow server` on 127.0.0.1, read back with MlflowClient."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, free_port, run, wait_until_up
from mlflow import MlflowClient

pytestmark = pytest.mark.slow


@pytest.fixture
def mlflow_server(tmp_path):
    port = free_port()
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{tmp_path}/server.db", "--artifacts-destination", str(tmp_path / "store"),
         "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, tmp_path / "server.log", server)
        yield {"url": url, "store": tmp_path / "store"}
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_training_logs_to_a_tracking_server(mlflow_server, prepared_atis, tmp_path):
    out = tmp_path / "run"
    result = run([PYTHON, ROOT / "pipelines" / "train.py", "debug=smoke", f"data.prepared_dir={prepared_atis}",
                  f"hydra.run.dir={out}"], env={"MLFLOW_TRACKING_URI": mlflow_server["url"]})
    assert result.returncode == 0, result.stderr[-3000:]

    client = MlflowClient(mlflow_server["url"])
    [mlflow_run] = client.search_runs([client.get_experiment_by_name("atis").experiment_id])
    assert mlflow_run.info.run_id == json.loads((out / "mlflow_run.json").read_text())["run_id"]
    # the summary links to the run's page on that server
    page = (f"{mlflow_server['url']}/#/experiments/{mlflow_run.info.experiment_id}/runs/{mlflow_run.info.run_id}"
            "?workflowType=machine_learning")  # MLflow 3.17's Model training pages
    assert f"  MLflow   {page}" in result.stdout.splitlines()
    assert mlflow_run.data.params["model.d_model"] == "128"
    assert mlflow_run.data.params["trainer.max_epochs"] == "1"
    assert len(client.get_metric_history(mlflow_run.info.run_id, "train/loss_step")) == 4
    local = json.loads((out / "metrics.json").read_text())
    assert mlflow_run.data.metrics["val/slot_f1"] == pytest.approx(local["val/slot_f1"])

    downloaded = client.download_artifacts(mlflow_run.info.run_id, "metrics.json", str(tmp_path / "dl"))
    assert json.loads(Path(downloaded).read_text()) == local
    assert {a.path for a in client.list_artifacts(mlflow_run.info.run_id)} >= {"config.yaml", "checkpoints",
                                                                                 "training_curves.png"}
    # the artifacts went through the server into its own store, not into the project
    assert any(p.name == "best.ckpt" for p in mlflow_server["store"].rglob("*"))
