"""Shared DVC storage: what one person reproduces and pushes, a colleague pulls instead of
recomputing, experiments included. A tiny pipeline, the project's DVC config, the real `dvc`."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow
DVC = str(Path(sys.executable).parent / "dvc")

PIPELINE = """
stages:
  prepare:
    cmd: python3 prepare.py
    deps: [prepare.py]
    params: [prepare.rows]
    outs: [rows.txt]
  train:
    cmd: python3 train.py
    deps: [train.py, rows.txt]
    params: [train.lr]
    outs: [model.bin]
    metrics: [{metrics.json: {cache: false}}]
"""
PREPARE = """import yaml
rows = yaml.safe_load(open("params.yaml"))["prepare"]["rows"]
open("rows.txt", "w").write("".join(f"{i}\\n" for i in range(rows)))
"""
TRAIN = """import json, yaml
lr = yaml.safe_load(open("params.yaml"))["train"]["lr"]
score = round(lr * len(open("rows.txt").readlines()), 6)
open("model.bin", "w").write(str(score))
json.dump({"score": score}, open("metrics.json", "w"))
"""


def sh(cwd: Path, *args: str) -> str:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{' '.join(args)}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def git(cwd: Path, *args: str) -> str:
    return sh(cwd, "git", "-c", "user.name=t", "-c", "user.email=t@t", *args)


def test_push_then_a_fresh_clone_pulls_instead_of_recomputing(tmp_path):
    team = tmp_path / "team"
    project = team / "project"
    project.mkdir(parents=True)
    git(project, "init", "-q", "-b", "main")
    sh(project, DVC, "init", "-q")
    shutil.copy(ROOT / ".dvc" / "config", project / ".dvc" / "config")  # the project's default remote
    for name, text in (("dvc.yaml", PIPELINE), ("prepare.py", PREPARE), ("train.py", TRAIN)):
        (project / name).write_text(text)
    (project / "params.yaml").write_text("prepare:\n  rows: 5\ntrain:\n  lr: 0.1\n")
    assert "remote = shared" in (project / ".dvc" / "config").read_text()
    assert "Running stage 'train'" in sh(project, DVC, "repro")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "pipeline")
    sh(project, DVC, "push")
    pushed_model = (project / "model.bin").read_text()
    storage = team / "transformer-lab-storage"  # ../../ from .dvc: beside the checkout
    assert any(path.is_file() for path in storage.rglob("*"))

    # an experiment, shared through git (its ref) and the DVC remote (its outputs)
    origin = team / "origin.git"
    git(team, "clone", "-q", "--bare", str(project), str(origin))
    git(project, "remote", "add", "origin", str(origin))
    sh(project, DVC, "exp", "run", "-q", "-n", "higher-lr", "-S", "train.lr=0.3")
    sh(project, DVC, "exp", "push", "origin", "higher-lr")

    # a colleague's fresh clone, beside the first
    clone = team / "clone"
    git(team, "clone", "-q", str(origin), str(clone))
    sh(clone, DVC, "pull")
    assert (clone / "model.bin").read_text() == pushed_model == "0.5"
    output = sh(clone, DVC, "repro")
    assert "Running stage" not in output and "up to date" in output
    assert "up to date" in sh(clone, DVC, "status")

    sh(clone, DVC, "exp", "pull", "origin", "higher-lr")
    shown = json.loads(sh(clone, DVC, "exp", "show", "--json"))
    experiments = {exp["name"]: exp for commit in shown for exp in (commit.get("experiments") or [])}
    assert "higher-lr" in experiments
    [revision] = experiments["higher-lr"]["revs"]
    assert revision["data"]["metrics"]["metrics.json"]["data"]["score"] == pytest.approx(1.5)
    sh(clone, DVC, "exp", "apply", "higher-lr")
    sh(clone, DVC, "checkout")  # its outputs come from the remote, not from a rerun
    assert (clone / "model.bin").read_text() == "1.5"
