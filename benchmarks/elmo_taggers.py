"""ELMo features, the paper's way: one tagger trained with and without a frozen pre-trained biLM's
mixed layers, same data, recipe and number of updates, side by side in MLflow.

    python benchmarks/elmo_taggers.py --task atis --data ../shared/data/atis \\
        --elmo artifacts/elmo/pretrain_wikitext2/checkpoints/best.ckpt --epochs 15 --seeds 0,1,2 \\
        --out benchmarks/results/elmo_taggers_atis.json
    python benchmarks/elmo_taggers.py --task conll --data ../shared/data/conll2003 --elmo CKPT ...

The tagger is the from-scratch encoder of `experiment=atis/full` (override with --set key=value); with
ELMo it is the same model with `task.elmo=CKPT`: γ·Σ s_j h_j of the biLM's layers, projected, is
added to each word embedding, the biLM frozen (models/encoder.py). Tasks and their layouts:
  atis   train/ dev/ test/ with seq.in, seq.out, label          intent_acc, slot_f1 (lower-cased, as prepared)
  conll  eng.train, eng.testa (dev) [, eng.testb] (CoNLL-2003)  slot_f1 = entity F1 (cased: capitals mark names)
CoNLL sentences have no intent; they all carry one, so the intent head learns nothing and costs nothing.

Both starts take the same --epochs (the same updates, warm-up and cosine decay); the frozen biLM
costs time, reported as train_seconds. Nothing is chosen on dev during training: the last weights
are scored once, on dev (--score dev, the default: the split to choose settings on) or, trained on
train + dev, on test (--score test). Every run is an MLflow run of the experiment
elmo_taggers_TASK (runs named TASK-START-seedS): compare them in the MLflow UI (`make ui`, or
MLFLOW_TRACKING_URI for a server). The JSON holds every run and, per start, the mean, standard
deviation, min and max over the seeds of each score; it is written after every run, and rows
already in --out (same task, data, epochs) are kept, not re-run. A bar chart of F1 per start (a
dot per seed) goes beside it (.png).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from transformer_lab.utils.machine import machine

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))

STARTS = ("none", "elmo")
SCORES = ("slot_f1", "intent_acc", "token_acc")


def read_splits(task: str, data: str) -> dict[str, list[dict]]:
    """train / dev / test in the ATIS schema ({words, slots, intent}), whatever the task's layout."""
    if task == "atis":
        from transformer_lab.data.atis import read_seq_in_dir

        return read_seq_in_dir(data)
    from transformer_lab.data.conll import read_conll_dir

    conll = read_conll_dir(data)
    splits = {ours: [{"words": s["words"], "slots": s["tags"], "intent": "sentence"} for s in conll[theirs]]
              for ours, theirs in (("train", "train"), ("dev", "validation"), ("test", "test"))}
    if not splits["test"]:  # the datamodule reads three splits; without eng.testb there is no test to score
        splits["test"] = splits["dev"]
    return splits


