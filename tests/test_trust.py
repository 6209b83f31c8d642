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
from transformer_lab.runtime.config import compose_config


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
    from transformer_lab.tasks.checkpoints import load_task
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

    from transformer_lab.tasks.checkpoints import ESTIMATOR_FILE
    from transformer_lab.training import baselines

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

    from transformer_lab.tracking.evaluations import mlflow_run_for

    cfg = compose_config("evaluate", ["evaluate=atis"], tmp_path)
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
            mlflow_run_for(compose_config("evaluate", ["evaluate=atis"], tmp_path), {"run_id": "0" * 32})
    finally:
        server.shutdown()
    assert not [r for r in requests if "runs/create" in r]  # no second run for the same training


def test_bad_settings_are_one_line_naming_the_key(tmp_path, prepared_atis):
    from transformer_lab.inference.generate import check_settings
    from transformer_lab.training.train import train

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
    record.write_text(yaml.safe_dump(["experiment=atis/full", "model.n_heads=8", "logger.log_pytorch_model=false",
                                      "+callbacks.extra._target_=x.Y", "trainer.max_epochs=10"]))
    given = [f"hydra.run.dir={tmp_path / 'run'}", "ckpt_path=last", "trainer.max_epochs=30", "logger=none",
             "callbacks.extra._target_=x.Z"]
    arguments = resume_run_arguments(given)
    assert arguments[:-1] == ["experiment=atis/full", "model.n_heads=8", "+callbacks.extra._target_=x.Z",
                              "trainer.max_epochs=30", f"hydra.run.dir={tmp_path / 'run'}", "ckpt_path=last",
                              "logger=none"]
    assert arguments[-1].startswith("hydra.output_subdir=.hydra/resume-")
    for unchanged in ([f"hydra.run.dir={tmp_path / 'run'}"], ["ckpt_path=last"],  # a new run; no run folder
                      [f"hydra.run.dir={tmp_path / 'new'}", "ckpt_path=last"]):  # a folder with no record
        assert resume_run_arguments(unchanged) == unchanged


HEAVY_MODULES = {"torch", "lightning", "mlflow", "transformers", "pandas"}
ENTRY_POINTS = sorted(p.name for p in (ROOT / "pipelines").glob("[!_]*.py"))
CHOICE = {"evaluate.py": ["evaluate=vit"], "study.py": ["study=positions"]}  # the entry points that compose nothing without a config group's choice


def refused(args: list, env: dict | None = None) -> tuple[str, set[str]]:
    """A call the project must refuse: its one `error:` line (exit code 2) and the heavy modules it
    imported before answering, read from `python -X importtime`."""
    result = run([PYTHON, "-X", "importtime", *args], env=env)
    lines = result.stderr.splitlines()
    imported = {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}
    result.stderr = "\n".join(line for line in lines if not line.startswith("import time:"))
    return assert_one_line_error(result), imported & HEAVY_MODULES


@pytest.mark.parametrize("override, message", [
    ("model=nonexistent", "error: In 'train': Could not find 'model/nonexistent'; "
                          "Available options in 'model': bert, bert_classifier, bert_joint,"),
    ("trainer=tpu_pod", "error: In 'train': Could not find 'trainer/tpu_pod'; Available options in 'trainer': cpu,"),
    ("model.n_headz=2", "error: Could not override 'model.n_headz'. To append to your config use +model.n_headz=2; "
                        "Key 'n_headz' is not in struct"),
    ("model.n_heads=[1,", "error: cannot parse the override 'model.n_heads=[1,': no viable alternative at input '[1,'"),
    ("model.n_heads", "error: cannot parse the override 'model.n_heads': missing EQUAL at '<EOF>'"),
    ("+trainer.max_epochs=3", "error: Could not append to config. An item is already at 'trainer.max_epochs'."),
])
def test_a_config_hydra_cannot_compose_is_one_line_and_exit_2_before_torch_loads(tmp_path, override, message):
    line, heavy = refused([ROOT / "pipelines" / "train.py", override, f"hydra.run.dir={tmp_path}"])
    assert line.startswith(message), line
    assert heavy == set()
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_every_entry_point_refuses_an_unknown_key_with_one_line_and_exit_2(entry_point, tmp_path):
    line, _ = refused([ROOT / "pipelines" / entry_point, *CHOICE.get(entry_point, []), "no_such_key=1",
                       f"hydra.run.dir={tmp_path}"])
    assert line.startswith("error: Could not override 'no_such_key'."), line


