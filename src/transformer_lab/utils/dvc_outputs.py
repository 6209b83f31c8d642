"""A DVC stage that fails keeps its previous outputs.

`dvc repro` deletes a stage's outputs before it runs the command, and keeps them in its cache.
When the command fails, the outputs `dvc.lock` still records for the stage (those of its last
successful run) are copied back from the cache, so the workspace is what it was before the rerun.
`declared_outputs` lists what dvc.yaml declares, for what must not write into a stage's outputs
(export) or names the stage that writes a missing input (utils/validate.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import yaml


def _cache_file(cache_dir: Path, md5: str) -> Path:
    return cache_dir / "files" / "md5" / md5[:2] / md5[2:]


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)  # a plain copy: cache files are read-only


def _restore(output: dict, workdir: Path, cache_dir: Path) -> bool:
    path, md5 = workdir / output["path"], output.get("md5")
    if not md5:
        return False
    if md5.endswith(".dir"):
        manifest = _cache_file(cache_dir, md5)
        if not manifest.is_file():
            return False
        entries = json.loads(manifest.read_text())
        if not all(_cache_file(cache_dir, entry["md5"]).is_file() for entry in entries):
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        for entry in entries:
            _copy(_cache_file(cache_dir, entry["md5"]), staging / entry["relpath"])
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        os.replace(staging, path)
        return True
    cached = _cache_file(cache_dir, md5)
    if not cached.is_file():
        return False
    if path.is_dir():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with cached.open("rb") as source, tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.",
                                                                  delete=False) as tmp:
        shutil.copyfileobj(source, tmp)
    os.replace(tmp.name, path)
    return True


def declared_outputs(project: Path) -> list[tuple[str, str]]:
    """(stage, path) of each output, metric and plot that project/dvc.yaml declares."""
    try:
        stages = yaml.safe_load((project / "dvc.yaml").read_text()).get("stages") or {}
    except (OSError, yaml.YAMLError, AttributeError):  # DVC itself reports a dvc.yaml it cannot read
        return []
    declared = []
    for name, stage in stages.items():
        stage = stage.get("do", stage) if isinstance(stage, dict) else {}  # foreach: the stage is under do
        for entry in (*(stage.get("outs") or ()), *(stage.get("metrics") or ()), *(stage.get("plots") or ())):
            declared.append((name, entry if isinstance(entry, str) else next(iter(entry))))
    return declared


def restore_stage_outputs(stage: str, workdir: str | Path = ".", dvc_root: str | Path | None = None) -> list[str]:
    """Copy the outputs `dvc.lock` records for `stage` back from the DVC cache; returns the paths
    restored (none when the stage never succeeded or its cache is elsewhere)."""
    workdir = Path(workdir)
    lock_path = workdir / "dvc.lock"
    if not lock_path.is_file():
        return []
    recorded = (yaml.safe_load(lock_path.read_text()) or {}).get("stages", {}).get(stage)
    if not recorded:
        return []
    cache_dir = Path(dvc_root or workdir) / ".dvc" / "cache"
    return [out["path"] for out in recorded.get("outs", []) if _restore(out, workdir, cache_dir)]


def dvc_md5(path: str | Path) -> str:
    """The hash dvc.lock records for a file or folder (DVC 3, md5): a file's md5; for a folder, the
    md5 of its manifest (each file's md5 and path in it, sorted by path, as JSON) and `.dir`."""
    path = Path(path)
    if path.is_file():
        return _md5(path)
    manifest = [{"md5": _md5(file), "relpath": file.relative_to(path).as_posix()}
                for file in sorted(path.rglob("*")) if file.is_file()]
    manifest.sort(key=lambda entry: entry["relpath"])
    return hashlib.md5(json.dumps(manifest, sort_keys=True).encode()).hexdigest() + ".dir"


def _md5(file: Path) -> str:
    with open(file, "rb") as stream:
        return hashlib.file_digest(stream, "md5").hexdigest()