def run_one(args, start: str, seed: int, work: Path) -> dict:
    from transformer_lab.runtime.config import compose_config
    from transformer_lab.tasks.checkpoints import load_task
    from transformer_lab.tasks.joint_intent_slot import JointIntentSlotTask
    from transformer_lab.training.train import train

    run_dir = work / f"{args.task}-{start}-seed{seed}"
    overrides = [
        "experiment=atis/full", f"seed={seed}", f"data.prepared_dir={work / 'prepared'}",
        f"data.datamodule.train_splits={'[train,dev]' if args.score == 'test' else '[train]'}",
        f"trainer.max_epochs={args.epochs}", f"test={args.score == 'test'}",
        # no choice on dev while training: the last weights are scored, once, when training ends
        "callbacks.model_checkpoint.monitor=null", f"trainer.check_val_every_n_epoch={args.epochs + 1}",
        "callbacks.rich_progress_bar=null",
        f"task_name=elmo_taggers_{args.task}", f"logger.mlflow.run_name={args.task}-{start}-seed{seed}",
        "tracking.log_trained_model=false", "tracking.register=false",
        f"task.elmo={Path(args.elmo).resolve() if start == 'elmo' else 'null'}",
        *args.set,
    ]
    cfg = compose_config("train", overrides, run_dir)
    began = time.perf_counter()
    metrics = train(cfg)
    seconds = time.perf_counter() - began
    written = json.loads((run_dir / "metrics.json").read_text())
    prefix = "val" if args.score == "dev" else "test"
    model = load_task(run_dir / "checkpoints" / "last.ckpt", JointIntentSlotTask, "train_atis").model
    return {"start": start, "seed": seed, "train_seconds": round(seconds, 1), "epochs": written["epochs"],
            "steps": written["steps"], **{name: round(metrics[f"{prefix}/{name}"], 4) for name in SCORES},
            "params": written["params"], "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad)}


def summarise(rows: list[dict]) -> dict:
    """Per start: each score's mean, standard deviation (n-1), min and max over the seeds."""
    summary = {}
    for start in STARTS:
        group = [r for r in rows if r["start"] == start]
        if not group:
            continue
        entry = {"seeds": sorted(r["seed"] for r in group)}
        for name in (*SCORES, "train_seconds"):
            values = [r[name] for r in group]
            entry[name] = {"mean": round(statistics.fmean(values), 4),
                           "std": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
                           "min": min(values), "max": max(values)}
        summary[start] = entry
    return summary


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5, 3.5))
    starts = [s for s in STARTS if s in result["summary"]]
    for x, start in enumerate(starts):
        values = [r["slot_f1"] for r in result["runs"] if r["start"] == start]
        axis.bar(x, statistics.fmean(values), color="#9ecae1" if start == "none" else "#3182bd", width=0.6)
        axis.scatter([x] * len(values), values, color="black", s=12, zorder=3)
    axis.set_xticks(range(len(starts)), ["without ELMo" if s == "none" else "with ELMo" for s in starts])
    low = min(r["slot_f1"] for r in result["runs"])
    axis.set_ylim(max(0.0, low - 0.05), min(1.0, max(r["slot_f1"] for r in result["runs"]) + 0.02))
    axis.set_ylabel(f"{result['scored_split']} {'entity' if result['task'] == 'conll' else 'slot'} F1")
    axis.set_title(f"{result['task']}: the same tagger, {result['epochs']} epochs each", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, choices=["atis", "conll"])
    parser.add_argument("--data", required=True, help="the task's directory (layouts above)")
    parser.add_argument("--elmo", required=True, help="a `pretrain_elmo` checkpoint (.ckpt)")
    parser.add_argument("--out", required=True, help="JSON file to write (a .png beside it)")
    parser.add_argument("--epochs", type=int, default=15, help="passes over the training split, every run (default 15)")
    parser.add_argument("--seeds", default="0,1,2", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--starts", default="none,elmo", type=lambda s: s.split(","),
                        help="none (no ELMo) and/or elmo (default both)")
    parser.add_argument("--score", choices=["dev", "test"], default="dev",
                        help="dev: train on train, score dev; test: train on train + dev, score test (once)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Hydra override of both runs' training config (repeatable)")
    args = parser.parse_args(argv)
    unknown = set(args.starts) - set(STARTS)
    if unknown:
        parser.error(f"--starts: {', '.join(sorted(unknown))} not among {', '.join(STARTS)}")

    import torch

    from transformer_lab.data.atis import prepare_atis
    from transformer_lab.errors import TransformerLabError
    from transformer_lab.tasks.checkpoints import read_checkpoint
    from transformer_lab.utils.io import atomic_write_json

    out = Path(args.out)
    settings = {"task": args.task, "data": str(Path(args.data).resolve()), "epochs": args.epochs,
                "scored_split": args.score, "elmo": str(Path(args.elmo).resolve()), "overrides": args.set}
    rows = []
    if out.is_file():  # keep what an earlier run with the same settings measured
        previous = json.loads(out.read_text())
        if all(previous.get(key) == value for key, value in settings.items()):
            rows = previous["runs"]

    def record(rows: list[dict]) -> dict:
        return {**settings, "runs": rows, "summary": summarise(rows),
                "machine": {**machine(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                            "platform": platform.platform(), "torch": torch.__version__}}

    with tempfile.TemporaryDirectory(prefix="elmo-taggers-") as tmp:
        work = Path(tmp)
        try:
            if args.score == "test" and args.task == "conll" and not Path(args.data, "eng.testb").is_file():
                raise TransformerLabError(f"{Path(args.data, 'eng.testb')}: not found; --score test needs CoNLL's test file")
            splits = read_splits(args.task, args.data)
            if "elmo" in args.starts:
                read_checkpoint(args.elmo, "run `dvc repro pretrain_elmo` or pass another --elmo")
            prepare_atis(splits, work / "prepared", lowercase=args.task == "atis")
        except TransformerLabError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        for seed in args.seeds:
            for start in args.starts:
                if any(r["start"] == start and r["seed"] == seed for r in rows):
                    continue
                rows.append(run_one(args, start, seed, work))
                atomic_write_json(out, record(rows))
                print({k: rows[-1][k] for k in ("start", "seed", "slot_f1", "intent_acc", "steps", "train_seconds")})
    result = record(rows)
    plot(result, out.with_suffix(".png"))
    for start, entry in result["summary"].items():
        f1 = entry["slot_f1"]
        print(f"{start:5s} {args.score} slot F1 {f1['mean']:.4f} ± {f1['std']:.4f} (min {f1['min']:.4f}, "
              f"max {f1['max']:.4f}; seeds {entry['seeds']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
