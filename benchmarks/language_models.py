"""Language models on real text: the project's GPT, ELMo's forward language model and a plain LSTM
language model, each trained on WikiText-2 for the same wall-clock budget, scored by per-word
perplexity on its validation and test sets.

    python benchmarks/language_models.py --data ../shared/data/wikitext-2 --minutes 30 --out FILE.json
        [--models gpt,elmo,lstm] [--seed 0] [--threads 2] [--curve-points 10]

Data: any folder with train.txt, valid.txt and test.txt in WikiText's layout (tokenised text, one
paragraph or heading a line). A word is a whitespace-separated token, and every line ends with one
<eos> word, blank lines too: the convention of the published figures (245,569 test words).

Per-word perplexity = exp(total negative log-likelihood / words), whatever a model's tokens:
    gpt   GPTLMHeadModel on byte-level BPE trained on train.txt (--bpe-vocab tokens), <eos> its
          end-of-text token; a word's NLL is the sum over its tokens
    elmo  ElmoBiLM with bidirectional=False: characters -> char CNN -> highway -> projected LSTMs,
          predicting the next word over the training vocabulary (adaptive softmax)
    lstm  the same model with token_encoder=words: a word embedding in place of the characters
The text is one stream; every model trains on random windows of it and is scored with a sliding
window (each token predicted once, with at least half a window before it: the first window's all
tokens), no state carried between windows. The windows hold about as many words for all three
(--context words; the GPT's in BPE tokens is that times the training text's tokens per word).

Budget: each model trains for --minutes of its own wall time (batches drawn, forward, backward,
step; evaluation not counted), in bfloat16 autocast by default (--precision; matrix units of
recent CPUs run it about twice as fast), evaluated in float32. The models take turns in slices of --slice seconds, so a change in
the machine's speed weighs on all alike. Learning rate: linear warm-up over the first
--warmup-steps, then cosine decay to a tenth over the budget's time. --curve-points times in each
budget, perplexity on the first --curve-words validation words: the curve, plotted beside the JSON.

Writes {model}_val_word_ppl, {model}_test_word_ppl (full sets, after training), {model}_params,
{model}_tokens_per_s (its own tokens: BPE for gpt, words for the others), {model}_train_tokens,
{model}_epochs, {model}_curve ([minutes, validation per-word perplexity on the curve words]...), and
minutes, words (per split), gpt_tokens_per_word, settings, the machine. Published anchors on this
test set (many GPU epochs): Pointer Sentinel-LSTM 80.8, AWD-LSTM 65.8.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))

from transformer_lab.data.elmo import EOS, word_characters  # noqa: E402
from transformer_lab.data.tokenizers import END_OF_TEXT, train_tokenizer  # noqa: E402
from transformer_lab.errors import DataError  # noqa: E402
from transformer_lab.models.elmo import IGNORE_INDEX, ElmoBiLM, ElmoConfig  # noqa: E402
from transformer_lab.models.gpt import GPTConfig, GPTLMHeadModel  # noqa: E402
from transformer_lab.tasks.schedules import decay_groups  # noqa: E402
from transformer_lab.utils.machine import machine

SPLITS = ("train", "valid", "test")
EOS_WORD = "<eos>"


def read_lines(path: Path) -> list[list[str]]:
    """Each line's words, <eos> appended."""
    if not path.is_file():
        raise DataError(f"{path}: not found (a WikiText folder holds train.txt, valid.txt and test.txt)")
    lines = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                lines.append([*raw.decode("utf-8").split(), EOS_WORD])
            except UnicodeDecodeError as error:
                raise DataError(f"{path}:{number}: not UTF-8 ({error.reason} at byte {error.start})") from None
    if not lines:
        raise DataError(f"{path}: empty")
    return lines


