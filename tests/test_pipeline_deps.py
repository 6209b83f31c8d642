"""dvc.yaml cannot go stale: every stage depends on every file its command executes or reads.

For each stage the test composes the stage command's Hydra config (the same defaults list Hydra
builds), collects the config files that went into it, the modules its `_target_`s name and the
files its values point to, follows the Python imports from the entry point and from those
modules through the project's package, and fails naming every file the stage does not declare
as a dependency (a file, a folder holding it, or a params file)."""

import ast
import itertools
import re
import shlex
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from conftest import ROOT
from transformer_lab.utils.resolvers import register_resolvers

register_resolvers()
import transformer_lab.families  # noqa: E402,F401  (metric_mode, as training registers it)
SRC = ROOT / "src"
CONF = ROOT / "conf"


def stages() -> dict[str, dict]:
    """dvc.yaml's stages, a `matrix` expanded into one stage per combination."""
    expanded = {}
    for name, stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].items():
        matrix = stage.pop("matrix", None)
        if not matrix:
            expanded[name] = stage
            continue
        for combination in itertools.product(*matrix.values()):
            text = yaml.safe_dump(stage, width=10_000)
            for key, value in zip(matrix, combination):
                text = text.replace("${item.%s}" % key, str(value))
            expanded[f"{name}@{'-'.join(map(str, combination))}"] = yaml.safe_load(text)
    return expanded


def module_file(name: str) -> Path | None:
    if name == "_project":
        return ROOT / "pipelines" / "_project.py"
    if name.split(".")[0] != "transformer_lab":
        return None
    base = SRC.joinpath(*name.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def imported_modules(path: Path) -> set[str]:
    """Every module an import statement in `path` names, inside functions too, and its parent packages."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return {".".join(n.split(".")[:i]) for n in names for i in range(1, n.count(".") + 2)}


def closure(start: set[Path]) -> set[Path]:
    seen, todo = set(), list(start)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo += [f for f in map(module_file, imported_modules(path)) if f is not None]
    return seen


def walk(node, found: list) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            (found.append(("target", value)) if key == "_target_" else walk(value, found))
    elif isinstance(node, list):
        for value in node:
            walk(value, found)
    elif isinstance(node, str):
        found.append(("value", node))


def what_a_stage_reads(command: str) -> set[Path]:
    script, *overrides = shlex.split(command)[1:]
    config_name = re.search(r'config_name="(\w+)"', (ROOT / script).read_text()).group(1)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().hydra.config_loader
        defaults = loader.compute_defaults_list(config_name, overrides, RunMode.RUN).defaults
        cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        files = {CONF / f"{d.config_path}.yaml" for d in defaults if (CONF / f"{d.config_path}.yaml").is_file()}
        found = []
        walk(OmegaConf.to_container(cfg, resolve=False), found)  # hydra.callbacks included
        resolved = []
        for key in (k for k in cfg if k != "hydra"):
            node = cfg[key]
            walk(OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node, resolved)
    modules = {module_file(v.rsplit(".", 1)[0]) for kind, v in found if kind == "target"}
    # values that name a file of the project's own (a table schema, a builtin data file): read at run time
    pointed = {Path(v).resolve() for kind, v in resolved if kind == "value" and "/" in v and len(v) < 300}
    pointed = {p for p in pointed if p.is_file() and (p.is_relative_to(CONF) or p.is_relative_to(SRC))}
    return closure({ROOT / script, *(m for m in modules if m)}) | files | pointed


def declared(stage: dict) -> tuple[set[Path], set[Path]]:
    paths = {ROOT / d for d in stage.get("deps", [])}
    for entry in stage.get("params", []):
        paths |= {ROOT / f for f in (entry if isinstance(entry, dict) else {"params.yaml": None})}
    return {p for p in paths if p.is_dir()}, {p for p in paths if not p.is_dir()}


@pytest.mark.parametrize("name", sorted(stages()))
def test_every_stage_depends_on_all_it_runs_and_reads(name, monkeypatch):
    monkeypatch.setenv("PROJECT_ROOT", str(ROOT))
    monkeypatch.setenv("DVC_STAGE", name)
    stage = stages()[name]
    folders, files = declared(stage)
    needed = what_a_stage_reads(stage["cmd"])
    missing = sorted(str(p.relative_to(ROOT)) for p in needed
                     if p not in files and not any(p.is_relative_to(folder) for folder in folders))
    assert not missing, f"{name} runs or reads these but dvc.yaml does not list them: {missing}"
