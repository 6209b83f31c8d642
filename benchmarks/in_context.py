"""In-context learning, measured: a tiny GPT trained on sequences whose every example carries a
fresh random symbol -> label mapping (transformer_lab/in_context.py), scored on mappings it never
saw, with K = 0 .. 16 demonstrations in the prompt and no weight update.

    python benchmarks/in_context.py --out benchmarks/results/in_context.json [--steps 4000] [--seed 0]
        [--sst2 DIR --model MODEL [--sst2-examples 200]]

Trains the project's GPTLMHeadModel (`--layers`, `--width`, `--heads`; no dropout) with AdamW on
16-demonstration sequences, the loss on every label position. Writes accuracy_by_shots (K ->
query accuracy on 2,000 held-out mappings per K), chance, best_possible_by_shots (a reader that
knows every shown symbol's label), steps, train_seconds, params, the machine; beside the JSON, a
plot of accuracy against K and a picture of the query position's attention in every head.
Target: near chance at K = 0 and >= 0.9 at K >= 8.

With --sst2 (a folder with GLUE SST-2's train.tsv and dev.tsv) and --model (a GPT checkpoint or
stage folder of this project, or a `transformers` causal-LM folder such as GPT-2: the GPT-2
paper's zero-shot setting), also sst2_accuracy_by_shots: the same prompting harness
(transformer_lab/few_shot.py) on the first --sst2-examples dev sentences, verbalisers " negative"
and " positive", K in 0, 1, 4, 16.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from transformer_lab.utils.machine import machine

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))
SHOTS = [0, 1, 2, 4, 8, 12, 16]


def plot(result: dict, model, task, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    figure, axes = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 1.4]})
    shots = [int(k) for k in result["accuracy_by_shots"]]
    axes[0].plot(shots, list(result["accuracy_by_shots"].values()), "o-", label="tiny GPT")
    axes[0].plot(shots, list(result["best_possible_by_shots"].values()), "--", color="grey", label="best possible")
    axes[0].axhline(result["chance"], color="black", lw=0.8, label="chance")
    axes[0].set(xlabel="demonstrations in the prompt (K)", ylabel="query accuracy, unseen mappings", ylim=(0.4, 1.02))
    axes[0].legend()
    # the query's attention over one 8-shot prompt, every head of the last layer
    batch = task.sample(1, 8, torch.Generator().manual_seed(result["seed"] + 999))
    with torch.no_grad():
        weights = model.eval()(batch["input_ids"], return_weights=True).attentions[-1][0, :, -1]  # (heads, keys)
    ids = batch["input_ids"][0].tolist()
    names = [f"s{i}" if i < task.n_symbols else f"L{i - task.n_symbols}" for i in ids]
    names[-1] = f"query {names[-1]}"
    axes[1].imshow(weights.numpy(), cmap="viridis", aspect="auto")
    axes[1].set_xticks(range(len(ids)), names, rotation=90, fontsize=8)
    axes[1].set_yticks(range(weights.shape[0]), [f"head {h}" for h in range(weights.shape[0])])
    axes[1].set_title("last layer: where the query looks (8-shot prompt)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def sst2(args) -> dict:
    from transformer_lab.inference.few_shot import few_shot_accuracy, load_language_model, majority_accuracy, read_sst2

    lm = load_language_model(args.model)
    train, dev = read_sst2(args.sst2 / "train.tsv"), read_sst2(args.sst2 / "dev.tsv")[: args.sst2_examples]
    start = time.perf_counter()
    scores = few_shot_accuracy(lm, train, dev, [0, 1, 4, 16], {"0": " negative", "1": " positive"}, seed=args.seed)
    return {"sst2_accuracy_by_shots": {str(k): round(v, 4) for k, v in scores.items()},
            "sst2_examples": len(dev), "sst2_majority": round(majority_accuracy(dev), 4), "sst2_model": args.model,
            "sst2_context": lm.max_len, "sst2_seconds": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-sequences", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sst2", type=Path, help="a folder with GLUE SST-2's train.tsv and dev.tsv")
    parser.add_argument("--model", help="with --sst2: a GPT checkpoint or stage folder, or a transformers LM folder")
    parser.add_argument("--sst2-examples", type=int, default=200)
    args = parser.parse_args(argv)
    if bool(args.sst2) != bool(args.model):
        parser.error("--sst2 and --model go together")

    import torch
    import torch.nn.functional as F
    from in_context_prompts import IGNORE_INDEX, MappingTask, accuracy_by_shots
    from tqdm import tqdm

    from transformer_lab.models.gpt import GPTConfig, GPTLMHeadModel

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    task = MappingTask()
    max_shots = max(SHOTS)
    config = GPTConfig(vocab_size=task.vocab_size, n_layers=args.layers, d_model=args.width, n_heads=args.heads,
                       max_len=2 * max_shots + 1, dropout=0.0)
    model = GPTLMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, args.lr, total_steps=args.steps, pct_start=0.1)
    generator = torch.Generator().manual_seed(args.seed)  # training mappings; evaluation draws with seed + 1000
    start = time.perf_counter()
    progress = tqdm(range(args.steps), desc="in-context training", unit="step")
    for step in progress:
        batch = task.sample(args.batch_size, max_shots, generator)
        logits = model(batch["input_ids"]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1),
                               ignore_index=IGNORE_INDEX)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 50 == 0:
            progress.set_postfix(loss=f"{loss.item():.3f}")
    seconds = time.perf_counter() - start

    scores = accuracy_by_shots(model, task, SHOTS, args.eval_sequences, seed=args.seed + 1000)
    result = {
        "accuracy_by_shots": {str(k): round(v, 4) for k, v in scores.items()},
        "chance": task.chance,
        "best_possible_by_shots": {str(k): round(task.best_possible(k), 4) for k in SHOTS},
        "task": {"n_symbols": task.n_symbols, "symbols_per_sequence": task.symbols_per_sequence,
                 "n_labels": task.n_labels},
        "steps": args.steps, "batch_size": args.batch_size, "train_seconds": round(seconds, 1),
        "params": sum(p.numel() for p in model.parameters()),
        "model": {"n_layers": args.layers, "d_model": args.width, "n_heads": args.heads}, "seed": args.seed,
        "machine": {**machine(), "cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "threads": args.threads},
    }
    if args.sst2:
        result.update(sst2(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result["figure"] = str(plot(result, model, task, args.out.with_suffix(".png")).relative_to(args.out.parent))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("accuracy_by_shots", "chance", "train_seconds")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