class Corpus:
    """The three splits as word lists, the word vocabulary (train words, most frequent first) and
    the BPE tokenizer the GPT reads."""

    def __init__(self, folder: Path, bpe_vocab: int):
        self.lines = {split: read_lines(folder / f"{split}.txt") for split in SPLITS}
        counts = Counter(w for line in self.lines["train"] for w in line)
        self.vocabulary = [w for w, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
        index = {w: i for i, w in enumerate(self.vocabulary)}
        fallback = index.get("<unk>", index[EOS_WORD])
        self.unseen = {s: sum(w not in index for line in self.lines[s] for w in line) for s in SPLITS}
        self.words = {s: sum(len(line) for line in self.lines[s]) for s in SPLITS}
        # every word is predicted: the stream starts with the <eos> that would end the line before
        self.word_ids = {s: torch.tensor([index[EOS_WORD]] + [index.get(w, fallback) for line in self.lines[s]
                                                              for w in line]) for s in SPLITS}
        self.tokenizer = train_tokenizer("bpe", [" ".join(line[:-1]) for line in self.lines["train"]],
                                         vocab_size=bpe_vocab)
        self.eot = self.tokenizer.token_to_id(END_OF_TEXT)
        self.bpe_ids = {split: self.bpe_stream(self.lines[split]) for split in SPLITS}
        self.tokens_per_word = len(self.bpe_ids["train"]) / self.words["train"]

    def bpe_stream(self, lines: list[list[str]]) -> torch.Tensor:
        """The lines in BPE tokens, each closed by the end-of-text token, the stream opened by one."""
        encodings = self.tokenizer.encode_batch([" ".join(line[:-1]) for line in lines], add_special_tokens=False)
        return torch.tensor([self.eot] + [i for e in encodings for i in [*e.ids, self.eot]])

    def first_words(self, split: str, n: int, kind: str):
        """The stream of the split's first n words (whole lines), in this model kind's tokens."""
        lines, count = 0, 0
        while lines < len(self.lines[split]) and count < n:
            count += len(self.lines[split][lines])
            lines += 1
        if kind == "bpe":
            return self.bpe_stream(self.lines[split][:lines]), count
        return self.word_ids[split][: count + 1], count


class LanguageModel:
    """One model under test: its network, tokens, optimiser and the time it has trained."""

    def __init__(self, name: str, network, kind: str, context: int, batch_size: int, lr: float,
                 weight_decay: float, train_stream, seed: int, bf16: bool):
        self.name, self.network, self.kind, self.context, self.batch_size = name, network, kind, context, batch_size
        self.bf16 = bf16
        self.train_stream = train_stream
        self.generator = torch.Generator().manual_seed(seed)
        self.optimizer = torch.optim.AdamW(decay_groups(network, weight_decay), lr=lr, betas=(0.9, 0.95))
        self.base_lr = lr
        self.seconds, self.steps, self.tokens = 0.0, 0, 0
        self.curve: list[list[float]] = []

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.network.parameters() if p.requires_grad)

    def nll(self, inputs, targets, reduction: str):
        """Negative log-likelihood of targets (IGNORE_INDEX not scored) given inputs, (batch, time)."""
        if self.kind == "bpe":
            logits = self.network(inputs).logits
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                                   reduction=reduction)
        network = self.network
        tokens = network.character_table[inputs] if network.config.token_encoder == "characters" else inputs
        forward_states, _, _ = network.layers(tokens)
        return network.word_loss(forward_states[-1], targets, reduction=reduction)

    def train_step(self, budget_seconds: float, warmup_steps: int, grad_clip: float) -> None:
        start = time.perf_counter()
        self.network.train()
        starts = torch.randint(0, len(self.train_stream) - self.context - 1, (self.batch_size,),
                               generator=self.generator)
        windows = torch.stack([self.train_stream[s: s + self.context + 1] for s in starts.tolist()])
        progress = min(1.0, self.seconds / budget_seconds)
        factor = ((self.steps + 1) / warmup_steps if self.steps < warmup_steps
                  else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in self.optimizer.param_groups:
            group["lr"] = self.base_lr * factor
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            loss = self.nll(windows[:, :-1], windows[:, 1:], "mean")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.network.parameters(), grad_clip)
        self.optimizer.step()
        self.steps += 1
        self.tokens += windows[:, 1:].numel()
        self.seconds += time.perf_counter() - start

    def stream_nll(self, stream, batch_size: int = 32) -> float:
        """Total NLL of stream[1:], each token predicted once by a sliding window: windows of
        `context` inputs every context // 2 tokens, each scoring the targets the one before did not."""
        self.network.eval()
        context, stride = self.context, self.context // 2
        inputs, targets = [], []
        start = 0
        while True:
            window = stream[start: start + context + 1]
            x = torch.zeros(context, dtype=torch.long)
            y = torch.full((context,), IGNORE_INDEX, dtype=torch.long)
            x[: len(window) - 1], y[: len(window) - 1] = window[:-1], window[1:]
            if start > 0:
                y[: context - stride] = IGNORE_INDEX  # scored by the window before
            inputs.append(x)
            targets.append(y)
            if start + context >= len(stream) - 1:
                break
            start += stride
        total = 0.0
        with torch.no_grad():
            for i in range(0, len(inputs), batch_size):
                total += float(self.nll(torch.stack(inputs[i: i + batch_size]),
                                        torch.stack(targets[i: i + batch_size]), "sum"))
        return total


