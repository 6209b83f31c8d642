"""One evaluate entry point (issue 52): `python pipelines/evaluate.py evaluate=<family>` composes
conf/evaluate/<family>.yaml, whose keys sit where the family's evaluator reads them, and runs the
evaluator that file names, importing no other. Composition only: nothing here trains or evaluates."""

import ast
import json
import re
import subprocess

import pytest
import yaml
from conftest import PYTHON, ROOT, run
from omegaconf import OmegaConf

from transformer_lab.families import FAMILIES
from transformer_lab.runtime.config import compose_config
from transformer_lab.runtime.stage_deps import module_file, relative, what_a_stage_reads

ENTRY_POINT = ROOT / "pipelines" / "evaluate.py"
FAMILIES_EVALUATED = ("atis", "elmo", "glove", "multimodal", "tabular", "translation", "vit", "word2vec")
CHOICES = ", ".join(FAMILIES_EVALUATED)
# the MLflow experiment each logs into: its training's (task_name), as before the entry points were one
EXPERIMENTS = {"atis": "atis", "elmo": "elmo_pretrain", "glove": "glove", "multimodal": "multimodal",
               "tabular": "tabular", "translation": "translation", "vit": "vit", "word2vec": "word2vec"}
STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def test_the_families_are_the_files_of_conf_evaluate():
    assert sorted(p.stem for p in (ROOT / "conf" / "evaluate").glob("*.yaml")) == list(FAMILIES_EVALUATED)
    assert not list((ROOT / "pipelines").glob("evaluate_*.py")) and not list((ROOT / "conf").glob("evaluate_*.yaml"))


