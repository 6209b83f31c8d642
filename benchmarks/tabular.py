"""Every tabular model of the project beside XGBoost and logistic regression, under k-fold
cross-validation on any CSV + schema, with the defaults only.

    python benchmarks/tabular.py --csv ../shared/data/bank/bank-full.csv \\
        --schema conf/schemas/bank.yaml --out FILE.json [--folds 5] [--seed 0] [--set KEY=VALUE ...]
    python benchmarks/tabular.py --census-rows 30000 --out FILE.json     # a generated census-style table

The table is prepared exactly as `dvc repro prepare_tabular` prepares it (data.source=local, a
stratified, seeded k-fold column). For each fold k, every model trains on the other folds (less
their validation-split rows, which serve for XGBoost's early stopping and the neural models'
early stopping and best checkpoint) and is scored on fold k; the encoder and the piecewise
encoding's bins are refitted on each fold's training rows. The neural models run through the
project's training code, the baselines through `pipelines/train_baseline.py`'s:

    tab_transformer            experiment=tabular/tab_transformer (continuous columns beside the encoder)
    ft_transformer             experiment=tabular/ft_transformer (every column a token, linear numeric map)
    ft_transformer_piecewise   ... model.numeric_encoding=piecewise (quantile bins of the training rows)
    ft_transformer_periodic    ... model.numeric_encoding=periodic (sin/cos of learned frequencies)
    mlp                        experiment=tabular/tab_mlp (the TabTransformer's inputs, no transformer)
    xgboost, logreg            baseline=xgboost, baseline=logistic_regression

`--set` adds Hydra overrides to every neural run; the targets are for the defaults, without it.
Writes <model>_auc and <model>_acc (each {"mean", "std", "folds"}; std over folds, ddof 0) and
<model>_seconds for each model, rows, columns and wall_seconds. AUC is binary ROC-AUC, or the
macro one-vs-rest AUC for more classes. Targets: the best transformer variant's AUC within one
standard deviation of XGBoost's (heart: of the best baseline); at 30,000 rows the whole run
(every model, 5 folds) within 10 minutes on 2 cores.

--census-rows N writes a census-style table (8 categorical, 6 continuous columns like the Adult
census income data, "?" for some missing cells, a binary income target from a noisy
logistic model with interactions) and its schema, then runs on it.
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

MODELS = {
    "tab_transformer": ["experiment=tabular/tab_transformer"],
    "ft_transformer": ["experiment=tabular/ft_transformer"],
    "ft_transformer_piecewise": ["experiment=tabular/ft_transformer", "model.numeric_encoding=piecewise"],
    "ft_transformer_periodic": ["experiment=tabular/ft_transformer", "model.numeric_encoding=periodic"],
    "mlp": ["experiment=tabular/tab_mlp"],
    "xgboost": ["baseline=xgboost"],
    "logreg": ["baseline=logistic_regression"],
}
BASELINES = ("xgboost", "logreg")


def census_like_table(rows: int, seed: int, directory: Path) -> tuple[Path, Path]:
    """A generated census-style CSV and its schema (the column layout of Adult census income)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    categorical = {
        "workclass": ["Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov"],
        "education": ["HS-grad", "Some-college", "Bachelors", "Masters", "Assoc-voc", "11th", "Doctorate"],
        "marital_status": ["Married-civ-spouse", "Never-married", "Divorced", "Separated", "Widowed"],
        "occupation": ["Prof-specialty", "Craft-repair", "Exec-managerial", "Adm-clerical", "Sales",
                       "Other-service", "Machine-op-inspct", "Transport-moving", "Tech-support"],
        "relationship": ["Husband", "Not-in-family", "Own-child", "Unmarried", "Wife", "Other-relative"],
        "race": ["White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"],
        "sex": ["Male", "Female"],
        "native_country": ["United-States", "Mexico", "Philippines", "Germany", "Canada", "India", "England"],
    }
    frame = pd.DataFrame({name: rng.choice(values, rows, p=np.linspace(2, 1, len(values)) / np.linspace(
        2, 1, len(values)).sum()) for name, values in categorical.items()})
    effects = {name: dict(zip(values, rng.normal(0, 0.8, len(values)))) for name, values in categorical.items()}
    education_years = frame["education"].map(dict(zip(categorical["education"], [9, 10, 13, 14, 11, 7, 16])))
    frame["age"] = rng.integers(17, 90, rows)
    frame["fnlwgt"] = rng.lognormal(12, 0.5, rows).round()
    frame["education_num"] = education_years
    frame["capital_gain"] = np.where(rng.random(rows) < 0.08, rng.lognormal(8, 1, rows).round(), 0)
    frame["capital_loss"] = np.where(rng.random(rows) < 0.05, rng.lognormal(7, 0.5, rows).round(), 0)
    frame["hours_per_week"] = rng.normal(40, 12, rows).clip(1, 99).round()
    logit = (sum(frame[name].map(effects[name]) for name in categorical) - 2.0
             + 0.04 * (frame["age"].clip(17, 60) - 38) + 0.25 * (frame["education_num"] - 10)
             + 0.03 * (frame["hours_per_week"] - 40) + 0.9 * (frame["capital_gain"] > 0)
             + 0.8 * ((frame["marital_status"] == "Married-civ-spouse") & (frame["education_num"] >= 13)))
    frame["income"] = np.where(rng.random(rows) < 1 / (1 + np.exp(-logit)), ">50K", "<=50K")
    for name in ("workclass", "occupation", "native_country"):  # Adult's "?" cells
        frame.loc[rng.random(rows) < 0.02, name] = "?"
    frame["hours_per_week"] = frame["hours_per_week"].astype(object)
    frame.loc[rng.random(rows) < 0.01, "hours_per_week"] = "?"
    csv, schema = directory / "census.csv", directory / "census.yaml"
    frame.to_csv(csv, index=False)
    schema.write_text(
        "name: census\ntarget: income\n"
        f"categorical: [{', '.join(categorical)}]\n"
        "continuous: [age, fnlwgt, education_num, capital_gain, capital_loss, hours_per_week]\n"
        'missing_values: ["?"]\n')
    return csv, schema