def build_models(args, corpus: Corpus) -> list[LanguageModel]:
    bf16 = args.precision == "bf16-mixed"
    models = []
    for offset, name in enumerate(args.models):
        torch.manual_seed(args.seed + offset)
        if name == "gpt":
            context = 2 * round(args.context * corpus.tokens_per_word / 2)
            network = GPTLMHeadModel(GPTConfig(
                vocab_size=corpus.tokenizer.get_vocab_size(), n_layers=args.gpt_layers, d_model=args.gpt_width,
                n_heads=args.gpt_heads, max_len=context, dropout=args.dropout, eos_id=corpus.eot))
            models.append(LanguageModel(name, network, "bpe", context, args.batch_size, args.gpt_lr, 0.1,
                                        corpus.bpe_ids["train"], args.seed, bf16))
            continue
        config = ElmoConfig(vocab_size=len(corpus.vocabulary), size=args.elmo_size, bidirectional=False,
                            token_encoder="characters" if name == "elmo" else "words", dropout=args.dropout,
                            softmax="adaptive", max_word_chars=args.max_word_chars)
        network = ElmoBiLM(config)
        if name == "elmo":  # every vocabulary word's characters, looked up by word id
            table = [word_characters(EOS if w == EOS_WORD else w, args.max_word_chars) for w in corpus.vocabulary]
            network.register_buffer("character_table", torch.tensor(table), persistent=False)
        models.append(LanguageModel(name, network, "word", args.context, args.batch_size, args.lstm_lr, 0.0,
                                    corpus.word_ids["train"], args.seed, bf16))
    return models


def word_ppl(total_nll: float, words: int) -> float:
    return round(math.exp(total_nll / words), 2)


