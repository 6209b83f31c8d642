"""Trust and recovery: checkpoints are data, a killed run resumes exactly, a server that is down
stops a run in seconds, and bad input is one line and exit code 2 everywhere."""

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
import yaml

from conftest import PYTHON, ROOT, free_port, run
from transformer_lab.errors import TransformerLabError
from transformer_lab.utils.config import compose_config


class RunsShellCommand:
    """Unpickling this runs `touch <marker>`: what a crafted checkpoint does to a loader that trusts it."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def assert_one_line_error(result, *fragments: str) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_a_crafted_checkpoint_is_refused_and_runs_nothing(tmp_path):
    marker, checkpoint = tmp_path / "pwned", tmp_path / "crafted.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": RunsShellCommand(marker)}, checkpoint)
    result = run([PYTHON, ROOT / "pipelines" / "predict.py", f"model={checkpoint}", "text=flights to boston"])
    assert_one_line_error(result, str(checkpoint), "refused to load")
    assert not marker.exists()

    from transformer_lab.tasks.pretrained import load_pretrained

    with pytest.raises(TransformerLabError, match="refused to load"):
        load_pretrained(torch.nn.Linear(2, 2), str(checkpoint), prefix="model.", stage="pretrain_bert",
                        is_published=lambda source: False, from_published=dict,
                        hub_example="hf:NAME")
    assert not marker.exists()


def test_checkpoints_that_are_not_this_tasks_are_one_clear_error(tmp_path):
    from transformer_lab.checkpoints import load_task
    from transformer_lab.tasks.joint_intent_slot import JointIntentSlotTask

    cases = {
        "weights.pt": ({"weight": torch.zeros(2)}, "not a transformer-lab checkpoint"),
        "other_task.ckpt": ({"state_dict": {}, "hyper_parameters": {"vocab_size": 3}},
                            "not a JointIntentSlotTask checkpoint"),
    }
    for name, (content, message) in cases.items():
        torch.save(content, tmp_path / name)
        with pytest.raises(TransformerLabError, match=message):
            load_task(tmp_path / name, JointIntentSlotTask, "train_atis")
    (tmp_path / "text.ckpt").write_text("not a checkpoint")
    with pytest.raises(TransformerLabError, match="not a PyTorch checkpoint"):
        load_task(tmp_path / "text.ckpt", JointIntentSlotTask, "train_atis")


def test_a_scikit_learn_model_holding_untrusted_code_is_refused(tmp_path):
    import skops.io
    from sklearn.preprocessing import FunctionTransformer

    from transformer_lab import baselines
    from transformer_lab.checkpoints import ESTIMATOR_FILE

    skops.io.dump(FunctionTransformer(func=os.system), tmp_path / ESTIMATOR_FILE)
    with pytest.raises(TransformerLabError, match="refused to load.*system"):
        baselines.load(tmp_path, "train_logreg")


# Small enough for seconds, large enough that every epoch's data order and dropout move the scores.
RESUMABLE = ["debug=smoke", "trainer.max_epochs=4", "data.datamodule.max_examples=128", "trainer.limit_train_batches=8",
             "trainer.limit_val_batches=4", "task.lr=0.005", "optimized_metric=val/loss",
             "+callbacks.kill._target_=kill_switch.KillAtStep"]  # the checkpoint's mode (min) follows the metric


def train_process(args: list, env: dict | None = None):
    return run([PYTHON, ROOT / "pipelines" / "train.py", *args],
               env={"PYTHONPATH": str(ROOT / "tests"), **(env or {})})


@pytest.mark.slow  # four training processes, one killed with SIGKILL
def test_a_run_killed_mid_epoch_resumes_to_the_same_result(tmp_path, prepared_atis):
    """kill -9 in the third epoch (after last.ckpt of the second), resumed with only the run's folder:
    the same final scores and weights as the run that was never stopped, the original record intact."""
    overrides = [*RESUMABLE, f"data.prepared_dir={prepared_atis}"]
    whole = train_process([*overrides, f"hydra.run.dir={tmp_path / 'whole'}"])
    assert whole.returncode == 0, whole.stderr[-3000:]

    killed_dir = tmp_path / "killed"
    killed = train_process([*overrides, f"hydra.run.dir={killed_dir}"], env={"KILL_AT_STEP": "20"})
    assert killed.returncode == -9  # SIGKILL: nothing after it ran
    assert not (killed_dir / "metrics.json").exists()
    record = (killed_dir / ".hydra" / "overrides.yaml").read_text()

    resumed = train_process([f"hydra.run.dir={killed_dir}", "ckpt_path=last"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = json.loads((tmp_path / "whole" / "metrics.json").read_text())
    assert json.loads((killed_dir / "metrics.json").read_text()) == expected
    for name in ("best.ckpt", "last.ckpt"):
        ours = torch.load(killed_dir / "checkpoints" / name, weights_only=True)["state_dict"]
        theirs = torch.load(tmp_path / "whole" / "checkpoints" / name, weights_only=True)["state_dict"]
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert (killed_dir / ".hydra" / "overrides.yaml").read_text() == record
    [resume_record] = (killed_dir / ".hydra").glob("resume-*/overrides.yaml")
    assert "ckpt_path=last" in yaml.safe_load(resume_record.read_text())

    # The console of a run: its summary, and none of the noise
    output = whole.stdout + whole.stderr
    assert "atis: done in" in output and f"outputs  {tmp_path / 'whole'}" in output and "#/experiments/" in output
    for noise in ("💡 Tip", "FLOPs", "LeafSpec", "Downloading", "Saving pytorch model by Pickle"):
        assert noise not in output
    assert not [log for log in (tmp_path / "whole").glob("*.log") if log.stat().st_size == 0]

    # An architecture change on resume is one line, and the run's record stays as it was
    conflict = train_process([f"hydra.run.dir={killed_dir}", "ckpt_path=last", "model.n_heads=2"])
    assert_one_line_error(conflict, "n_heads=4", "n_heads=2")
    assert (killed_dir / ".hydra" / "overrides.yaml").read_text() == record


def test_an_mlflow_server_that_is_down_stops_training_in_seconds(tmp_path, smoke_overrides):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    start = time.perf_counter()
    result = train_process([*smoke_overrides, f"hydra.run.dir={tmp_path / 'run'}"], env={"MLFLOW_TRACKING_URI": uri})
    assert time.perf_counter() - start < 60
    assert_one_line_error(result, uri, "does not answer", "logger=none")
    assert not (tmp_path / "run" / "checkpoints").exists()


class _FailingServer(BaseHTTPRequestHandler):
    """Healthy by /health, failing every API call: a flaky tracking server."""

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 500)
        self.end_headers()
        self.wfile.write(b"OK" if self.path == "/health" else b'{"error_code": "INTERNAL_ERROR", "message": "boom"}')

    do_POST = do_GET

    def log_message(self, *args):
        pass


def test_evaluation_tells_a_missing_run_from_a_failing_server(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from transformer_lab.evaluation import mlflow_run_for

    cfg = compose_config("evaluate_atis", [], tmp_path)
    client, run_id = mlflow_run_for(cfg, {"run_id": "0" * 32})  # a run that is gone: a new one
    assert client.get_run(run_id).info.run_name == "evaluate"

    server = ThreadingHTTPServer(("127.0.0.1", 0), _FailingServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    requests = []
    monkeypatch.setattr(_FailingServer, "log_message", lambda self, fmt, *args: requests.append(args[0]))
    try:
        with pytest.raises(TransformerLabError, match=f"MLflow {uri}: cannot read run"):
            mlflow_run_for(compose_config("evaluate_atis", [], tmp_path), {"run_id": "0" * 32})
    finally:
        server.shutdown()
    assert not [r for r in requests if "runs/create" in r]  # no second run for the same training


def test_bad_settings_are_one_line_naming_the_key(tmp_path, prepared_atis):
    from transformer_lab.generate import check_settings
    from transformer_lab.train import train

    for override, message in (("strategy=beam", "strategy='beam'"), ("temperature=0", "temperature=0"),
                              ("top_p=1.5", "top_p=1.5"), ("top_k=0", "top_k=0"), ("max_new_tokens=abc", "abc")):
        with pytest.raises(TransformerLabError, match=message):
            check_settings(compose_config("generate", [override], tmp_path))
    for override, message in (("model.n_heads=abc", r"model.n_heads='abc': expected an integer"),
                              ("model.n_heads=3", "d_model=128 is not divisible by n_heads=3"),
                              ("task.lr=fast", r"task.lr='fast': expected a number"),
                              ("data.datamodule.batch_size=1.5", "batch_size=1.5: expected an integer")):
        with pytest.raises(TransformerLabError, match=message):
            train(compose_config("train", ["debug=smoke", "logger=none", f"data.prepared_dir={prepared_atis}",
                                           override], tmp_path / "run"))

    result = run([PYTHON, ROOT / "pipelines" / "predict.py"])
    assert_one_line_error(result, "give one input: text=")


def test_bad_files_are_one_line_naming_the_file(tmp_path):
    from transformer_lab.data.corpus import load_documents
    from transformer_lab.data.tabular import TableSchema, read_table

    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(TransformerLabError, match=r"empty.csv:1: the file is empty"):
        read_table(tmp_path / "empty.csv", TableSchema.load(ROOT / "conf" / "schemas" / "heart.yaml"))
    (tmp_path / "one.txt").write_text("a first line of text\n\na second document\n")
    assert load_documents("local", str(tmp_path / "one.txt")) == load_documents("local", [str(tmp_path / "one.txt")])


def test_resume_arguments_are_the_runs_own_with_the_command_line_on_top(tmp_path):
    from transformer_lab.utils.cli import resume_run_arguments

    record = tmp_path / "run" / ".hydra" / "overrides.yaml"
    record.parent.mkdir(parents=True)
    record.write_text(yaml.safe_dump(["experiment=atis", "model.n_heads=8", "logger.log_pytorch_model=false",
                                      "+callbacks.extra._target_=x.Y", "trainer.max_epochs=10"]))
    given = [f"hydra.run.dir={tmp_path / 'run'}", "ckpt_path=last", "trainer.max_epochs=30", "logger=none",
             "callbacks.extra._target_=x.Z"]
    arguments = resume_run_arguments(given)
    assert arguments[:-1] == ["experiment=atis", "model.n_heads=8", "+callbacks.extra._target_=x.Z",
                              "trainer.max_epochs=30", f"hydra.run.dir={tmp_path / 'run'}", "ckpt_path=last",
                              "logger=none"]
    assert arguments[-1].startswith("hydra.output_subdir=.hydra/resume-")
    for unchanged in ([f"hydra.run.dir={tmp_path / 'run'}"], ["ckpt_path=last"],  # a new run; no run folder
                      [f"hydra.run.dir={tmp_path / 'new'}", "ckpt_path=last"]):  # a folder with no record
        assert resume_run_arguments(unchanged) == unchanged
