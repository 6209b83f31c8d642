"""Studies: the verdict rule, the summary's contract, the probes against autograd, every declared
study composes, and one tiny study end to end through the real CLI, Lightning and MLflow."""

import json
import math

import pytest
import torch
from conftest import PYTHON, ROOT, TINY_BUILTIN, run, sweep_runs
from omegaconf import OmegaConf

from transformer_lab.studies import summary as study_summary
from transformer_lab.studies.jobs import sweep_every_variant, train_overrides, variant_spec, with_fallback
from transformer_lab.studies.probes import attention_statistics

STUDIES = sorted(path.stem for path in (ROOT / "conf" / "study").glob("*.yaml"))


def job(variant, seed, value, params=10, seconds=1.0, **extra):
    return {"variant": variant, "seed": seed, "value": value, "params": params, "seconds": seconds, "steps": 5,
            "metrics": {"val/score": value, **extra.pop("metrics", {})}, "curve": [], "probes": extra.pop("probes", {})}


STUDY = OmegaConf.create({
    "name": "toy", "claim": "a beats b and c", "metric": "val/score", "higher_is_better": True, "claimed": "a",
    "variants": {"a": ["x=1"], "b": ["x=2"], "c": {"overrides": ["x=3"], "group": "g", "x": 3}},
})


def test_a_claim_holds_only_beyond_the_larger_seed_spread():
    a = study_summary.variant_summary([job("a", s, v) for s, v in enumerate([0.90, 0.91, 0.92])])
    close = study_summary.variant_summary([job("b", s, v) for s, v in enumerate([0.89, 0.905, 0.92])])
    far = study_summary.variant_summary([job("c", s, v) for s, v in enumerate([0.80, 0.81, 0.82])])
    assert a["std"] == pytest.approx(0.01) and a["mean"] == pytest.approx(0.91)
    assert study_summary.compare(a, far, True)[2] == "holds"
    assert study_summary.compare(a, close, True)[2] == "not shown"
    assert study_summary.compare(far, a, True)[2] == "contradicted"
    # lower is better (a loss): the same numbers read the other way round
    assert study_summary.compare(far, a, False)[2] == "holds"
    difference, spread, _ = study_summary.compare(a, far, True)
    assert difference == pytest.approx(0.10) and spread == pytest.approx(0.01)


def test_a_diverged_run_counts_as_the_worst_score():
    stable = study_summary.variant_summary([job("a", s, v) for s, v in enumerate([3.0, 3.1, 3.2])])
    diverging = study_summary.variant_summary([job("b", 0, None), job("b", 1, 2.0), job("b", 2, 2.1)])
    assert diverging["diverged"] == 1 and diverging["seeds"] == [None, 2.0, 2.1]
    assert study_summary.compare(stable, diverging, False)[2] == "holds"  # lower mean, but a run diverged
    assert study_summary.overall(["holds", "not shown"]) == "not shown"
    assert study_summary.overall(["holds", "contradicted"]) == "contradicted"
    assert study_summary.overall(["holds", "holds"]) == "holds"


def test_the_summary_keeps_the_contract_and_judges_every_claim():
    jobs = [job("a", s, 0.9 + s / 100, metrics={"val/other": 0.5}) for s in range(3)]
    jobs += [job("b", s, 0.7 + s / 100, metrics={"val/other": 0.6}) for s in range(3)]
    jobs += [job("c", s, 0.905 + s / 100, params=20, metrics={"val/other": 0.4}) for s in range(3)]
    study = OmegaConf.merge(STUDY, {"also": [{"claim": "a beats b on other", "metric": "val/other",
                                              "higher_is_better": True, "claimed": "a", "against": ["b"]}]})
    summary = study_summary.summarise(study, jobs, command="python pipelines/study.py study=toy")
    json.dumps(summary, allow_nan=False)  # strict JSON: no NaN
    assert {"claim", "metric", "higher_is_better", "variants", "verdict"} <= set(summary)
    for variant in summary["variants"].values():
        assert {"mean", "std", "seeds", "params", "seconds"} <= set(variant)
        assert isinstance(variant["params"], int) and len(variant["seeds"]) == 3
    assert summary["variants"]["c"]["group"] == "g" and summary["variants"]["c"]["x"] == 3
    assert [c["verdict"] for c in summary["comparisons"]] == ["holds", "not shown"]
    assert summary["verdict"] == "not shown"
    assert "a vs b: +0.2 (spread 0.01) holds" in summary["verdict_line"]
    [also] = summary["also"]
    assert also["verdict"] == "contradicted" and also["comparisons"][0]["difference"] == pytest.approx(-0.1)


