"""A study's jobs, summed up: `studies/NAME/summary.json`, `figure.png` and the verdict.

The verdict is computed, never written: the claimed variant is compared with each variant it is
claimed to beat. A comparison *holds* where the claimed variant is better by more than the larger
of the two seed spreads (sample standard deviations), is *contradicted* where the other is better
by more than that, and is *not shown* in between. The study's verdict: holds if every comparison
holds, contradicted if any is contradicted, else not shown. A run that diverged (its metric not
finite) counts as the worst score there is.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from transformer_lab.studies.jobs import JOB_FILE, variant_spec
from transformer_lab.utils.io import atomic_write_json
from transformer_lab.utils.machine import machine

HOLDS, NOT_SHOWN, CONTRADICTED = "holds", "not shown", "contradicted"


def spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def variant_summary(jobs: list[dict]) -> dict:
    """mean, std, seeds (null where a run diverged), params, seconds and the probes' means."""
    jobs = sorted(jobs, key=lambda job: job["seed"])
    finite = [job["value"] for job in jobs if job["value"] is not None]
    summary = {"mean": statistics.fmean(finite) if finite else None, "std": spread(finite),
               "seeds": [job["value"] for job in jobs], "seed_ids": [job["seed"] for job in jobs],
               "diverged": len(jobs) - len(finite), "params": jobs[0]["params"],
               "seconds": round(statistics.fmean(job["seconds"] for job in jobs), 2)}
    names = sorted({name for job in jobs for name in job.get("metrics", {})})
    summary["metrics"] = {name: statistics.fmean(values) for name in names
                          if (values := [job["metrics"][name] for job in jobs if job["metrics"].get(name) is not None])}
    probes = [job.get("probes") or {} for job in jobs]
    numeric = sorted({key for p in probes for key, value in p.items() if isinstance(value, (int, float))})
    if numeric:
        summary["probes"] = {key: statistics.fmean(p[key] for p in probes if key in p) for key in numeric}
    loads = [p["expert_load"] for p in probes if "expert_load" in p]
    if loads:
        summary["probes"]["expert_load"] = [statistics.fmean(column) for column in zip(*loads)]
    return summary


def compare(claimed: dict, other: dict, higher_is_better: bool) -> tuple[float | None, float, str]:
    """(difference in the claimed variant's favour, the larger seed spread, the comparison's verdict)."""
    if claimed["mean"] is None or other["mean"] is None:
        if claimed["mean"] is None and other["mean"] is None:
            return None, 0.0, NOT_SHOWN
        return None, 0.0, CONTRADICTED if claimed["mean"] is None else HOLDS
    difference = (claimed["mean"] - other["mean"]) * (1 if higher_is_better else -1)
    margin = max(claimed["std"], other["std"])
    if claimed["diverged"] != other["diverged"]:  # fewer diverged runs is better whatever the mean
        return difference, margin, HOLDS if claimed["diverged"] < other["diverged"] else CONTRADICTED
    verdict = HOLDS if difference > margin else CONTRADICTED if -difference > margin else NOT_SHOWN
    return difference, margin, verdict


def overall(verdicts: list[str]) -> str:
    if verdicts and all(v == HOLDS for v in verdicts):
        return HOLDS
    return CONTRADICTED if CONTRADICTED in verdicts else NOT_SHOWN


