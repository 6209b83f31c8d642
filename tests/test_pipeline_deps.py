"""dvc.yaml cannot go stale: every stage depends on exactly the source and config files its command
executes or reads (transformer_lab.stage_deps computes them), so a change to any of them reruns that
stage and a change to any other file reruns nothing."""

import re

import pytest
import yaml

from conftest import ROOT
from transformer_lab.stage_deps import COMPUTED, expand, relative, what_a_stage_reads

STAGES = {key: (name, expanded, item) for name, stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].items()
          for key, (expanded, item) in expand(name, stage).items()}


@pytest.mark.parametrize("key", sorted(STAGES))
def test_every_stage_depends_on_exactly_what_it_runs_and_reads(key):
    name, stage, _ = STAGES[key]
    declared = {d for d in stage.get("deps", []) if d.startswith(COMPUTED)}
    needed = set(relative(what_a_stage_reads(stage["cmd"], name)))
    missing, extra = sorted(needed - declared), sorted(declared - needed)
    assert not missing and not extra, (f"{key}: dvc.yaml misses {missing} and lists {extra} that it does not read; "
                                       "`make deps` rewrites the deps")


def test_data_dependencies_are_kept_apart_from_computed_ones():
    for key, (_, stage, _) in STAGES.items():
        data = [d for d in stage.get("deps", []) if not d.startswith(COMPUTED)]
        assert all(re.match(r"(data|artifacts)/", d) for d in data), (key, data)