def test_the_figure_draws_every_panel_the_study_asks_for(tmp_path):
    from transformer_lab.studies.figure import study_figure

    curve = [{"step": 10, "seconds": 1.0, "val/score": 0.5}, {"step": 20, "seconds": 2.0, "val/score": 0.8}]
    jobs = [{**job(v, s, 0.8 + s / 100, probes={"init/grad_norm_block_0": 1.0, "init/grad_norm_block_1": 0.5,
                                                 "init/saturated_rows": 0.1}), "curve": curve}
            for v in "abc" for s in range(2)]
    study = OmegaConf.merge(STUDY, {"figure": {"curves": "val/score", "probes": ["init/saturated_rows",
                                                                                 "init/grad_norm_block_*"],
                                               "extra": "transformer_lab.studies.analysis.dot_product_variance"}})
    summary = study_summary.summarise(study, jobs)
    path = study_figure(summary, jobs, study, tmp_path / "figure.png")
    from PIL import Image

    width, height = Image.open(path).size
    assert width > 1000 and height > 600  # 3 x 2 panels


def test_attention_statistics_match_autograd_and_a_hand_computation():
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 4, 5, requires_grad=True)
    weights = scores.softmax(-1)
    weights.retain_grad()
    (weights * torch.randn(2, 3, 4, 5)).sum().backward()
    stats = attention_statistics([weights])
    assert stats["init/score_grad_norm"] == pytest.approx(scores.grad.norm().item(), rel=1e-5)
    uniform = torch.full((1, 1, 2, 4), 0.25, requires_grad=True)
    one_hot = torch.tensor([[[[1.0, 0.0, 0.0, 0.0]]]], requires_grad=True)
    assert attention_statistics([uniform])["init/attention_entropy"] == pytest.approx(math.log(4))
    assert attention_statistics([uniform])["init/saturated_rows"] == 0.0
    assert attention_statistics([one_hot])["init/saturated_rows"] == 1.0


def test_a_study_scored_at_the_end_counts_a_late_divergence():
    curve = [{"step": 10, "seconds": 1.0, "val/score": 2.0}, {"step": 20, "seconds": 2.0, "val/score": None}]
    diverged = {**job("a", 0, 2.0), "curve": curve}  # its best checkpoint scored 2.0, then the loss went to NaN
    assert study_summary.scored_at_the_end(diverged, "val/score")["value"] is None
    assert study_summary.scored_at_the_end(job("b", 0, 1.5), "val/score")["value"] == 1.5  # no curve: a baseline
    summary = study_summary.summarise(OmegaConf.merge(STUDY, {"score": "final"}), [diverged, job("b", 0, 1.5)])
    assert summary["variants"]["a"]["diverged"] == 1 and summary["score"] == "final"


def test_a_partial_study_names_the_jobs_it_lacks():
    config = OmegaConf.create({"study": STUDY, "seed": 0, "hydra": {"overrides": {"task": ["study=toy"]},
                                                                    "sweeper": {"params": {"seed": "0,1"}}}})
    ran = [job("a", 0, 1.0), job("a", 1, 1.0), job("b", 0, 1.0)]
    assert study_summary.missing_jobs(config, ran) == ["b seed=1", "c seed=0", "c seed=1"]
    config.hydra.overrides.task.append("seed=0")
    assert study_summary.missing_jobs(config, ran) == ["c seed=0"]


def test_the_probes_leave_the_training_they_measure_as_it_was():
    import lightning as L
    from torch.utils.data import DataLoader, RandomSampler

    from transformer_lab.models.blocks import TransformerBlock
    from transformer_lab.studies.probes import StudyProbes

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.block = TransformerBlock(8, 2, 16, dropout=0.1)
            self.frozen = torch.nn.Dropout(0.5).eval()  # a part kept in eval mode on purpose

        def training_step(self, batch, batch_idx):
            self.log("train/loss", 0.0)
            states, _ = self.block(batch)
            return states.pow(2).mean()

    data = torch.randn(40, 5, 8)
    loader = DataLoader(data, batch_size=4, sampler=RandomSampler(data, replacement=True, num_samples=40,
                                                                   generator=torch.Generator().manual_seed(0)))
    expected = next(iter(loader))
    loader.sampler.generator.manual_seed(0)
    task = Tiny().train()
    task.frozen.eval()
    torch.manual_seed(1)
    before = torch.rand(1)
    torch.manual_seed(1)
    stats = StudyProbes(["attention_at_init", "gradients_at_init"]).at_initialisation(
        type("Trainer", (), {"train_dataloader": loader})(), task)
    assert torch.equal(torch.rand(1), before)  # the global random stream is where it was
    assert torch.equal(next(iter(loader)), expected)  # the sampler's own generator too: the same first batch
    assert task.training and task.block.training and not task.frozen.training
    assert all(p.grad is None for p in task.parameters())
    assert stats["init/attention_entropy"] > 0 and stats["init/score_grad_norm"] > 0
    assert stats["init/grad_norm_block_0"] > 0


def test_a_study_sweeps_every_variant_it_declares_unless_some_are_named():
    swept = sweep_every_variant(["study=attention_qkv"])
    assert swept == ["--multirun", "variant='none','v','qv','kv','qkv'", "study=attention_qkv"]
    assert sweep_every_variant(["study=attention_qkv", "variant=qkv"]) == ["study=attention_qkv", "variant=qkv"]
    assert sweep_every_variant(["--help"]) == ["--help"]


