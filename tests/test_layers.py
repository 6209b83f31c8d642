"""The package's layers import one way: a lower layer never imports an upper one, and layers of one
level never import each other. This is what keeps a stage's computed DVC dependencies to the code it
runs (runtime/stage_deps.py follows imports, inside functions too), so that a change to BERT reruns
BERT's stages and nothing else."""

import ast
import sys
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "src" / "transformer_lab"
# Lowest first. A module may import its own layer's modules and those of lower levels only.
LEVELS = [
    {"errors"},
    {"utils"},
    {"models", "data", "families", "tracking"},
    {"tasks"},
    {"inference"},
    {"training"},
    {"evaluation"},
    {"studies"},
    {"runtime"},
]
# models/ is the pure-PyTorch floor: nothing of the project but models/, not even errors (checked
# below). serving.py only keeps models logged before inference/served.py loadable: nothing imports it.
EXCEPTIONS = {"serving": "runtime"}


def level(layer: str) -> int:
    layer = EXCEPTIONS.get(layer, layer)
    return next(i for i, names in enumerate(LEVELS) if layer in names)


def layer_of(module: str) -> str | None:
    """transformer_lab.tasks.gpt -> tasks; transformer_lab.errors -> errors; transformer_lab -> None."""
    parts = module.split(".")
    return parts[1] if parts[0] == "transformer_lab" and len(parts) > 1 else None


def project_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every project import in `path`, inside functions too, except those of a
    module's `__getattr__` (PEP 562), which run only when that attribute is read."""
    tree = ast.parse(path.read_text())
    lazy = {id(n) for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "__getattr__" for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if id(node) in lazy:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{alias.name}" if node.module == "transformer_lab" else node.module)
                      for alias in node.names]
    return [(line, module) for line, module in found if module.startswith("transformer_lab.")]


def violations() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative == Path("__init__.py"):
            continue
        own = relative.parts[0].removesuffix(".py")
        for line, module in project_imports(path):
            other = layer_of(module)
            if other is None or other == own:
                continue
            where = f"src/transformer_lab/{relative}:{line} imports {module}"
            if own == "models":
                found.append(f"{where}: models/ imports nothing of the project but models/")
            elif level(other) > level(own):
                found.append(f"{where}: upward ({own} is below {other})")
            elif level(other) == level(own):
                found.append(f"{where}: sideways ({own} and {other} are one level)")
    return found


def test_every_module_imports_only_its_own_layer_and_lower_ones():
    assert violations() == []


def test_every_folder_of_the_package_has_a_level():
    layers = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
              if (p.is_dir() and (p / "__init__.py").is_file()) or (p.suffix == ".py" and p.name != "__init__.py")}
    for layer in layers:
        level(layer)  # StopIteration: a new folder or root module the table does not place


def test_the_check_finds_an_upward_import(tmp_path, monkeypatch):
    """The walk sees an import inside a function, and an upward one is reported."""
    source = "def f():\n    from transformer_lab.inference.pipeline import pipeline\n"
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.py").write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert violations() == ["src/transformer_lab/data/x.py:2 imports transformer_lab.inference.pipeline: "
                            "upward (data is below inference)"]
