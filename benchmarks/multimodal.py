"""Every multimodal variant (one modality, the joint sequence, late fusion) on one CSV + image folder,
over several training seeds, on the same split.

    python benchmarks/multimodal.py --data ../shared/data/fashion --target season --minutes 4 \\
        --out benchmarks/results/multimodal_fashion_season.json [--seeds 0,1,2] [--epochs 12] [--set KEY=VALUE ...]

The rows are prepared once, exactly as `pipelines/prepare.py data=multimodal data.source=local`
prepares them (pictures resized once, a stratified split with data seed 0, the word pieces and the
table encoder fitted on the training rows). The schema is `--schema`, or else
conf/schemas/<folder name>_<target>.yaml (conf/schemas/fashion_season.yaml for the command above).
Each variant then trains through the project's training code (`experiment=multimodal/fashion`
with `model.modalities` / `model.fusion`; `--set` adds Hydra overrides to all of them) for
`--epochs` epochs (the length of the warm-up + cosine schedule) or `--minutes` minutes of
training (Lightning's max_time), whichever comes first; the checkpoint with the lowest validation
loss is scored once on the test rows. Only the training seed changes between seeds.

Writes {variant}_acc and {variant}_f1 (test accuracy and macro-F1, each {"mean", "std", "seeds"};
std over seeds, ddof 0) and {variant}_train_seconds (per seed) for the variants image, text,
table, joint, late_fusion, with the data summary, settings and machine, and a bar chart of the
means with every seed's score beside the JSON (FILE.png).
Target (fashion, 2 CPU cores): the joint model ahead of the best single modality by more than the
seed spread, and at least level with late fusion.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from transformer_lab.utils.machine import machine

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))

VARIANTS = {"image": ["model.modalities=[image]"], "text": ["model.modalities=[text]"],
            "table": ["model.modalities=[table]"], "joint": ["model.modalities=[image,text,table]"],
            "late_fusion": ["model.modalities=[image,text,table]", "model.fusion=late"]}


def train_variant(variant: str, prepared: Path, schema: Path, seed: int, epochs: int, minutes: float,
                  overrides: list[str], out_dir: Path) -> dict:
    from transformer_lab.runtime.config import compose_config
    from transformer_lab.training.train import train

    budget = time.strftime("%H:%M:%S", time.gmtime(round(minutes * 60)))
    cfg = compose_config("train", [
        "experiment=multimodal/fashion", *VARIANTS[variant], "logger=none", f"seed={seed}",
        f"data.prepared_dir={prepared}", f"data.schema={schema}", f"trainer.max_epochs={epochs}",
        f"trainer.max_time=00:{budget}", "callbacks.rich_progress_bar=null", *overrides], out_dir)
    return train(cfg)


def summary(values: list[float]) -> dict:
    import numpy as np

    return {"mean": round(float(np.mean(values)), 4), "std": round(float(np.std(values)), 4),
            "seeds": [round(v, 4) for v in values]}


def plot(result: dict, variants: list[str], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.6 * len(variants) + 2, 3.8))
    for m, (metric, label) in enumerate((("acc", "accuracy"), ("f1", "macro-F1"))):
        offset = (m - 0.5) * 0.38
        means = [result[f"{v}_{metric}"]["mean"] for v in variants]
        bars = ax.bar([i + offset for i in range(len(variants))], means, 0.36, label=label,
                      yerr=[result[f"{v}_{metric}"]["std"] for v in variants], capsize=3)
        ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=2)
        for i, v in enumerate(variants):  # every seed, so the spread is seen, not only its summary
            seeds = result[f"{v}_{metric}"]["seeds"]
            ax.scatter([i + offset] * len(seeds), seeds, s=8, color="black", zorder=3)
    ax.set_xticks(range(len(variants)), variants)
    lowest = min(result[f"{v}_{m}"]["mean"] for v in variants for m in ("acc", "f1"))
    ax.set(ylim=(max(0.0, lowest - 0.15), 1.02), ylabel="test score",
           title=f"{result['data']['source']} -> {result['data']['target']} "
                 f"({len(result['settings']['seeds'])} seeds)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="folder with data.csv and the image paths it names")
    parser.add_argument("--target", required=True, help="the column to predict (never also an input)")
    parser.add_argument("--schema", help="default: conf/schemas/<folder name>_<target>.yaml")
    parser.add_argument("--minutes", type=float, required=True, help="training budget of each run (variant x seed)")
    parser.add_argument("--out", required=True, help="JSON file to write (and FILE.png beside it)")
    parser.add_argument("--epochs", type=int, default=10, help="schedule length; a run stops at the budget first")
    parser.add_argument("--seeds", default="0,1,2", help="training seeds (the split stays data seed 0)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    parser.add_argument("--image-size", type=int, default=32, help="pictures resized once to S x S")
    parser.add_argument("--min-class-rows", type=int, default=50, help="rarer classes are dropped (and counted)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="Hydra override for every training run (repeatable), e.g. model.size=small")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    data = Path(args.data)
    schema = Path(args.schema) if args.schema else ROOT / "conf" / "schemas" / f"{data.resolve().name}_{args.target}.yaml"
    if not schema.is_file():
        parser.error(f"{schema}: no such schema; write one (see conf/schemas/fashion_season.yaml) or give --schema")

    import torch

    from transformer_lab.data.multimodal import MultimodalSchema, prepare
    from transformer_lab.errors import DataError
    from transformer_lab.utils.io import atomic_write_json

    if MultimodalSchema.load(schema).target != args.target:
        parser.error(f"{schema}: its target is {MultimodalSchema.load(schema).target!r}, not {args.target!r}")
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    wall = time.perf_counter()
    scores = {v: {"acc": [], "f1": [], "seconds": []} for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prepared = tmp / "prepared"
        try:
            table = prepare("local", str(prepared), str(schema), local_path=str(data / "data.csv"),
                            image_size=args.image_size, min_class_rows=args.min_class_rows,
                            drop_unlabelled=True)
        except DataError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"{table['rows']} rows, classes {table['class_counts']}, splits {table['splits']}", flush=True)
        for seed in seeds:
            for variant in variants:
                start = time.perf_counter()
                metrics = train_variant(variant, prepared, schema, seed, args.epochs, args.minutes, args.set,
                                        tmp / f"{variant}-{seed}")
                scores[variant]["seconds"].append(round(time.perf_counter() - start, 1))
                scores[variant]["acc"].append(metrics["test/acc"])
                scores[variant]["f1"].append(metrics["test/macro_f1"])
                print(f"seed {seed} {variant:12s} acc={metrics['test/acc']:.4f} f1={metrics['test/macro_f1']:.4f} "
                      f"{scores[variant]['seconds'][-1]} s", flush=True)
    result = {"data": {"source": str(data), "target": args.target, "schema": str(schema), "rows": table["rows"],
                       "class_counts": table["class_counts"], "splits": table["splits"],
                       "dropped_rare_classes": table["dropped_rare_classes"],
                       "dropped_unlabelled": table["dropped_unlabelled"]}}
    for variant in variants:
        result[f"{variant}_acc"] = summary(scores[variant]["acc"])
        result[f"{variant}_f1"] = summary(scores[variant]["f1"])
        result[f"{variant}_train_seconds"] = scores[variant]["seconds"]
    result.update({
        "wall_seconds": round(time.perf_counter() - wall, 1),
        "settings": {"minutes": args.minutes, "epochs": args.epochs, "seeds": seeds, "image_size": args.image_size,
                     "min_class_rows": args.min_class_rows,
                     "overrides": args.set, "selection": "lowest validation loss; test scored once"},
        "machine": {**machine(), "cpu_count": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor(),
                    "torch": torch.__version__, "threads": args.threads,
                    "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]},
    })
    atomic_write_json(args.out, result)
    plot(result, variants, Path(args.out).with_suffix(".png"))
    for variant in variants:
        print(f"{variant:12s} acc {result[f'{variant}_acc']['mean']:.4f} ± {result[f'{variant}_acc']['std']:.4f}   "
              f"macro-F1 {result[f'{variant}_f1']['mean']:.4f} ± {result[f'{variant}_f1']['std']:.4f}   "
              f"{sum(result[f'{variant}_train_seconds'])} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