def plot(result: dict, models: list[str], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for name in models:
        minutes, ppl = zip(*result[f"{name}_curve"])
        axis.plot(minutes, ppl, "o-", label=f"{name} ({result[f'{name}_params'] / 1e6:.1f}M params)")
    for label, value in (("AWD-LSTM (test)", 65.8), ("Pointer Sentinel-LSTM (test)", 80.8)):
        axis.axhline(value, color="grey", lw=0.8, ls="--")
        axis.text(0, value * 1.02, label, color="grey", fontsize=8)
    axis.set(xlabel="training minutes (2 CPU threads)", ylabel="validation per-word perplexity", yscale="log",
             title=f"WikiText-2, first {result['settings']['curve_words']:,} validation words")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--data", required=True, type=Path, help="folder with train.txt, valid.txt, test.txt")
    parser.add_argument("--minutes", type=float, default=30.0, help="training budget of each model")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--models", default="gpt,elmo,lstm", type=lambda s: s.split(","))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--slice", type=float, default=30.0, help="seconds a model trains before the next takes over")
    parser.add_argument("--curve-points", type=int, default=10)
    parser.add_argument("--curve-words", type=int, default=20000)
    parser.add_argument("--context", type=int, default=96, help="words a window holds")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "32"],
                        help="training arithmetic (bf16 autocast, as Lightning's bf16-mixed; evaluation is float32)")
    parser.add_argument("--warmup-steps", type=int, default=200)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--bpe-vocab", type=int, default=8192)
    parser.add_argument("--gpt-layers", type=int, default=4)
    parser.add_argument("--gpt-width", type=int, default=256)
    parser.add_argument("--gpt-heads", type=int, default=4)
    parser.add_argument("--gpt-lr", type=float, default=1e-3)
    parser.add_argument("--elmo-size", default="small", help="ElmoConfig size of elmo and lstm (tiny | small)")
    parser.add_argument("--lstm-lr", type=float, default=2e-3)
    parser.add_argument("--max-word-chars", type=int, default=20)
    args = parser.parse_args(argv)
    unknown = set(args.models) - {"gpt", "elmo", "lstm"}
    if unknown:
        parser.error(f"--models: {', '.join(sorted(unknown))} not among gpt, elmo, lstm")

    torch.set_num_threads(args.threads)
    try:
        corpus = Corpus(args.data, args.bpe_vocab)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    models = build_models(args, corpus)
    curve_streams = {kind: corpus.first_words("valid", args.curve_words, kind) for kind in ("bpe", "word")}
    budget = args.minutes * 60
    marks = [budget * (i + 1) / args.curve_points for i in range(args.curve_points)]
    print(f"{corpus.words['train']:,} training words, vocabulary {len(corpus.vocabulary):,}, "
          f"{corpus.tokens_per_word:.3f} BPE tokens a word; "
          + ", ".join(f"{m.name} {m.params / 1e6:.2f}M params, context {m.context}" for m in models), flush=True)

    def record(model: LanguageModel) -> None:
        stream, words = curve_streams[model.kind]
        ppl = word_ppl(model.stream_nll(stream), words)
        model.curve.append([round(model.seconds / 60, 2), ppl])
        print(f"  {model.name}: {model.seconds / 60:5.1f} min, {model.steps:6d} steps, "
              f"{model.tokens / model.seconds:7.0f} tokens/s, validation ppl {ppl:8.1f}", flush=True)

    while any(m.seconds < budget for m in models):
        for model in models:
            slice_end = model.seconds + args.slice
            while model.seconds < min(slice_end, budget):
                model.train_step(budget, args.warmup_steps, args.grad_clip)
                if len(model.curve) < len(marks) and model.seconds >= marks[len(model.curve)]:
                    record(model)
            if model.seconds >= budget and len(model.curve) < len(marks):
                record(model)

    result = {"minutes": args.minutes, "words": corpus.words, "unseen_words": corpus.unseen,
              "vocabulary": len(corpus.vocabulary),
              "gpt_tokens_per_word": round(corpus.tokens_per_word, 4)}
    for model in models:
        start = time.perf_counter()
        for split, key in (("valid", "val"), ("test", "test")):
            stream = corpus.bpe_ids[split] if model.kind == "bpe" else corpus.word_ids[split]
            result[f"{model.name}_{key}_word_ppl"] = word_ppl(model.stream_nll(stream), corpus.words[split])
        result.update({f"{model.name}_params": model.params,
                       f"{model.name}_tokens_per_s": round(model.tokens / model.seconds),
                       f"{model.name}_train_tokens": model.tokens, f"{model.name}_steps": model.steps,
                       f"{model.name}_epochs": round(model.tokens / len(model.train_stream), 2),
                       f"{model.name}_context": model.context, f"{model.name}_curve": model.curve,
                       f"{model.name}_eval_seconds": round(time.perf_counter() - start, 1)})
        print(f"{model.name}: validation {result[f'{model.name}_val_word_ppl']}, "
              f"test {result[f'{model.name}_test_word_ppl']} per-word perplexity", flush=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"}
    result["settings"] = settings
    result["machine"] = {**machine(), "platform": platform.platform(), "cpu_count": os.cpu_count(), "threads": args.threads,
                         "torch": torch.__version__}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    picture = plot(result, args.models, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {picture}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