def test_a_crash_keeps_its_traceback_and_exit_1(tmp_path):
    """Only the command line's mistakes are one line: a bug in an entry point, an OmegaConf error its code
    raises included, still shows where it happened."""
    app = tmp_path / "app.py"
    app.write_text(
        "import hydra\n"
        "from transformer_lab.utils.cli import entry_point, run\n\n"
        "@hydra.main(version_base='1.3', config_path=None)\n"
        "@entry_point\n"
        "def main(cfg):\n"
        "    if cfg.crash == 'config_key':\n"
        "        return cfg.no_such_key\n"
        "    raise RuntimeError('a bug')\n\n"
        "run(main)\n")
    for crash, last_words in (("bug", "RuntimeError: a bug"), ("config_key", "Key 'no_such_key' is not in struct")):
        result = run([PYTHON, app, f"+crash={crash}", f"hydra.run.dir={tmp_path / crash}"])
        assert result.returncode == 1, result.stderr[-2000:]
        assert "Traceback (most recent call last)" in result.stderr and last_words in result.stderr
    refused_line = assert_one_line_error(run([PYTHON, app, "crash=bug", f"hydra.run.dir={tmp_path / 'no_plus'}"]))
    assert refused_line == "error: Could not override 'crash'. To append to your config use +crash=bug; " \
                           "Key 'crash' is not in struct"
    asked_for_tracebacks = run([PYTHON, app, "crash=bug", f"hydra.run.dir={tmp_path / 'no_plus'}"],
                               env={"HYDRA_FULL_ERROR": "1"})
    assert asked_for_tracebacks.returncode == 1 and "Traceback (most recent call last)" in asked_for_tracebacks.stderr


@pytest.mark.parametrize("override, message", [
    ("trainer.max_epochs=-1", "trainer.max_epochs=-1: training without an end, which the learning-rate schedules "
                              "cannot size; give a number of epochs, or +trainer.max_steps=N"),
    ("trainer.max_epochs=-2", "trainer.max_epochs=-2: expected a number of epochs, 0 or more"),
    ("trainer.max_epochs=abc", "trainer.max_epochs='abc': expected an integer or null"),
    ("+trainer.max_steps=-2", "trainer.max_steps=-2: expected a number of steps, or -1 for no limit"),
    ("data.datamodule.batch_size=0", "data.datamodule.batch_size=0: expected 1 or more examples a batch"),
    ("data.datamodule.eval_batch_size=-8", "data.datamodule.eval_batch_size=-8: expected 1 or more examples a batch"),
    ("trainer.devices=0", "trainer.devices=0: expected 1 or more, -1 (all of them) or auto"),
    ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches=0: expected 1 or more batches a step"),
    ("model.n_heads=abc", "model.n_heads='abc': expected an integer"),
    ("task.lr=fast", "task.lr='fast': expected a number"),
    ("data.datamodule.batch_size=1.5", "data.datamodule.batch_size=1.5: expected an integer"),
])
def test_settings_training_would_crash_on_are_one_line_before_data_is_read(tmp_path, override, message):
    from transformer_lab.training.train import train

    unprepared = f"data.prepared_dir={tmp_path / 'unprepared'}"  # reading the data would fail: the check comes first
    with pytest.raises(TransformerLabError) as refusal:
        train(compose_config("train", ["logger=none", unprepared, override], tmp_path / "python"))
    assert str(refusal.value) == message
    line, heavy = refused([ROOT / "pipelines" / "train.py", "logger=none", unprepared, override,
                           f"hydra.run.dir={tmp_path / 'cli'}"])
    assert line == f"error: {message}"
    assert heavy == set()


def test_bounded_settings_pass_the_checks(tmp_path):
    from transformer_lab.families import check_config

    for overrides in (["trainer.max_epochs=-1", "+trainer.max_steps=100"], ["trainer.max_epochs=0"],
                      ["trainer.max_epochs=null"], ["trainer.devices=-1"], ["trainer.devices=auto"],
                      ["experiment=tabular/tab_transformer"]):  # batch_size=auto
        check_config(compose_config("train", overrides, tmp_path))


