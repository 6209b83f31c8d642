"""dvc.yaml cannot go stale: every stage depends on exactly the source and config files its command
executes or reads (transformer_lab.runtime.stage_deps computes them), so a change to any of them reruns that
stage and a change to any other file reruns nothing."""

import re

import pytest
import yaml
from conftest import ROOT

from transformer_lab.runtime.stage_deps import COMPUTED, expand, relative, what_a_stage_reads

STAGES = {key: (name, expanded, item) for name, stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].items()
          for key, (expanded, item) in expand(name, stage).items()}
# the studies' stages (wdir: the project root): each composes every variant's training config, so slower
STUDY_STAGES = {f"studies/dvc.yaml:{name}": (name, stage, {})
                for name, stage in yaml.safe_load((ROOT / "studies" / "dvc.yaml").read_text())["stages"].items()}


@pytest.mark.parametrize("key", [*sorted(STAGES), *(pytest.param(k, marks=pytest.mark.slow) for k in sorted(STUDY_STAGES))])
def test_every_stage_depends_on_exactly_what_it_runs_and_reads(key):
    name, stage, _ = {**STAGES, **STUDY_STAGES}[key]
    declared = {d for d in stage.get("deps", []) if d.startswith(COMPUTED)}
    needed = set(relative(what_a_stage_reads(stage["cmd"], name)))
    missing, extra = sorted(needed - declared), sorted(declared - needed)
    assert not missing and not extra, (f"{key}: dvc.yaml misses {missing} and lists {extra} that it does not read; "
                                       "`make deps` rewrites the deps")


def test_data_dependencies_are_kept_apart_from_computed_ones():
    for key, (_, stage, _) in {**STAGES, **STUDY_STAGES}.items():
        data = [d for d in stage.get("deps", []) if not d.startswith(COMPUTED)]
        assert all(re.match(r"(data|artifacts)/", d) for d in data), (key, data)


# The stages that run BERT's code: its pre-training, its fine-tunings, and the multimodal model,
# whose text tokens start from MiniLM's (BERT's) word embeddings.
RUNS_BERT = {"pretrain_bert", "finetune_sentiment", "finetune_sentiment_scratch", "finetune_sentiment_minilm",
             "finetune_pairs", "finetune_atis", "finetune_qa", "evaluate_multimodal",
             *(f"train_multimodal@{v}" for v in ("image", "text", "table", "joint", "late_fusion"))}


def test_a_change_to_bert_reruns_the_stages_that_run_bert_and_no_other():
    """dvc.yaml's deps are checked above to be what each stage runs; here, that an edit of
    models/bert.py makes exactly BERT's stages stale (the image, table, word2vec, ELMo, GPT, ViT and
    translation stages stay up to date). tests/test_dvc.py sees the same with `dvc status`."""
    depends = {key for key, (_, stage, _) in STAGES.items() if "src/transformer_lab/models/bert.py" in stage["deps"]}
    assert depends == RUNS_BERT
