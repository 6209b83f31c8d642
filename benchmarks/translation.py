"""Translation on a CPU budget: this project's encoder-decoder Transformer and `transformers`'
MarianMTModel, the same configuration, the same starting weights, the same batches, side by side.

    python benchmarks/translation.py --data ../shared/data/multi30k --src en --tgt de --minutes 30 \
        --out benchmarks/results/translation_multi30k.json [--size small] [--batch-size 64]
        [--lr 1e-3] [--warmup 2000] [--vocab-size 8000] [--beams 4] [--evals 6] [--seed 0] [--threads 2]

DIR is any directory of line-aligned files `<split>.<src>` / `<split>.<tgt>` with the splits train,
val and test_* (Multi30k's layout). One BPE vocabulary is trained on the training pairs of both
languages. Both models are post-norm, sinusoidal (Marian's table layout), embeddings scaled by
sqrt(d) and tied across source, target and output, ReLU, dropout 0.1; Marian starts from this
project's initial weights (converted), so the two differ only in their code. Each step trains
both on one length-bucketed batch (who goes first alternates; each model's forward + backward +
update timed on its own) with AdamW (0.9, 0.98, eps 1e-9), the inverse-square-root warm-up to
--lr, label smoothing 0.1 and gradient clipping at 1.0. Training stops when this project's model
has trained --minutes (its own step time, evaluation not counted).

Selection on val: --evals times during the run both models translate the validation split
greedily and the weights with the best validation BLEU are kept (BLEU and chrF: sacreBLEU on
detokenized text). The kept weights then translate every test_* split with --beams beams (ours:
its own beam search; Marian: `generate`, the same beam width, length penalty 1.0, the same
token budget), scored once. Writes

    bleu_<split>, chrf_<split>        ours, every test split (and val_bleu, the selected val score)
    hf_bleu_<split>, hf_chrf_<split>  MarianMTModel, the same (and hf_val_bleu)
    train_seconds, steps, params      ours' training time (its steps only), steps, parameters
    seconds_per_step, hf_seconds_per_step, tokens_per_s
                                      mean seconds per step of each model (steps 10 .. end), and
                                      ours' source + target tokens per training second
    curve                             per evaluation: steps, ours' minutes, both val BLEUs
    samples                           a few test translations of both against the reference
plus the settings and the machine; a curve figure beside the JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))
TIMED_FROM = 10  # steps before this one are warm-up (allocator, first-call overheads)


def marian_from(model):
    """A MarianMTModel of the same configuration holding `model`'s weights."""
    from transformers import MarianConfig, MarianMTModel

    from transformer_lab.models.seq2seq import to_hf_state_dict

    c = model.config
    config = MarianConfig(vocab_size=c.vocab_size, d_model=c.d_model, encoder_layers=c.n_encoder_layers,
                          decoder_layers=c.n_decoder_layers, encoder_attention_heads=c.n_heads,
                          decoder_attention_heads=c.n_heads, encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff,
                          max_position_embeddings=c.max_len, activation_function=c.activation, dropout=c.dropout,
                          attention_dropout=c.dropout, activation_dropout=0.0, scale_embedding=c.scale_embeddings,
                          pad_token_id=c.pad_id, eos_token_id=c.eos_id, decoder_start_token_id=c.bos_id,
                          forced_eos_token_id=None, bad_words_ids=None, share_encoder_decoder_embeddings=True,
                          tie_word_embeddings=True)
    marian = MarianMTModel(config)
    marian.load_state_dict(to_hf_state_dict(model.state_dict(), c.max_len))
    return marian


class Trainee:
    """One model with its optimiser, schedule and step clock."""

    def __init__(self, name, model, forward, lr, warmup, label_smoothing):
        import torch

        from transformer_lab.tasks.schedules import decay_groups, warmup_inverse_sqrt

        self.name, self.model, self.forward, self.label_smoothing = name, model, forward, label_smoothing
        self.optimizer = torch.optim.AdamW(decay_groups(model, 0.0), lr=lr, betas=(0.9, 0.98), eps=1e-9, fused=True)
        self.schedule = warmup_inverse_sqrt(self.optimizer, warmup)
        self.step_seconds: list[float] = []
        self.best_bleu, self.best_state = -1.0, None

    def train_step(self, batch) -> float:
        import torch
        import torch.nn.functional as F

        from transformer_lab.data.bert import IGNORE_INDEX

        self.model.train()
        started = time.perf_counter()
        logits = self.forward(self.model, batch)
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX,
                               label_smoothing=self.label_smoothing)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.schedule.step()
        self.step_seconds.append(time.perf_counter() - started)
        return loss.item()

    def keep_if_best(self, bleu: float) -> None:
        if bleu > self.best_bleu:
            self.best_bleu, self.best_state = bleu, copy.deepcopy(self.model.state_dict())


