"""The public CPU reference run for a character-level GPT on Tiny Shakespeare, with this project's
GPT trained through its Lightning task, and Hugging Face's GPT2LMHeadModel timed on the same recipe.

    python benchmarks/gpt_shakespeare.py --data ../shared/data/tinyshakespeare/input.txt --out FILE.json
                                         [--iters 2000] [--hf-iters 200] [--threads 2] [--seed 0]
                                         [--no-bias] [--activation gelu] [--hf-same-start]

Recipe (the well-known CPU settings for this data set): 4 layers, 4 heads, 128 wide, context 64,
batch 12, 2,000 iterations, AdamW lr 1e-3 with 100 warm-up steps then cosine decay to 1e-4,
betas (0.9, 0.99), weight decay 0.1, gradient clipping 1.0, no dropout; the last 10% of the
characters held out. Characters are encoded by the project's char tokenizer (trained on the
training 90%).

Ours: `LanguageModelDataModule` + `GPTPretrainingTask` + a Lightning `Trainer` (no logger, no
checkpoints, no progress bar; clipping by the trainer), exactly as `pipelines/train.py` builds
them. Writes
    val_loss          mean next-token cross-entropy over every non-overlapping 64-character
                      block of the held-out 10% (after training)
    train_seconds     wall time of `Trainer.fit` (setup included), transformers' stretches taken out
    seconds_per_iter  steady-state seconds per training iteration, from one batch's start to the
                      next (data loading and Lightning's own per-step work included), mean over
                      iterations 10 .. end (less the first after each switch, below);
                      seconds_per_iter_median the median of the same
    params            trainable parameters
    val_loss_from_20_random_batches
                      mean, SD, min and max of 100 validation losses of the trained model, each
                      estimated the way the recipe's published figure was (20 random batches of
                      12 blocks): how much that figure can stray from the full held-out value
and `hf_seconds_per_iter` (and `_median`): `transformers.GPT2LMHeadModel` configured identically
(pre-norm, learned positions, tied head, tanh GELU, no dropout) trained with the same optimiser,
schedule and clipping in a plain PyTorch loop for --hf-iters iterations on the batches ours draws
with the same seed, timed the same way. Its iterations run in 10 stretches spread over ours'
run (between two of ours' iterations, that time taken out of ours'), so a drift in the machine's
speed during the benchmark weighs on both alike; the first iteration after each switch is left
untimed on both sides. Also `hf_val_loss` on the same held-out blocks after its --hf-iters iterations
(its schedule spans those iterations). With --hf-iters 2000 that is the recipe's reference loss
from an implementation nobody here wrote.
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

RECIPE = {"n_layers": 4, "n_heads": 4, "d_model": 128, "block_size": 64, "batch_size": 12, "lr": 1e-3,
          "min_lr": 1e-4, "warmup_steps": 100, "betas": (0.9, 0.99), "weight_decay": 0.1, "grad_clip": 1.0,
          "dropout": 0.0, "val_fraction": 0.1}
TIMED_FROM = 10  # iterations before this one are warm-up (allocator, first-call overheads)


def encode_corpus(text: str, out_dir: Path) -> int:
    """The project's char tokenizer trained on the first 90%; train.npy / validation.npy as
    `train_tokenizers` writes them. Returns the vocabulary size."""
    import numpy as np

    from transformer_lab.data.tokenizers import train_tokenizer

    split = int(len(text) * (1 - RECIPE["val_fraction"]))
    tokenizer = train_tokenizer("char", [text[:split]], vocab_size=1000)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    for name, part in (("train", text[:split]), ("validation", text[split:])):
        lines = part.splitlines(keepends=True)
        ids = [i for encoding in tokenizer.encode_batch(lines, add_special_tokens=False) for i in encoding.ids]
        np.save(out_dir / f"{name}.npy", np.array(ids, dtype=np.uint16))
    return tokenizer.get_vocab_size()


SEGMENTS = 10  # transformers' iterations run in this many stretches spread over ours' run


class InterleavedClock:
    """A Lightning callback that times ours' iterations, from one batch's start to the next (the
    data loading and Lightning's own per-step work included), and every so often hands the
    machine to `transformers`' run for a stretch of its iterations. Both are then timed under
    the same conditions: a machine that speeds up or slows down during the benchmark (a
    neighbour's load, frequency scaling) weighs on both alike. The stretch's time is taken out of
    the ours' iteration it interrupted; the first iteration after each switch is left untimed on
    both sides (its caches are cold)."""

    def __init__(self, reference: HFReference, iters: int):
        from lightning.pytorch.callbacks import Callback

        clock = self
        self.reference = reference
        self.stretch = max(1, reference.iters // SEGMENTS)
        self.every = max(1, iters // SEGMENTS)  # ours' iterations between two stretches

        class _Callback(Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                clock.tick()

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                if trainer.global_step % clock.every == 0 and clock.reference.remaining:
                    clock.hand_over(min(clock.stretch, clock.reference.remaining))

            def on_train_epoch_end(self, trainer, pl_module):
                clock.tick()

        self.callback = _Callback()
        self.ticks: list[tuple[float, float]] = []  # (time, seconds handed over so far)
        self.handed_over = 0.0
        self.untimed: set[int] = set(range(TIMED_FROM))  # ours' iterations left out

    def tick(self) -> None:
        self.ticks.append((time.perf_counter(), self.handed_over))

    def hand_over(self, n: int) -> None:
        start = time.perf_counter()
        self.reference.train(n)
        self.handed_over += time.perf_counter() - start
        self.untimed.add(len(self.ticks))  # the next iteration starts cold

    def durations(self) -> list[float]:
        return [(t1 - t0) - (h1 - h0) for i, ((t0, h0), (t1, h1)) in enumerate(zip(self.ticks, self.ticks[1:]))
                if i not in self.untimed]


def timing(durations: list[float]) -> dict:
    """Mean and median seconds per iteration of the timed iterations."""
    import statistics

    return {"mean": round(statistics.fmean(durations), 5), "median": round(statistics.median(durations), 5),
            "iterations": len(durations)}


def build_ours(data_dir: Path, iters: int, seed: int, bias: bool, activation: str):
    """Ours' data module and task as `pipelines/train.py` builds them, seeded: the same seed gives
    the same initial weights."""
    import lightning as L

    from transformer_lab.data.gpt import LanguageModelDataModule
    from transformer_lab.models.gpt import GPTConfig
    from transformer_lab.tasks.gpt import GPTPretrainingTask

    L.seed_everything(seed, verbose=False)
    datamodule = LanguageModelDataModule(str(data_dir), block_size=RECIPE["block_size"],
                                         batch_size=RECIPE["batch_size"], eval_batch_size=256,
                                         samples_per_epoch=iters * RECIPE["batch_size"], seed=seed)
    config = GPTConfig(size="tiny", n_layers=RECIPE["n_layers"], n_heads=RECIPE["n_heads"],
                       d_model=RECIPE["d_model"], norm_first=True, max_len=RECIPE["block_size"],
                       dropout=RECIPE["dropout"], bias=bias, activation=activation, **datamodule.model_kwargs())
    task = GPTPretrainingTask(config.to_dict(), datamodule.preprocessor.to_state(), lr=RECIPE["lr"], weight_decay=RECIPE["weight_decay"],
                              betas=RECIPE["betas"], warmup_steps=RECIPE["warmup_steps"],
                              min_lr_ratio=RECIPE["min_lr"] / RECIPE["lr"])
    return datamodule, task


def train_ours(data_dir: Path, iters: int, seed: int, bias: bool, activation: str, reference: HFReference) -> dict:
    """Trains ours, handing the machine to `reference` for stretches of its iterations along the way."""
    import lightning as L

    datamodule, task = build_ours(data_dir, iters, seed, bias, activation)
    clock = InterleavedClock(reference, iters)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        num_sanity_val_steps=0, gradient_clip_val=RECIPE["grad_clip"], callbacks=[clock.callback],
                        default_root_dir=tempfile.mkdtemp())
    start = time.perf_counter()
    trainer.fit(task, datamodule=datamodule)
    train_seconds = time.perf_counter() - start - clock.handed_over

    start = time.perf_counter()
    evaluator = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, default_root_dir=tempfile.mkdtemp())
    val_loss = evaluator.validate(task, datamodule=datamodule, verbose=False)[0]["val/loss"]
    eval_seconds = time.perf_counter() - start
    per_iter = timing(clock.durations())
    return {"val_loss": round(float(val_loss), 4), "train_seconds": round(train_seconds, 1),
            "val_loss_from_20_random_batches": small_sample_estimates(task, datamodule.val_set.tokens, seed=seed),
            "seconds_per_iter": per_iter["mean"], "seconds_per_iter_median": per_iter["median"],
            "timed_iters": per_iter["iterations"], "iters": trainer.global_step,
            "eval_seconds": round(eval_seconds, 1), "val_blocks": len(datamodule.val_set),
            "params": sum(p.numel() for p in task.model.parameters())}


class HFReference:
    """`transformers`' GPT2LMHeadModel configured like ours, trained with ours' optimiser,
    schedule and clipping in a plain PyTorch loop on the batches ours draws with the same seed.
    `train(n)` runs the next n iterations, so that `InterleavedClock` can run them in stretches
    between ours' iterations."""

    def __init__(self, data_dir: Path, vocab_size: int, iters: int, seed: int, start_state: dict | None = None):
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel

        from transformer_lab.data.gpt import LanguageModelDataModule
        from transformer_lab.models.gpt import to_hf_state_dict
        from transformer_lab.tasks.schedules import adamw_with_warmup

        torch.manual_seed(seed)
        config = GPT2Config(vocab_size=vocab_size, n_positions=RECIPE["block_size"], n_embd=RECIPE["d_model"],
                            n_layer=RECIPE["n_layers"], n_head=RECIPE["n_heads"], resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        self.model = GPT2LMHeadModel(config).train()
        if start_state is not None:  # ours' initial weights, converted
            _, unexpected = self.model.load_state_dict(to_hf_state_dict(start_state), strict=False)
            assert not unexpected, unexpected
        # the optimiser and schedule ours gets from its task
        optimization = adamw_with_warmup(self.model, RECIPE["lr"], RECIPE["weight_decay"], iters,
                                         min(RECIPE["warmup_steps"], iters), RECIPE["betas"], decay="cosine",
                                         min_ratio=RECIPE["min_lr"] / RECIPE["lr"])
        self.optimizer, self.scheduler = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
        # the batches ours draws with the same seed (the same sampler), in the same order, and the
        # held-out blocks ours is scored on
        self.datamodule = LanguageModelDataModule(str(data_dir), block_size=RECIPE["block_size"],
                                                  batch_size=RECIPE["batch_size"], eval_batch_size=256,
                                                  samples_per_epoch=iters * RECIPE["batch_size"], seed=seed)
        self.datamodule.setup()
        self.batches = iter(self.datamodule.train_dataloader())
        self.iters, self.done, self.last_loss = iters, 0, float("nan")
        self.durations: list[float] = []  # timed iterations

    @property
    def remaining(self) -> int:
        return self.iters - self.done

    def train(self, n: int) -> None:
        """The next n iterations; the first of them is left untimed (cold caches after a switch),
        and so are the first TIMED_FROM of the run."""
        import torch

        from transformer_lab.tasks.gpt import lm_loss

        ticks = [time.perf_counter()]
        for _ in range(n):
            batch = next(self.batches)
            loss = lm_loss(self.model(input_ids=batch["input_ids"]).logits, batch["labels"])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), RECIPE["grad_clip"])
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            ticks.append(time.perf_counter())
        skip = max(1, TIMED_FROM - self.done)
        self.durations += [b - a for a, b in zip(ticks, ticks[1:])][skip:]
        self.done += n
        self.last_loss = loss.item()

    def evaluate(self) -> float:
        """Mean next-token loss on the held-out blocks ours is scored on."""
        import torch

        from transformer_lab.tasks.gpt import lm_loss

        self.model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for batch in self.datamodule.val_dataloader():
                logits = self.model(input_ids=batch["input_ids"]).logits
                total += lm_loss(logits, batch["labels"]).item() * batch["labels"].numel()
                count += batch["labels"].numel()
        return total / count

    def results(self) -> dict:
        per_iter = timing(self.durations)
        return {"hf_seconds_per_iter": per_iter["mean"], "hf_seconds_per_iter_median": per_iter["median"],
                "hf_timed_iters": per_iter["iterations"], "hf_iters": self.iters,
                # after --hf-iters iterations with the schedule stretched over them
                "hf_val_loss": round(self.evaluate(), 4), "hf_last_train_loss": round(self.last_loss, 4),
                "hf_params": sum(p.numel() for p in self.model.parameters()),
                "hf_attn_implementation": self.model.config._attn_implementation}


def small_sample_estimates(task, tokens, repeats: int = 100, batches: int = 20, seed: int = 0) -> dict:
    """How far a validation loss estimated from `batches` random batches of the recipe's size
    (nanoGPT's `--eval_iters=20`, the evaluation behind the recipe's published figure) strays from
    the full held-out value: `repeats` such estimates of the trained model, summarised."""
    import statistics

    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(seed)
    block, size = RECIPE["block_size"], RECIPE["batch_size"]
    estimates = []
    task.eval()
    with torch.no_grad():
        for _ in range(repeats):
            starts = torch.randint(len(tokens) - block, (batches * size,), generator=generator)
            inputs = torch.stack([tokens[s:s + block] for s in starts])
            targets = torch.stack([tokens[s + 1:s + block + 1] for s in starts])
            estimates.append(F.cross_entropy(task(inputs).logits.flatten(0, 1), targets.flatten()).item())
    return {"repeats": repeats, "batches": batches, "batch_size": size,
            "mean": round(statistics.fmean(estimates), 4), "sd": round(statistics.stdev(estimates), 4),
            "min": round(min(estimates), 4), "max": round(max(estimates), 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the Tiny Shakespeare text (input.txt)")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--iters", type=int, default=2000, help="training iterations of ours")
    parser.add_argument("--hf-iters", type=int, default=200, help="timed iterations of transformers' GPT-2")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for both")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bias", action=argparse.BooleanOptionalAction, default=True,
                        help="biases in our linear layers and LayerNorms (transformers' GPT-2 always has them)")
    parser.add_argument("--activation", choices=["gelu", "gelu_tanh"], default="gelu_tanh",
                        help="our feed-forward GELU: exact or tanh approximation (GPT-2's, = transformers' gelu_new)")
    parser.add_argument("--hf-same-start", action="store_true",
                        help="start transformers' GPT-2 from ours' initial weights (needs --bias and "
                             "--activation gelu_tanh); with --hf-iters = --iters both then see the same "
                             "weights and batches, and hf_val_loss shows what is left (float order)")
    args = parser.parse_args(argv)
    if args.hf_same_start and (not args.bias or args.activation != "gelu_tanh"):
        parser.error("--hf-same-start needs --bias and --activation gelu_tanh (transformers' GPT-2 has both)")
    if min(args.iters, args.hf_iters) < 2 * TIMED_FROM + SEGMENTS:
        parser.error(f"--iters and --hf-iters must be at least {2 * TIMED_FROM + SEGMENTS} (the untimed warm-up "
                     f"iterations, and the first of each of the {SEGMENTS} stretches between the two)")
    data = Path(args.data)
    if not data.is_file():
        parser.error(f"--data {data}: no such file (the set is in ../shared/data/tinyshakespeare)")

    import torch
    import transformers

    from transformer_lab.utils.io import atomic_write_json

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        encoded = Path(tmp)
        vocab_size = encode_corpus(data.read_text(encoding="utf-8"), encoded)
        start_state = None
        if args.hf_same_start:  # ours' initial weights
            start_state = build_ours(encoded, args.iters, args.seed, args.bias, args.activation)[1].model.state_dict()
        reference = HFReference(encoded, vocab_size, args.hf_iters, args.seed, start_state)
        ours = train_ours(encoded, args.iters, args.seed, args.bias, args.activation, reference)
        print(f"ours: {ours}", flush=True)
        if reference.remaining:  # ours' run was too short to take all of them
            reference.train(reference.remaining)
        hf = reference.results()
        print(f"hf: {hf}", flush=True)
    result = {
        **ours, **hf,
        "ours_to_hf_time_per_iter": round(ours["seconds_per_iter"] / hf["hf_seconds_per_iter"], 3),
        "ours_to_hf_median_time_per_iter": round(ours["seconds_per_iter_median"] / hf["hf_seconds_per_iter_median"], 3),
        "wall_seconds": round(time.perf_counter() - wall, 1),
        "vocab_size": vocab_size,
        "settings": {**vars(args), **RECIPE, "timed_from_iteration": TIMED_FROM},
        "machine": {**machine(), "cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "transformers": transformers.__version__, "threads": args.threads,
                    "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]},
    }
    atomic_write_json(args.out, result)
    print({k: v for k, v in result.items() if not isinstance(v, dict)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
