"""The bootstrap every entry point calls first, `_project.bootstrap()`: the project root (where conf/
is found), the project's own Python, the warm interpreter of `make run`, and an allocator that keeps
freed memory for the next step (utils/memory.py). Importing this module does nothing.
`.venv/bin/dvc repro` runs each stage command with the first `python` on PATH, which need not be
the project's; such a Python hands the command over to `.venv/bin/python`."""

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def _use_project_python() -> None:
    if all(importlib.util.find_spec(name) for name in ("hydra", "transformer_lab")):
        return
    # A queued `dvc exp run` works in a temporary copy without .venv; DVC_ROOT names the project.
    roots = [ROOT, *([Path(os.environ["DVC_ROOT"])] if os.environ.get("DVC_ROOT") else [])]
    venv_python = next((p for p in (r / ".venv" / "bin" / "python" for r in roots) if p.is_file()), None)
    if venv_python and not os.environ.get("TRANSFORMER_LAB_HANDED_OVER"):
        os.environ["TRANSFORMER_LAB_HANDED_OVER"] = "1"  # once: a broken .venv must not loop
        os.execv(venv_python, [str(venv_python), *sys.argv])
    print(f"error: {sys.executable} lacks the project's packages: run `make install`, then "
          "`source .venv/bin/activate` (or call .venv/bin/python)", file=sys.stderr)
    sys.exit(2)


def _hand_over_to_warm_interpreter() -> None:
    # under `python -m transformer_lab.runtime.warm_start dvc repro` (make run): no imports of our own here
    from transformer_lab.runtime.warm_start import hand_over

    hand_over(sys.argv[0])

def _keep_freed_memory() -> None:
    # here, not in the warm interpreter: a stage run cold gets it too (utils/memory.py)
    from transformer_lab.utils.memory import keep_freed_memory

    keep_freed_memory()

def bootstrap() -> None:
    """Before the entry point imports anything of the project's: in this order, since the warm
    interpreter runs the stage only once it is known to be the project's Python."""
    os.environ.setdefault("PROJECT_ROOT", str(ROOT))
    _use_project_python()
    _hand_over_to_warm_interpreter()
    _keep_freed_memory()