def test_a_gpu_trainer_on_a_machine_without_one_names_the_cpu_trainers(tmp_path, monkeypatch):
    from transformer_lab.families import check_config
    from transformer_lab.utils import validate

    line, heavy = refused([ROOT / "pipelines" / "train.py", "trainer=ddp", "logger=none",
                           f"data.prepared_dir={tmp_path / 'unprepared'}", f"hydra.run.dir={tmp_path / 'cli'}"],
                          env={"CUDA_VISIBLE_DEVICES": ""})
    assert line == ("error: trainer.accelerator=gpu (trainer=ddp): this machine has no GPU; on its CPUs, "
                    "trainer=ddp_cpu (data parallel, 2 processes) or trainer=cpu")
    assert "lightning" not in heavy  # the GPU count needs torch, nothing more

    monkeypatch.setattr(validate, "gpu_count", lambda accelerator: 1)
    with pytest.raises(TransformerLabError, match=r"^trainer.devices=2 \(trainer=gpu\): this machine has 1 GPU$"):
        check_config(compose_config("train", ["trainer=gpu", "trainer.devices=2"], tmp_path))
    for trainer in ("gpu", "ddp", "fsdp"):  # devices: 1 or auto
        check_config(compose_config("train", [f"trainer={trainer}"], tmp_path))


@pytest.mark.parametrize("data, override, message", [
    ("atis_local", "data.local_dir={missing}", "{missing}: not found (data.local_dir, read with data.source=local)"),
    ("corpus", "data.local_paths=[{missing}]", "{missing}: not found (data.local_paths, read with data.source=local)"),
    ("images", "data.local_dir=null", "data.local_dir is required with data.source=local: pass data.local_dir=PATH"),
])
def test_prepare_refuses_a_missing_input_before_torch_loads(tmp_path, data, override, message):
    missing = tmp_path / "nowhere"
    line, heavy = refused([ROOT / "pipelines" / "prepare.py", f"data={data}", "data.source=local",
                           override.format(missing=missing), f"data.prepared_dir={tmp_path / 'out'}",
                           f"hydra.run.dir={tmp_path / 'run'}"])
    assert line == f"error: {message.format(missing=missing)}"
    assert heavy == set()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("entry_point, override, key, missing", [
    ("evaluate.py evaluate=atis", "train_dir={tmp}", "checkpoint", "{tmp}/checkpoints/best.ckpt"),
    ("evaluate.py evaluate=elmo", "train_dir={tmp}", "checkpoint", "{tmp}/checkpoints/best.ckpt"),
    ("evaluate.py evaluate=translation", "train_dir={tmp}", "checkpoint", "{tmp}/checkpoints/best.ckpt"),
    ("evaluate.py evaluate=vit", "train_dir={tmp}", "checkpoint", "{tmp}/checkpoints/best.ckpt"),
    ("evaluate.py evaluate=word2vec", "train_dir={tmp}", "checkpoint", "{tmp}/checkpoints/last.ckpt"),
    ("evaluate.py evaluate=tabular", "data.prepared_dir={tmp}", "data.prepared_dir", "{tmp}"),
    ("evaluate.py evaluate=multimodal", "data.prepared_dir={tmp}", "data.prepared_dir", "{tmp}"),
    ("train_baseline.py", "data.prepared_dir={tmp}", "data.prepared_dir", "{tmp}"),
    ("train_tokenizers.py", "data.prepared_dir={tmp}", "data.prepared_dir", "{tmp}"),
])
def test_a_missing_input_of_a_stage_is_one_line_before_torch_loads(tmp_path, entry_point, override, key, missing):
    tmp = tmp_path / "nowhere"
    script, *choice = entry_point.split()  # evaluate.py: and the family, evaluate=<family>
    line, heavy = refused([ROOT / "pipelines" / script, *choice, override.format(tmp=tmp), f"hydra.run.dir={tmp_path / 'run'}"])
    assert line == f"error: {missing.format(tmp=tmp)}: not found ({key})"
    assert heavy == set()


