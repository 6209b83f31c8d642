"""What each DVC stage really executes and reads, computed, so that dvc.yaml cannot go stale.

For a stage's command this composes the Hydra config it runs with (the same defaults list Hydra
builds), collects the config files that went into it, the modules its `_target_`s name and the
project files its values point to, and follows the Python imports from the entry point and those
modules through the package (imports inside functions too). `tests/test_pipeline_deps.py` fails
when a stage's `deps` differ from that set; after adding or moving code, rewrite them with

    python -m transformer_lab.runtime.stage_deps          (what `make deps` runs)

which keeps every other dependency (prepared data, earlier stages' outputs) as it is. No stage
imports this module, so changing it reruns nothing.
"""

from __future__ import annotations

import ast
import io
import itertools
import re
import shlex
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from transformer_lab.utils.resolvers import register_resolvers

ROOT = Path(__file__).resolve().parents[3]
SRC, CONF = ROOT / "src", ROOT / "conf"
COMPUTED = ("src/", "conf/", "pipelines/")  # the dependencies this module owns; the rest are data


def expand(name: str, stage: dict) -> dict[str, tuple[dict, dict]]:
    """One stage per combination of a `matrix` (name@value), each with its item values."""
    matrix = stage.get("matrix")
    if not matrix:
        return {name: (stage, {})}
    expanded = {}
    for combination in itertools.product(*matrix.values()):
        item = dict(zip(matrix, map(str, combination)))
        text = yaml.safe_dump({k: v for k, v in stage.items() if k != "matrix"}, width=10_000)
        for key, value in item.items():
            text = text.replace("${item.%s}" % key, value)
        expanded[f"{name}@{'-'.join(item.values())}"] = (yaml.safe_load(text), item)
    return expanded


def stages(dvc_yaml: Path = ROOT / "dvc.yaml") -> dict[str, dict]:
    """dvc.yaml's stages, a `matrix` expanded into one stage per combination."""
    found = {}
    for name, stage in yaml.safe_load(dvc_yaml.read_text())["stages"].items():
        found.update({key: expanded for key, (expanded, _) in expand(name, stage).items()})
    return found


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
    tree = ast.parse(path.read_text())
    # A module's `__getattr__` (PEP 562: the package's lazy `transformer_lab.pipeline`) imports only
    # when that attribute is read, which no stage does: importing the package does not run it.
    lazy = {id(n) for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "__getattr__" for n in ast.walk(f)}
    for node in ast.walk(tree):
        if id(node) in lazy:
            continue
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


def _walk(node, found: list) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            (found.append(("target", value)) if key == "_target_" else _walk(value, found))
    elif isinstance(node, list):
        for value in node:
            _walk(value, found)
    elif isinstance(node, str):
        found.append(("value", node))


def what_a_stage_reads(command: str, stage_name: str) -> set[Path]:
    """The project files (sources, configs, files a config points to) that `command` executes or reads."""
    import os

    import transformer_lab.families  # noqa: F401  (metric_mode, as training registers it)

    register_resolvers()
    os.environ.setdefault("PROJECT_ROOT", str(ROOT))
    previous, os.environ["DVC_STAGE"] = os.environ.get("DVC_STAGE"), stage_name
    try:
        script, *overrides = shlex.split(command)[1:]
        config_name = re.search(r'config_name="(\w+)"', (ROOT / script).read_text()).group(1)
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            loader = GlobalHydra.instance().hydra.config_loader
            defaults = loader.compute_defaults_list(config_name, overrides, RunMode.RUN).defaults
            cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)
            files = {CONF / f"{d.config_path}.yaml" for d in defaults if (CONF / f"{d.config_path}.yaml").is_file()}
            found = []
            _walk(OmegaConf.to_container(cfg, resolve=False), found)  # hydra.callbacks included
            resolved = []
            for key in (k for k in cfg if k != "hydra" and not OmegaConf.is_missing(cfg, k)):
                node = cfg[key]
                _walk(OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node, resolved)
    finally:
        os.environ.pop("DVC_STAGE") if previous is None else os.environ.update(DVC_STAGE=previous)
    # a `_target_`'s module, and the packages above it: importing it runs their __init__.py first
    targets = [v.rsplit(".", 1)[0].split(".") for kind, v in found if kind == "target"]
    modules = {module_file(".".join(parts[:i])) for parts in targets for i in range(1, len(parts) + 1)}
    # values that name a file of the project's own (a table schema, a builtin data file): read at run time
    pointed = {Path(v).resolve() for kind, v in resolved if kind == "value" and "/" in v and len(v) < 300}
    pointed = {p for p in pointed if p.is_file() and (p.is_relative_to(CONF) or p.is_relative_to(SRC))}
    reads = closure({ROOT / script, *(m for m in modules if m)}) | files | pointed
    if config_name == "study":
        reads |= what_a_study_runs(cfg, stage_name)
    return reads