def translate(kind: str, model, preprocessor, sources: list[str], beams: int, batch_size: int = 100) -> list[str]:
    """Translations of `sources` by ours (kind "ours") or Marian ("hf"), batches of similar length,
    in the order given; the same token budget for both (tasks/translation.decoding_budget)."""
    import torch

    from transformer_lab.data.translation import length_sorted_batches
    from transformer_lab.tasks.translation import decoding_budget

    model.eval()
    encoded = preprocessor.encode(sources)
    out: list[str | None] = [None] * len(encoded)
    with torch.no_grad():
        for rows, input_ids in length_sorted_batches(encoded, batch_size, preprocessor.pad_id):
            budget = decoding_budget(input_ids.shape[1], model.config.max_len if kind == "ours"
                                     else model.config.max_position_embeddings)
            if kind == "ours":
                tokens = model.generate(input_ids, budget, num_beams=beams).tolist()
            else:
                generated = model.generate(input_ids=input_ids, attention_mask=input_ids != preprocessor.pad_id,
                                           num_beams=beams, max_new_tokens=budget, length_penalty=1.0,
                                           early_stopping=False, do_sample=False)
                tokens = generated[:, 1:].tolist()  # after the start token
            for i, row in zip(rows, tokens):
                out[i] = preprocessor.decode(row)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--data", required=True, help="a directory with <split>.<src> / <split>.<tgt> line files")
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--minutes", type=float, default=30.0, help="ours' training time (default 30)")
    parser.add_argument("--size", default="small", help="models/seq2seq.py SIZES (default small: 3+3 layers, 256)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentence pairs per step")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate, after --warmup steps")
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-len", type=int, default=128, help="longest source or target in tokens")
    parser.add_argument("--beams", type=int, default=4, help="beam width on the test splits")
    parser.add_argument("--evals", type=int, default=6, help="validation translations during the run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--no-reference", action="store_true", help="ours only, no MarianMTModel")
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)

    import torch

    from transformer_lab.data.translation import (
        LengthBucketSampler,
        PairDataset,
        TranslationPreprocessor,
        collate,
        local_splits,
        read_pairs,
        train_translation_tokenizer,
    )
    from transformer_lab.errors import TransformerLabError
    from transformer_lab.models.seq2seq import Seq2SeqConfig, TransformerSeq2Seq
    from transformer_lab.tasks.translation import corpus_scores
    from transformer_lab.utils.io import atomic_write_json
    from transformer_lab.utils.machine import machine

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    try:
        splits = local_splits(args.data, args.src)
        pairs = {split: read_pairs(args.data, split, args.src, args.tgt) for split in splits}
    except TransformerLabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    tests = [s for s in splits if s.startswith("test")]
    tokenizer = train_translation_tokenizer([t for pair in pairs["train"] for t in pair], args.vocab_size)
    preprocessor = TranslationPreprocessor(tokenizer, args.max_len, args.src, args.tgt)
    train_set = PairDataset(pairs["train"], preprocessor)
    config = Seq2SeqConfig(vocab_size=tokenizer.get_vocab_size(), size=args.size, max_len=args.max_len,
                           sinusoidal_layout="halves", pad_id=preprocessor.pad_id, bos_id=preprocessor.bos_id,
                           eos_id=preprocessor.eos_id)
    ours = TransformerSeq2Seq(config)
    trainees = [Trainee("ours", ours, lambda m, b: m(b["input_ids"], b["decoder_input_ids"]).logits,
                        args.lr, args.warmup, 0.1)]
    if not args.no_reference:
        hf = marian_from(ours)
        trainees.append(Trainee("hf", hf, lambda m, b: m(input_ids=b["input_ids"],
                                                           attention_mask=b["input_ids"] != preprocessor.pad_id,
                                                           decoder_input_ids=b["decoder_input_ids"]).logits,
                                args.lr, args.warmup, 0.1))
    params = sum(p.numel() for p in ours.parameters())
    print(f"translation {args.src}->{args.tgt}: {len(pairs['train'])} training pairs, vocabulary "
          f"{tokenizer.get_vocab_size()}, {params / 1e6:.2f} M parameters ({args.size}); "
          f"{args.minutes:g} minutes of ours' training", flush=True)

    budget, tokens, steps, epoch, curve = args.minutes * 60, 0, 0, 0, []
    next_eval = budget / args.evals
    val_sources, val_references = [s for s, _ in pairs["val"]], [t for _, t in pairs["val"]]
    lengths = [max(len(s), len(t)) for s, t in zip(train_set.sources, train_set.targets)]
    started = time.perf_counter()

    def trained_seconds() -> float:
        return sum(trainees[0].step_seconds)

    while trained_seconds() < budget:
        for indices in LengthBucketSampler(lengths, args.batch_size, args.seed, epoch):
            batch = collate([train_set[i] for i in indices], preprocessor.pad_id, preprocessor.bos_id)
            order = trainees if steps % 2 == 0 else trainees[::-1]  # machine drift hits both alike
            losses = {t.name: t.train_step(batch) for t in order}
            tokens += int((batch["input_ids"] != preprocessor.pad_id).sum()) + int((batch["labels"] >= 0).sum())
            steps += 1
            if steps % 200 == 0:
                print(f"  step {steps}  epoch {epoch}  ours {trained_seconds() / 60:.1f} min  "
                      + "  ".join(f"{name} loss {loss:.3f}" for name, loss in losses.items()), flush=True)
            if trained_seconds() >= next_eval or trained_seconds() >= budget:
                point = {"steps": steps, "epoch": epoch, "ours_minutes": round(trained_seconds() / 60, 2)}
                for t in trainees:
                    hypotheses = translate(t.name, t.model, preprocessor, val_sources, beams=1)
                    bleu = corpus_scores(hypotheses, val_references)["bleu"]
                    point[f"{t.name}_val_bleu"] = round(bleu, 2)
                    t.keep_if_best(bleu)
                curve.append(point)
                print(f"  eval {point}", flush=True)
                next_eval += budget / args.evals
            if trained_seconds() >= budget:
                break
        epoch += 1

    result = {"data": str(Path(args.data).resolve()), "src": args.src, "tgt": args.tgt, "minutes": args.minutes,
              "settings": {k: v for k, v in vars(args).items() if k not in ("data", "out")},
              "model": config.to_dict(), "params": params, "steps": steps, "epochs": round(steps * args.batch_size
                                                                                           / len(train_set), 2),
              "train_seconds": round(trained_seconds(), 1), "tokens_per_s": round(tokens / trained_seconds(), 1),
              "curve": curve, "machine": machine()}
    for t in trainees:
        prefix = "" if t.name == "ours" else "hf_"
        timed = t.step_seconds[TIMED_FROM:] or t.step_seconds
        result[f"{prefix}seconds_per_step"] = round(sum(timed) / len(timed), 4)
        result[f"{prefix}val_bleu"] = round(t.best_bleu, 2)
        t.model.load_state_dict(t.best_state)
    samples = {}
    for split in tests:
        sources, references = [s for s, _ in pairs[split]], [t for _, t in pairs[split]]
        for t in trainees:
            prefix = "" if t.name == "ours" else "hf_"
            hypotheses = translate(t.name, t.model, preprocessor, sources, beams=args.beams)
            scores = corpus_scores(hypotheses, references)
            result[f"{prefix}bleu_{split}"], result[f"{prefix}chrf_{split}"] = (round(scores["bleu"], 2),
                                                                              round(scores["chrf"], 2))
            shown = samples.setdefault(split, [{"source": s, "reference": r} for s, r in zip(sources[:5], references)])
            for sample, hypothesis in zip(shown, hypotheses):
                sample[t.name] = hypothesis
    result["samples"] = samples
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    atomic_write_json(args.out, result)
    plot_curve(curve, Path(args.out).with_suffix(".png"), [t.name for t in trainees])
    print(json.dumps({k: v for k, v in result.items() if k not in ("curve", "samples", "model", "settings")},
                     indent=1))
    return 0


def plot_curve(curve: list[dict], out_png: Path, names: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    labels = {"ours": "this project", "hf": "transformers MarianMTModel"}
    for name in names:
        ax.plot([p["ours_minutes"] for p in curve], [p[f"{name}_val_bleu"] for p in curve], marker="o",
                label=labels[name])
    ax.set(xlabel="minutes of training (this project's steps)", ylabel="val BLEU (greedy)",
           title="translation, same batches and steps")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(out_png, dpi=110, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