@pytest.mark.parametrize("args, message", [
    ([], f"error: You must specify 'evaluate', e.g, evaluate=<OPTION>; Available options: {CHOICES}"),
    (["evaluate=bert"], "error: In 'evaluate': Could not find 'evaluate/bert'; "
                        f"Available options in 'evaluate': {CHOICES}"),
])
def test_no_family_or_an_unknown_one_is_one_line_naming_the_choices(args, message, tmp_path):
    result = run([PYTHON, ENTRY_POINT, *args, f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == message
    assert not list(tmp_path.iterdir())


def test_help_names_the_families_with_or_without_one():
    general = run([PYTHON, ENTRY_POINT, "--help"])
    assert general.returncode == 0, general.stderr
    assert f"FAMILY: {CHOICES}" in general.stdout and "evaluate=FAMILY" in general.stdout
    family = run([PYTHON, ENTRY_POINT, "evaluate=vit", "--help"])
    assert family.returncode == 0, family.stderr
    assert family.stdout.startswith("transformer-lab evaluate_vit:")  # the app name: the job's, as before
    assert f"evaluate: {CHOICES}\n" in family.stdout  # Hydra's == Configuration groups ==
    assert "max_misclassified: 32" in family.stdout


@pytest.mark.parametrize("family", FAMILIES_EVALUATED)
def test_each_family_composes_what_its_evaluator_reads(family, tmp_path):
    cfg = compose_config("evaluate", [f"evaluate={family}"], tmp_path)
    # every `cfg.<key>` its evaluator reads, and what tracking/evaluations.py reads to log into MLflow
    source = module_file(f"transformer_lab.evaluation.{family}").read_text()
    keys = {re.sub(r"\.(items|get|keys|values)$", "", key) for key in re.findall(r"\bcfg\.(\w+(?:\.\w+)?)", source)}
    assert "paths.output_dir" in keys
    for key in keys | {"task_name", "paths.mlflow_tracking_uri", "paths.tracking_dir"}:
        assert OmegaConf.select(cfg, key, default="absent") != "absent", key
    assert ("models" in cfg) != ("run_reference" in cfg)  # a comparison reads each model's run, else the one trained
    assert cfg.task_name == EXPERIMENTS[family] == cfg.logger.mlflow.experiment_name
    # the function named is the one families.py names for the family with this stage (tests/test_families.py
    # imports each); found here without importing it (torch)
    evaluator = cfg.evaluator._target_
    owners = [f for f in FAMILIES.values() if f"evaluate_{family}" in f.stages]
    assert [f.evaluator for f in owners] == [evaluator]
    module, function = evaluator.rsplit(".", 1)
    assert module == f"transformer_lab.evaluation.{family}" and cfg.evaluator._partial_ is True
    tree = ast.parse(module_file(module).read_text())
    assert function in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("family", FAMILIES_EVALUATED)
def test_each_stage_runs_the_entry_point_and_imports_its_own_evaluator_only(family):
    stage = STAGES[f"evaluate_{family}"]
    assert stage["cmd"] == f"python3 pipelines/evaluate.py evaluate={family} hydra.run.dir={stage['cmd'].split('=')[-1]}"
    # DVC reads the params from the family's file, at its top level
    (params_file, keys), = (next(iter(p.items())) for p in stage["params"])
    assert params_file == f"conf/evaluate/{family}.yaml"
    settings = yaml.safe_load((ROOT / params_file).read_text())
    assert all(key in settings for key in keys), keys
    reads = set(relative(what_a_stage_reads(stage["cmd"], f"evaluate_{family}")))
    evaluators = {p for p in reads if p.startswith("src/transformer_lab/evaluation/") and not p.endswith("__init__.py")}
    assert evaluators == {f"src/transformer_lab/evaluation/{family}.py"}
    assert {"pipelines/evaluate.py", "conf/evaluate.yaml", f"conf/evaluate/{family}.yaml",
            "src/transformer_lab/evaluation/__init__.py"} <= reads


@pytest.mark.parametrize("family", FAMILIES_EVALUATED)
def test_a_run_folder_is_named_as_before(family, tmp_path):
    """hydra.job.name is the old entry point's (its <name>.log in the run folder); the run folder and
    MLflow experiment come from task_name as before."""
    result = run([PYTHON, ENTRY_POINT, f"evaluate={family}", "--cfg", "hydra"])
    assert result.returncode == 0, result.stderr
    hydra = yaml.safe_load(result.stdout)["hydra"]
    assert hydra["job"]["name"] == f"evaluate_{family}"
    assert hydra["run"]["dir"] == "${paths.root_dir}/outputs/${task_name}/runs/${now:%Y-%m-%d_%H-%M-%S}"


def test_each_family_prints_its_scores_as_before():
    """The line(s) each evaluate_<family>.py printed, from the same scores."""
    code = ("import json, sys; sys.path.insert(0, 'pipelines'); sys.argv = ['evaluate.py']\n"
            "from omegaconf import OmegaConf\n"
            "import evaluate\n"
            "cases = json.loads(sys.stdin.read())\n"
            "print(json.dumps({f: evaluate.metrics_lines(f, OmegaConf.create({'split': 'test'}), m) "
            "for f, m in cases.items()}))\n")
    cases = {"atis": {"intent_acc": 0.91234, "slot_f1": 0.8, "n_utterances": 800},
             "elmo": {"val_word_ppl": 123.456, "val_words": 5000, "neighbour_agreement": 0.123456},
             "vit": {"test/acc": 0.9, "test/macro_f1": 0.87654, "test/n_images": 12},
             "translation": {"bleu_test": 12.34, "chrf_test": 40.5, "sentences_test": 60},
             "word2vec": {"wordsim353_spearman": 0.3, "vocab_size": 5000},
             "tabular": {"xgboost": {"acc": 0.8, "macro_f1": 0.75}, "tab_mlp": {"acc": 0.7, "macro_f1": 0.6}},
             "multimodal": {"joint": {"acc": 0.9, "macro_f1": 0.85}}}
    result = subprocess.run([PYTHON, "-c", code], cwd=ROOT, input=json.dumps(cases), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = json.loads(result.stdout.strip().splitlines()[-1])
    assert lines == {
        "atis": ["test/intent_acc=0.9123 test/slot_f1=0.8000"],
        "elmo": ["val_word_ppl=123.5 val_words=5000 neighbour_agreement=0.1235"],
        "vit": ["test/acc=0.9000 test/macro_f1=0.8765 test/n_images=12.0000"],
        "translation": ["bleu_test=12.3400 chrf_test=40.5000 sentences_test=60.0000"],
        "word2vec": ["wordsim353_spearman=0.3000 vocab_size=5000.0000"],
        "tabular": [f"{'xgboost':20s} acc=0.8000 macro_f1=0.7500", f"{'tab_mlp':20s} acc=0.7000 macro_f1=0.6000"],
        "multimodal": [f"{'joint':20s} acc=0.9000 macro_f1=0.8500"],
    }