def test_a_missing_input_names_the_stage_that_writes_it(tmp_path):
    from transformer_lab.utils.validate import check_inputs

    for config, key, stage in (("evaluate evaluate=atis", "checkpoint", "train_atis"),
                               ("evaluate evaluate=word2vec", "checkpoint", "pretrain_word2vec"),
                               ("train_tokenizers", "data.prepared_dir", "prepare_corpus")):
        config, *choice = config.split()
        cfg = compose_config(config, [*choice, f"paths.root_dir={tmp_path}"], tmp_path / "run")
        (tmp_path / "dvc.yaml").write_text((ROOT / "dvc.yaml").read_text())  # the project's stages, no outputs
        with pytest.raises(TransformerLabError, match=rf": not found \({key}\); run `dvc repro {stage}`$"):
            check_inputs(cfg, key)


TASK_NAMES = ("text-classification, token-classification, question-answering, fill-mask, feature-extraction, "
              "text-generation, translation, image-classification, tabular-classification")


@pytest.mark.parametrize("entry_point, overrides, message", [
    ("predict.py", [], "give one input: text=..., question=... context=..., image=PATH or row={...}, "
                       "or a file of them: input=FILE output=FILE.jsonl"),
    ("predict.py", ["text=hi", "model={tmp}/nowhere.ckpt"],
     "model={tmp}/nowhere.ckpt: no such file or folder, MLflow run or published model"),
    ("predict.py", ["text=hi", "model={tmp}/nowhere", "+options.temperature=0"],
     "options.temperature=0: expected a number > 0 (strategy=greedy takes the argmax)"),
    ("predict.py", ["text=hi", "batch_size=0"], "batch_size=0: expected an integer >= 1"),
    ("predict.py", ["text=hi", "task=fill-mask", "+options.top_k=null"],  # fill-mask's own rule: no null
     "options.top_k=None: expected an integer >= 1"),
    ("predict.py", ["text=hi", "task=translation", "+options.beams=4"],
     "options.beams: not an option of translation; its options: num_beams, length_penalty, batch_size"),
    ("predict.py", ["text=hi", "task=tagging"], f"task=tagging: not a pipeline task; choose one of {TASK_NAMES}"),
    ("generate.py", ["checkpoint={tmp}/nowhere.ckpt"], "{tmp}/nowhere.ckpt: not found (checkpoint)"),
    ("generate.py", ["checkpoint={tmp}/nowhere.ckpt", "temperature=0"],  # the settings first
     "temperature=0: expected a number > 0 (strategy=greedy takes the argmax)"),
    ("generate.py", ["top_p=2"], "top_p=2: expected a number in (0, 1], or null (no nucleus cut)"),
    ("generate.py", ["max_new_tokens=-1"], "max_new_tokens=-1: expected an integer >= 1"),
    ("generate.py", ["num_samples=0"], "num_samples=0: expected an integer >= 1"),
    ("export.py", ["out={tmp}/hf"], "model= is required: a .ckpt, a stage's folder, runs:/ID or models:/NAME@ALIAS"),
    ("export.py", ["model={tmp}/nowhere.ckpt", "out={tmp}/hf"],
     "model={tmp}/nowhere.ckpt: no such file or folder, MLflow run or published model"),
    ("export.py", ["model={tmp}/model.ckpt", "out={tmp}/model.ckpt"],
     "out={tmp}/model.ckpt: a file, not a folder; name a new folder (or an earlier export to replace)"),
    ("export.py", ["model={tmp}/model.ckpt", "out={tmp}/hf", "format=onnx"],
     "format=onnx: only hf (a Hugging Face folder) is written"),
])
def test_a_rejected_prediction_generation_or_export_is_one_line_before_torch_loads(tmp_path, entry_point, overrides,
                                                                                 message):
    (tmp_path / "model.ckpt").write_bytes(b"not read: the call is refused before any model loads")
    line, heavy = refused([ROOT / "pipelines" / entry_point, *(o.replace("{tmp}", str(tmp_path)) for o in overrides),
                           f"hydra.run.dir={tmp_path / 'run'}"])
    assert line == f"error: {message.replace('{tmp}', str(tmp_path))}"
    assert heavy == set()
    assert not (tmp_path / "hf").exists()


def test_the_option_rules_read_before_torch_loads_are_the_pipelines_own():
    from transformer_lab.inference.options import pipeline_tasks, task_options
    from transformer_lab.inference.pipeline import PIPELINES, TASKS

    assert pipeline_tasks() == list(TASKS) == list(PIPELINES)  # "task=X: not a pipeline task; choose one of" them
    for task, pipeline_class in PIPELINES.items():
        assert task_options(task) == pipeline_class.option_rules(), task