def test_on_a_clone_without_the_real_data_a_study_runs_on_the_embedded_data(tmp_path):
    study = OmegaConf.create({"shared_data": str(tmp_path / "absent"), "fallback": {"data=atis_local": "data=atis"},
                              "base": ["experiment=atis/full", "data=atis_local"], "variants": {"a": []}})
    assert with_fallback(study, list(study.base)) == ["experiment=atis/full", "data=atis"]
    study.shared_data = str(tmp_path)
    assert with_fallback(study, list(study.base)) == ["experiment=atis/full", "data=atis_local"]


def test_a_variant_trains_with_the_base_then_its_group_then_its_own_overrides():
    cfg = OmegaConf.create({"seed": 1, "task_name": "study/toy", "study": {
        "base": ["experiment=atis/full"], "group_overrides": {"g": ["model.d_model=64", "data=atis_local"]},
        "fallback": {"data=atis_local": "data=atis"}, "shared_data": "/nonexistent", "variants": {}}})
    spec = OmegaConf.create({"overrides": ["model.n_heads=2"], "group": "g"})
    assert train_overrides(cfg, spec)[:5] == ["experiment=atis/full", "model.d_model=64", "data=atis",
                                              "model.n_heads=2", "seed=1"]


@pytest.mark.slow  # every variant's training config, composed: a minute (test_pipeline_deps composes them too)
@pytest.mark.parametrize("name", STUDIES)
def test_every_variant_of_every_study_composes_and_passes_the_config_checks(name, tmp_path):
    from hydra.core.global_hydra import GlobalHydra

    from transformer_lab.families import check_config
    from transformer_lab.runtime.config import compose_config

    cfg = compose_config("study", [f"study={name}", "variant=x"], tmp_path)
    assert cfg.study.name == name and cfg.study.claimed in cfg.study.variants
    for claim in [cfg.study, *(cfg.study.get("also") or [])]:
        assert claim.claimed in cfg.study.variants
        assert set(claim.get("against") or []) <= set(cfg.study.variants)
    for variant in cfg.study.variants:
        spec = variant_spec(cfg.study, variant)
        if spec.get("runner"):
            assert spec.runner._target_.startswith("transformer_lab.studies.baselines.")
            continue
        GlobalHydra.instance().clear()
        cfg.variant = variant
        check_config(compose_config("train", train_overrides(cfg, spec), tmp_path))
        GlobalHydra.instance().clear()


TINY_STUDY = """# @package _global_
study:
  name: tiny
  claim: Two blocks fill slots better than one.
  metric: val/slot_f1
  higher_is_better: true
  claimed: two
  prepare: [prepare.py data.prepared_dir={prepared} {tiny}]
  base: [experiment=atis/builtin, data.prepared_dir={prepared}, trainer.max_epochs=1, ++trainer.limit_train_batches=3,
         ++trainer.limit_val_batches=1]
  probes: [attention_at_init, gradients_at_init]
  figure: {{curves: val/slot_f1, probes: [init/attention_entropy, "init/grad_norm_block_*"]}}
  variants:
    one: [model.n_layers=1]
    two: [model.n_layers=2]
    all_O:
      runner: {{_target_: transformer_lab.studies.baselines.constant_tagger, prepared_dir: {prepared}}}
"""


@pytest.mark.slow
def test_a_study_runs_as_one_multirun_under_one_mlflow_parent_and_writes_its_verdict(tmp_path):
    conf = tmp_path / "conf" / "study"
    conf.mkdir(parents=True)
    prepared = tmp_path / "prepared"
    (conf / "tiny.yaml").write_text(TINY_STUDY.format(prepared=prepared, tiny=" ".join(TINY_BUILTIN)))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    done = run([PYTHON, "pipelines/study.py", "--config-dir", tmp_path / "conf", "study=tiny",
                "variant=one,two,all_O", "seed=0,1", f"out_dir={tmp_path / 'studies' / 'tiny'}",
                f"hydra.sweep.dir={tmp_path / 'sweep'}"], env={"MLFLOW_TRACKING_URI": uri}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "studies" / "tiny" / "summary.json").read_text())
    assert summary["verdict"] in ("holds", "not shown", "contradicted")
    assert set(summary["variants"]) == {"one", "two", "all_O"}
    assert summary["variants"]["all_O"]["mean"] == 0.0 and summary["variants"]["all_O"]["params"] == 0
    assert summary["variants"]["two"]["params"] > summary["variants"]["one"]["params"]
    assert len(summary["variants"]["one"]["seeds"]) == 2
    probes = summary["variants"]["two"]["probes"]
    assert 0 < probes["init/attention_entropy"] and "init/grad_norm_block_1" in probes
    assert (tmp_path / "studies" / "tiny" / "figure.png").stat().st_size > 10_000
    assert f"study tiny: {summary['verdict']}" in done.stdout
    parent, children = sweep_runs(uri, "study/tiny")
    assert len(children) == 6 and parent.info.status == "FINISHED"
    assert parent.data.tags["verdict"] == summary["verdict"]
    assert summary["mlflow"]["parent_run_id"] == parent.info.run_id
    assert {c.data.tags["mlflow.parentRunId"] for c in children if "mlflow.parentRunId" in c.data.tags} == \
        {parent.info.run_id}