def run_fold(model: str, prepared: Path, fold: int, seed: int, overrides: list[str], out_dir: Path) -> dict:
    from transformer_lab.runtime.config import compose_config

    common = [*MODELS[model], "logger=none", f"seed={seed}", f"data.prepared_dir={prepared}",
              f"data.datamodule.fold={fold}"]
    if model in BASELINES:
        from transformer_lab.training.baselines import train_baseline

        return train_baseline(compose_config("train_baseline", common, out_dir))
    from transformer_lab.training.train import train

    cfg = compose_config("train", [*common, "callbacks.rich_progress_bar=null", *overrides], out_dir)
    return train(cfg)


def summary(values: list[float]) -> dict:
    import numpy as np

    return {"mean": round(float(np.mean(values)), 4), "std": round(float(np.std(values)), 4),
            "folds": [round(v, 4) for v in values]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", help="the table (CSV with a header line)")
    parser.add_argument("--schema", help="its schema (YAML, see conf/schemas/)")
    parser.add_argument("--census-rows", type=int, default=0, help="instead of --csv: a generated census-style table")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="split and training seed")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="Hydra override for every neural model's runs (repeatable)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if not args.census_rows and not (args.csv and args.schema):
        parser.error("give --csv and --schema, or --census-rows N")
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}; choose from {', '.join(MODELS)}")

    import torch

    from transformer_lab.data.tabular import prepare
    from transformer_lab.utils.io import atomic_write_json

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    wall = time.perf_counter()
    scores = {m: {"auc": [], "acc": [], "seconds": 0.0} for m in models}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        csv, schema = census_like_table(args.census_rows, args.seed, tmp) if args.census_rows \
            else (Path(args.csv), Path(args.schema))
        prepared = tmp / "prepared"
        table = prepare("local", str(prepared), str(schema), local_path=str(csv), seed=args.seed, folds=args.folds)
        for fold in range(args.folds):
            for model in models:
                start = time.perf_counter()
                metrics = run_fold(model, prepared, fold, args.seed, args.set, tmp / f"{model}-{fold}")
                scores[model]["seconds"] += time.perf_counter() - start
                scores[model]["auc"].append(metrics["test/auroc"])
                scores[model]["acc"].append(metrics["test/acc"])
                print(f"fold {fold} {model:24s} auc={metrics['test/auroc']:.4f} acc={metrics['test/acc']:.4f}",
                      flush=True)
    result = {"rows": table["rows"], "columns": len(table["categorical"]) + len(table["continuous"]),
              "classes": table["classes"], "source": str(csv) if not args.census_rows else "census-like (generated)"}
    for model in models:
        result[f"{model}_auc"] = summary(scores[model]["auc"])
        result[f"{model}_acc"] = summary(scores[model]["acc"])
        result[f"{model}_seconds"] = round(scores[model]["seconds"], 1)
    result.update({
        "wall_seconds": round(time.perf_counter() - wall, 1),
        "settings": {"folds": args.folds, "seed": args.seed, "overrides": args.set},
        "machine": {**machine(), "cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "threads": args.threads,
                    "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]},
    })
    transformers = [m for m in models if m not in BASELINES and m != "mlp"]
    if transformers and "xgboost" in models:
        best = max(transformers, key=lambda m: result[f"{m}_auc"]["mean"])
        gap = result["xgboost_auc"]["mean"] - result[f"{best}_auc"]["mean"]
        result["best_transformer"] = best
        result["best_transformer_within_xgboost_std"] = bool(gap <= result["xgboost_auc"]["std"])
    atomic_write_json(args.out, result)
    for model in models:
        print(f"{model:24s} auc {result[f'{model}_auc']['mean']:.4f} ± {result[f'{model}_auc']['std']:.4f}   "
              f"acc {result[f'{model}_acc']['mean']:.4f} ± {result[f'{model}_acc']['std']:.4f}   "
              f"{result[f'{model}_seconds']} s")
    print(f"whole run {result['wall_seconds']} s" + (f"; best transformer {result['best_transformer']}, within one "
          f"std of XGBoost: {result['best_transformer_within_xgboost_std']}" if "best_transformer" in result else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