def modules_above(dotted: str) -> set[Path]:
    """The module of a dotted name (a.b.c.function) and the packages above it: importing it runs them."""
    parts = dotted.rsplit(".", 1)[0].split(".")
    return {m for m in (module_file(".".join(parts[:i])) for i in range(1, len(parts) + 1)) if m}


def what_a_study_runs(cfg, stage_name: str) -> set[Path]:
    """A study's stage also runs its data steps and every variant's training (its pre-training too, or
    its baseline runner), on the real data and on the embedded fallback alike (which one runs depends
    on the machine, the stage's deps must not)."""
    from omegaconf import open_dict

    from transformer_lab.studies.jobs import pretrain_overrides, train_overrides, variant_spec, with_fallback

    reads: set[Path] = set()
    study = cfg.study
    extra = (study.get("figure") or {}).get("extra")  # a function drawn into the figure, named by its dotted path
    if extra:
        reads |= closure(modules_above(extra))
    for embedded in (False, True):
        for line in study.get("prepare") or []:
            if not isinstance(line, str):  # a function of the project's own, named by its dotted path
                reads |= closure(modules_above(line._target_))
                continue
            script, *overrides = shlex.split(line)
            reads |= what_a_stage_reads(shlex.join(["python3", f"pipelines/{script}",
                                                    *with_fallback(study, overrides, embedded)]), stage_name)
        for variant in study.variants:
            spec = variant_spec(study, variant)
            if spec.get("runner"):
                reads |= closure(modules_above(spec.runner._target_))
                continue
            with open_dict(cfg):
                cfg.variant = variant
            pretraining = pretrain_overrides(cfg, spec, embedded)  # a job that pre-trains first
            if pretraining is not None:
                reads |= what_a_stage_reads(shlex.join(["python3", "pipelines/train.py", *pretraining]), stage_name)
            overrides = train_overrides(cfg, spec, embedded)
            reads |= what_a_stage_reads(shlex.join(["python3", "pipelines/train.py", *overrides]), stage_name)
    return reads


def relative(paths: set[Path]) -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in paths)


def computed_deps(name: str, stage: dict) -> list[str]:
    """The stage's source and config dependencies. In a matrix stage a path named after the item's
    value becomes `${item.<key>}` (conf/experiment/tabular/${item.model}.yaml) when every combination reads
    its own such file, so that each combination depends on its files only."""
    combinations = expand(name, stage).values()
    needed = [(item, set(relative(what_a_stage_reads(expanded["cmd"], name)))) for expanded, item in combinations]
    entries: set[str] = set()
    for item, paths in needed:
        for path in paths:
            template = path
            for key, value in item.items():
                template = re.sub(rf"(?<![A-Za-z0-9]){re.escape(value)}(?![A-Za-z0-9_])", "${item.%s}" % key, template)
            every = all(_fill(template, other) in other_paths for other, other_paths in needed)
            entries.add(template if every else path)
    return sorted(entries)


def _fill(template: str, item: dict) -> str:
    for key, value in item.items():
        template = template.replace("${item.%s}" % key, value)
    return template


def write(dvc_yaml: Path = ROOT / "dvc.yaml") -> list[str]:
    """Rewrite every stage's source/config deps to the computed ones (comments and layout kept);
    returns the stages whose deps changed."""
    import ruamel.yaml

    parser = ruamel.yaml.YAML()
    parser.indent(mapping=2, sequence=4, offset=2)
    parser.width, parser.preserve_quotes = 4096, True
    document = parser.load(dvc_yaml.read_text())
    changed = []
    for name, stage in document["stages"].items():
        plain = _plain(stage)
        data = [d for d in stage.get("deps", []) if not str(d).startswith(COMPUTED)]
        new = [*data, *computed_deps(name, plain)]
        if list(stage.get("deps", [])) != new:
            stage["deps"] = new
            changed.append(name)
    buffer = io.StringIO()
    parser.dump(document, buffer)
    dvc_yaml.write_text(buffer.getvalue())
    return changed


def _plain(node):
    """ruamel's commented containers as plain dicts and lists."""
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


if __name__ == "__main__":
    for dvc_yaml in (ROOT / "dvc.yaml", ROOT / "studies" / "dvc.yaml"):
        rewritten = write(dvc_yaml)
        print(f"{dvc_yaml.relative_to(ROOT)}: deps rewritten for {len(rewritten)} stage(s)"
              + (f": {', '.join(rewritten)}" if rewritten else ""))