def summarise(study: DictConfig | dict, jobs: list[dict], command: str = "",
              mlflow: dict | None = None) -> dict:
    """The summary.json of a study from its jobs' records."""
    study = OmegaConf.create(study) if isinstance(study, dict) else study
    if study.get("score", "best") == "final":
        jobs = [scored_at_the_end(job, study.metric) for job in jobs]
    by_variant: dict[str, list[dict]] = {}
    for job in jobs:
        by_variant.setdefault(job["variant"], []).append(job)
    order = [name for name in study.variants if name in by_variant]
    variants = {name: variant_summary(by_variant[name]) for name in order}
    for name in order:
        spec = variant_spec(study, name)
        variants[name].update({key: spec[key] for key in ("group", "x") if spec.get(key) is not None})
    comparisons = judge(study, variants, order)
    summary = {"claim": study.claim, "metric": study.metric, "higher_is_better": bool(study.higher_is_better),
               "score": study.get("score", "best"), "claimed": study.claimed, "variants": variants,
               "verdict": overall([c["verdict"] for c in comparisons]) if comparisons else NOT_SHOWN,
               "comparisons": comparisons, "verdict_line": verdict_line(study, comparisons),
               "command": command}
    also = []
    for claim in study.get("also") or []:  # further claims of the same runs, on other metrics
        rescored = [{**job, "value": measured[claim.metric]} for job in jobs
                    if claim.metric in (measured := {**(job.get("probes") or {}), **job["metrics"]})]
        by_name: dict[str, list[dict]] = {}
        for job in rescored:
            by_name.setdefault(job["variant"], []).append(job)
        scored = {name: variant_summary(by_name[name]) for name in order if name in by_name}
        found = judge(claim, scored, list(scored))
        also.append({"claim": claim.claim, "metric": claim.metric, "higher_is_better": bool(claim.higher_is_better),
                     "claimed": claim.claimed,
                     "variants": {name: {k: v[k] for k in ("mean", "std", "seeds")} for name, v in scored.items()},
                     "verdict": overall([c["verdict"] for c in found]) if found else NOT_SHOWN,
                     "comparisons": found, "verdict_line": verdict_line(claim, found)})
    if also:
        summary["also"] = also
    if study.get("shared_data"):
        from transformer_lab.studies.jobs import on_embedded_data

        summary["data"] = "embedded (the real data is absent)" if on_embedded_data(study) else "real"
    if study.get("finding"):
        summary["finding"] = study.finding
    if mlflow:
        summary["mlflow"] = mlflow
    return summary


def scored_at_the_end(job: dict, metric: str) -> dict:
    """The job scored by its last validation (study.score: final) instead of its best checkpoint's:
    a run that got somewhere and then diverged is a diverged run. Baselines, which have no curve,
    keep their score."""
    if not job.get("curve"):
        return job
    last = job["curve"][-1].get(metric)
    value = last if last is not None and math.isfinite(last) else None
    return {**job, "value": value, "metrics": {**job["metrics"], metric: value}}


def judge(claim: DictConfig, variants: dict, order: list[str]) -> list[dict]:
    """The claimed variant against each variant it is claimed to beat (claim.against, else all)."""
    if claim.claimed not in variants:
        return []
    against = list(claim.get("against") or [name for name in order if name != claim.claimed])
    comparisons = []
    for name in against:
        if name in variants:
            difference, margin, verdict = compare(variants[claim.claimed], variants[name], bool(claim.higher_is_better))
            comparisons.append({"variant": name, "difference": difference, "spread": margin, "verdict": verdict})
    return comparisons


def verdict_line(study: DictConfig, comparisons: list[dict]) -> str:
    """One sentence per comparison: '<claimed> vs <other>: +0.031 (spread 0.008) holds'."""
    parts = []
    for c in comparisons:
        difference = "n/a" if c["difference"] is None else f"{c['difference']:+.4g}"
        parts.append(f"{study.claimed} vs {c['variant']}: {difference} (spread {c['spread']:.2g}) {c['verdict']}")
    return "; ".join(parts)


def write_summary(summary: dict, jobs: list[dict], study: DictConfig, out_dir: Path) -> None:
    """summary.json and figure.png in out_dir; studies/README.md rewritten where out_dir is a study's own."""
    from transformer_lab.studies.figure import study_figure

    out_dir.mkdir(parents=True, exist_ok=True)
    study_figure(summary, jobs, study, out_dir / "figure.png")
    atomic_write_json(out_dir / "summary.json", summary)
    if out_dir.parent.name == "studies":
        write_index(out_dir.parent)


def study_command(config: DictConfig) -> str:
    """The command that ran the study, less the `variant=` that study.py adds when none is named."""
    from transformer_lab.studies.jobs import every_variant

    overrides = [o for o in config.hydra.overrides.task if o != every_variant(config.study.variants)]
    study = [o for o in overrides if o.startswith("study=")]
    return " ".join(["python pipelines/study.py", *study, *(o for o in overrides if o not in study)])


