"""The family registry is the one place a family is declared: it names classes that exist, covers every
task config and DVC stage, says everything shared code reads of a family (its evaluator, how pipeline()
reads it, how it is exported), none of it left out, and a combination no family declares is one line
before anything is built."""

import dataclasses
import importlib
import sys

import pytest
import yaml
from conftest import PYTHON, ROOT, run
from hydra.utils import get_class, get_method

from transformer_lab.errors import TransformerLabError
from transformer_lab.families import FAMILIES, Export, Family, Pipelines, Preprocessor, check_combination, metric_mode


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_names_classes_and_functions_that_exist(name):
    family = FAMILIES[name]
    for target in (family.model, family.config, family.task, family.datamodule):
        assert get_class(target)
    datamodule = get_class(family.datamodule)
    assert callable(datamodule.model_kwargs)  # FamilyDataModule: model_kwargs() and a preprocessor
    # declared on the class (built in __init__, or a property): a Preprocessor, to_state / from_state
    assert issubclass(preprocessor_class(family), Preprocessor)
    if family.evaluator:
        assert callable(get_method(family.evaluator))
    assert family.metrics and all(m.mode in ("min", "max") for m in family.metrics)


def preprocessor_class(family):
    """The family's preprocessor class, as its datamodule declares it."""
    datamodule = get_class(family.datamodule)
    declared = datamodule.__annotations__.get("preprocessor") or datamodule.preprocessor.fget.__annotations__["return"]
    return eval(declared, vars(sys.modules[datamodule.__module__]))


def test_a_family_cannot_leave_out_what_shared_code_reads():
    """Every field of an entry is given: a family with no evaluator, pipeline task or export says so
    (None), so that an entry written without one is an error when families.py is read, not a family
    that silently has none."""
    for field in dataclasses.fields(Family):
        assert field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING, field.name
    declared = {f.name: getattr(FAMILIES["image_classification"], f.name) for f in dataclasses.fields(Family)}
    for left_out in ("evaluator", "pipelines", "export"):
        with pytest.raises(TypeError, match=left_out):
            Family(**{k: v for k, v in declared.items() if k != left_out})
    for family in FAMILIES.values():
        assert family.evaluator is None or isinstance(family.evaluator, str)
        assert family.pipelines is None or isinstance(family.pipelines, Pipelines)
        assert family.export is None or isinstance(family.export, Export)
    # a pipeline declaration with no task, or one that leaves out what its task reads, is refused
    with pytest.raises(ValueError, match="no task"):
        Pipelines(())
    with pytest.raises(ValueError, match="tagger= goes with token-classification"):
        Pipelines(("token-classification",))
    with pytest.raises(ValueError, match="body= goes with feature-extraction"):
        Pipelines(("text-classification",), body="model.bert")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_what_a_family_declares_for_pipelines_and_export_exists(name):
    """Each pipeline task is one pipeline.py has (read from its source, as predict.py checks a task=);
    feature extraction reads a declared BERT body or the task's own features(); an export names a
    `transformers` class, a converter module with what export.py calls, the preprocessor's labels
    and the function that writes what the class does not hold."""
    from transformer_lab.inference.options import pipeline_tasks

    family = FAMILIES[name]
    if family.pipelines:
        assert set(family.pipelines.tasks) <= set(pipeline_tasks()), family.pipelines.tasks
        if "feature-extraction" in family.pipelines.tasks and family.pipelines.body is None:
            assert callable(get_class(family.task).features)
    if family.export:
        transformers = pytest.importorskip("transformers")
        assert isinstance(getattr(transformers, family.export.architecture), type)
        converter = importlib.import_module(family.export.converter)
        assert all(callable(getattr(converter, f)) for f in ("config", "state_dict", "tokenizer"))
        if family.export.labels:
            fields = {f.name for f in dataclasses.fields(preprocessor_class(family))}
            assert family.export.labels in fields
        if family.export.beside:
            assert callable(get_method(family.export.beside))


def test_the_models_no_family_trains_name_loaders_that_exist_and_every_pipeline_task_has_a_model():
    from transformer_lab.inference.pipeline import NOT_FAMILIES, TASKS

    for loader, _ in NOT_FAMILIES.values():
        assert get_class(loader)
    assert all(TASKS.values()), TASKS


def test_reading_the_registry_imports_no_family_code():
    """Neither the registry nor the pipeline, serving and export modules that read it import a model,
    a datamodule, training or an evaluator: runtime/stage_deps.py follows imports, and a class named
    in the registry by its path is no dependency of the stages that read it, so a change to
    models/bert.py reruns BERT's stages only."""
    code = ("import sys, transformer_lab.families, transformer_lab.inference.pipeline, "
            "transformer_lab.inference.served, transformer_lab.inference.export; "
            "print(sorted(m for m in sys.modules if m.startswith(('transformer_lab.models', 'transformer_lab.data', "
            "'transformer_lab.training', 'transformer_lab.evaluation'))))")
    result = run([PYTHON, "-c", code])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


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
