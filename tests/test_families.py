"""The family registry is the one place a family is declared: it names classes that exist, covers every
task config and DVC stage, and a combination no family declares is one line before anything is built."""

import sys

import pytest
import yaml
from conftest import PYTHON, ROOT, run
from hydra.utils import get_class, get_method

from transformer_lab.errors import TransformerLabError
from transformer_lab.families import FAMILIES, Preprocessor, check_combination, metric_mode


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_names_classes_and_functions_that_exist(name):
    family = FAMILIES[name]
    for target in (family.model, family.config, family.task, family.datamodule):
        assert get_class(target)
    datamodule = get_class(family.datamodule)
    assert callable(datamodule.model_kwargs)  # FamilyDataModule: model_kwargs() and a preprocessor
    # declared on the class (built in __init__, or a property): a Preprocessor, to_state / from_state
    declared = datamodule.__annotations__.get("preprocessor") or datamodule.preprocessor.fget.__annotations__["return"]
    assert issubclass(eval(declared, vars(sys.modules[datamodule.__module__])), Preprocessor)
    if family.evaluator:
        assert callable(get_method(family.evaluator))
    assert family.metrics and all(m.mode in ("min", "max") for m in family.metrics)


def test_every_task_config_and_dvc_stage_belongs_to_a_family():
    tasks = {yaml.safe_load(p.read_text())["_target_"] for p in (ROOT / "conf" / "task").glob("*.yaml")}
    assert tasks == {f.task for f in FAMILIES.values()}
    stages = set(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])
    assert {s for f in FAMILIES.values() for s in f.stages} == stages


def test_a_metric_has_one_mode_and_an_unknown_metric_is_refused():
    assert metric_mode("val/loss") == "min" and metric_mode("val/slot_f1") == "max"
    with pytest.raises(TransformerLabError, match="no family declares it"):
        metric_mode("val/slot_f2")
    with pytest.raises(TransformerLabError, match="not a metric of image_classification"):
        FAMILIES["image_classification"].metric("val/slot_f1")


def test_a_model_of_another_family_is_refused_by_name():
    family = FAMILIES["joint_intent_slot"]
    with pytest.raises(TransformerLabError, match=r"model=gpt \(GPTConfig\) does not fit task=joint_intent_slot"):
        check_combination(family.task, FAMILIES["gpt_pretraining"].config, family.datamodule,
                          {"model": "gpt", "task": "joint_intent_slot"})


def test_a_wrong_pair_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    result = run([PYTHON, ROOT / "pipelines" / "train.py", "model=vit", "logger=none", f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: model=vit (ViTConfig) does not fit task=joint_intent_slot: it trains "
                                     "JointIntentSlotConfig; pick an experiment (experiment=NAME) or a matching model=")
    result = run([PYTHON, ROOT / "pipelines" / "train.py", "optimized_metric=val/acc", "logger=none",
                  f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 2 and "optimized_metric=val/acc: not a metric of joint_intent_slot" in result.stderr