def declared_seeds(config: DictConfig) -> list[str]:
    """The seeds the study sweeps: the command line's `seed=` if given, else hydra.sweeper.params."""
    given = [o.split("=", 1)[1] for o in config.hydra.overrides.task if o.startswith("seed=")]
    swept = given[-1] if given else str(config.hydra.sweeper.params.get("seed", config.seed))
    return [seed.strip() for seed in swept.split(",")]


def missing_jobs(config: DictConfig, jobs: list[dict]) -> list[str]:
    """Every declared variant x seed that has no job record (not asked for, or failed)."""
    done = {(job["variant"], str(job["seed"])) for job in jobs}
    return [f"{variant} seed={seed}" for variant in config.study.variants for seed in declared_seeds(config)
            if (variant, seed) not in done]


def read_jobs(sweep_dir: str | Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(Path(sweep_dir).rglob(JOB_FILE))]


class StudySummary(Callback):
    """At the end of the study's multirun: summary.json and figure.png, also logged in the MLflow
    parent run with the verdict as its tag. Listed after the sweep record (conf/study.yaml), so it
    runs first at the end (Hydra calls end callbacks in reverse order): before the parent run ends,
    and before a failed job's exit. A study that ran every declared variant with every seed and
    lost no job writes into studies/NAME (kept in git, studies/README.md rewritten); a partial one
    (`variant=qkv seed=0`, or with failed jobs) writes into its sweep folder and leaves the
    recorded study as it was."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from transformer_lab.studies.jobs import on_embedded_data

        self.started = time.perf_counter()
        if on_embedded_data(config.study):
            print(f"study {config.study.name}: {config.study.shared_data} is absent; on the embedded data instead")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from transformer_lab.tracking.sweeps import job_outcomes, sweep_parent_run_id

        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = read_jobs(sweep_dir)
        if not jobs:
            return
        parent = sweep_parent_run_id(sweep_dir)
        command = study_command(config)
        failed = [o for o in job_outcomes(sweep_dir) if o.get("failure")]
        missing = missing_jobs(config, jobs)
        summary = summarise(config.study, jobs, command,
                            {"experiment": config.task_name, "parent_run_id": parent} if parent else None)
        root = Path(config.paths.root_dir).resolve()
        summary["sweep_dir"] = str(sweep_dir.resolve().relative_to(root)) if sweep_dir.resolve().is_relative_to(root) \
            else str(sweep_dir)
        summary["jobs"] = len(jobs)
        if failed:
            summary["failed_jobs"] = [f"{' '.join(o['overrides'])}: {o['failure']}" for o in failed]
        if missing:
            summary["missing_jobs"] = missing
        if getattr(self, "started", None) is not None:
            summary["seconds_total"] = round(time.perf_counter() - self.started, 1)  # wall time, data steps included
        summary["machine"] = {**machine(), "command": command}
        complete = not failed and not missing
        out_dir = Path(config.out_dir) if complete else sweep_dir
        write_summary(summary, jobs, config.study, out_dir)
        print(f"\nstudy {config.study.name}: {summary['verdict']}  ({summary['verdict_line']})"
              + (f"  {summary['seconds_total'] / 60:.1f} min" if "seconds_total" in summary else ""))
        for name, v in summary["variants"].items():
            mean = "diverged" if v["mean"] is None else f"{v['mean']:.4f} ± {v['std']:.4f}"
            print(f"  {name:<16} {config.study.metric} {mean}   {v['params']:>9,} params   {v['seconds']:.0f} s")
        print(f"  summary  {out_dir / 'summary.json'}\n  figure   {out_dir / 'figure.png'}")
        if not complete:
            print(f"  partial ({len(missing)} of the declared jobs not run, {len(failed)} failed): "
                  f"{config.out_dir} keeps its recorded study")
        if parent:
            self.record_in_parent(config, parent, out_dir, summary)

    @staticmethod
    def record_in_parent(config: DictConfig, run_id: str, out_dir: Path, summary: dict) -> None:
        from mlflow import MlflowClient

        client = MlflowClient(config.paths.mlflow_tracking_uri)
        client.set_tag(run_id, "verdict", summary["verdict"])
        client.set_tag(run_id, "claim", summary["claim"][:5000])
        for name in ("summary.json", "figure.png"):
            if (out_dir / name).is_file():
                client.log_artifact(run_id, str(out_dir / name))
        for name, v in summary["variants"].items():
            if v["mean"] is not None and math.isfinite(v["mean"]):
                client.log_metric(run_id, "mean/" + re.sub(r"[^\w\-. :/]", "_", name), v["mean"])  # MLflow's name rules


def write_index(studies_dir: str | Path) -> Path:
    """studies/README.md: every study that has a summary, its claim, verdict, spread and figure (a
    table generated from the summaries, rewritten whenever a study ends)."""
    studies_dir = Path(studies_dir)
    lines = ["# Studies: the course's claims, measured", "",
             "Generated from `studies/*/summary.json` when a study ends (`python pipelines/study.py study=NAME`,",
             "or every study: `dvc repro studies/dvc.yaml`). A verdict *holds* where the claimed variant is better",
             "by more than the larger seed spread (sample SD over 3 seeds), *contradicted* where the other way",
             "round, *not shown* in between; `make report` shows them beside every family's results. With three",
             "seeds this is a modest bar (a difference beyond the seed-to-seed scatter, not a significance test):",
             "read *holds* as 'shown at this size', and every figure with its spread.", "",
             "| study | claim | verdict | claimed vs others (difference, spread) | figure |", "|---|---|---|---|---|"]
    for path in sorted(studies_dir.glob("*/summary.json")):
        summary = json.loads(path.read_text())
        name = path.parent.name
        cell = summary.get("verdict_line", "").replace("|", "/") or "(the claimed variant was not run)"
        lines.append(f"| [{name}]({name}/summary.json) | {summary['claim']} | **{summary['verdict']}** | {cell} "
                     f"| [figure]({name}/figure.png) |")
        for also in summary.get("also", []):
            lines.append(f"| | {also['claim']} | **{also['verdict']}** | {also.get('verdict_line', '').replace('|', '/')} | |")
    lines += ["", "Each summary's `command` reran it; its `machine` says where; its MLflow parent run is in",
              "the experiment `study/NAME` of the project's store (`make ui`)."]
    from transformer_lab.utils.io import atomic_write_text

    index = studies_dir / "README.md"
    atomic_write_text(index, "\n".join(lines) + "\n")
    return index


def summarise_again(sweep_dir: str | Path) -> Path:
    """A finished study's sweep summed up again from its job records, with the study's current
    declaration (its claims, score and figure; not its variants' settings, which the jobs ran with):
    `python -m transformer_lab.studies.summary SWEEP_DIR`."""
    import os

    from hydra import compose, initialize_config_dir

    from transformer_lab.utils.resolvers import register_resolvers

    sweep_dir = Path(sweep_dir)
    ran = OmegaConf.load(sweep_dir / "multirun.yaml")
    register_resolvers()
    root = os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parents[3]))
    with initialize_config_dir(config_dir=str(Path(root, "conf")), version_base="1.3"):
        current = compose("study", overrides=[f"study={ran.study.name}", "variant=x"])
    OmegaConf.set_struct(ran, False)
    ran.study = current.study
    ran.paths = current.paths
    ran.out_dir = current.out_dir
    ran.hydra.sweep.dir = str(sweep_dir)
    previous = Path(ran.out_dir, "summary.json")
    previous = json.loads(previous.read_text()) if previous.is_file() else {}
    callback = StudySummary()
    callback.on_multirun_end(ran)
    if previous.get("sweep_dir") and Path(ran.paths.root_dir, previous["sweep_dir"]).resolve() == sweep_dir.resolve():
        # the same sweep: its wall time and machine are the run's, not this summing up's
        summary = json.loads(Path(ran.out_dir, "summary.json").read_text())
        summary.update({key: previous[key] for key in ("seconds_total", "machine") if key in previous})
        atomic_write_json(Path(ran.out_dir, "summary.json"), summary)
    return Path(ran.out_dir)


if __name__ == "__main__":
    import sys

    summarise_again(sys.argv[1])
