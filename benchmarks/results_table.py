"""docs/results.md from benchmarks/results/*.json: one table per benchmark, a row per result file.

    python benchmarks/results_table.py [--results benchmarks/results] [--out docs/results.md] [--check]

Each row gives the file's headline figures (`HEADLINE` below names them per benchmark; a benchmark
not listed there shows every scalar top-level key), then its machine record: CPU, cores, torch,
date and the command that wrote it. A file is grouped under the script its command ran
(`benchmarks/throughput.py` -> `throughput`). The output depends on the files alone: sorted, no
time of its own, so running it twice writes the same bytes and a stale docs/results.md shows as a
diff (`tests/test_results_table.py`).

A file that is not a JSON object, or whose `machine` record lacks one of `cpu`, `cpu_count`,
`torch`, `date`, `command` (null is allowed: an unknown fact), is one line on stderr naming the
file, exit code 2, and nothing is written. `--check` writes nothing and exits 1 when the file at
`--out` differs from what would be written.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = ("cpu", "cpu_count", "torch", "date", "command")

# Which keys are the headline of each benchmark: patterns over the file's keys, nested keys joined
# by dots (a list of summaries is labelled by each entry's start and size: `summary.minilm@200.dev_acc`).
HEADLINE = {
    "allocator": ["*_kept_speedup", "*_kept_ms_per_step", "*_glibc_defaults_ms_per_step"],
    "atis": ["scored_split", "intent_acc", "slot_f1", "sentence_acc", "non_o_token_acc", "train_seconds"],
    "causal_halves": ["*_halves_speedup"],
    "elmo_taggers": ["task", "summary.*.slot_f1.mean", "summary.*.train_seconds.mean"],
    "few_shot": ["task", "accuracy_by_shots.*", "majority"],
    "gpt_shakespeare": ["val_loss", "hf_val_loss", "seconds_per_iter", "hf_seconds_per_iter",
                        "ours_to_hf_time_per_iter"],
    "glove_vs_reference": ["vocab_size", "nonzero_entries", "max_loss_deviation", "ours_to_mittens_speed",
                           "ours_wordsim_spearman", "mittens_wordsim_spearman", "ours_minibatch_wordsim_spearman",
                           "word2vec_wordsim_spearman"],
    "gpu_check": ["strategies.*.tokens_per_s", "strategies.*.mfu", "strategies.*.peak_memory_gib"],
    "hf_parity": ["*_max_abs_diff", "*_ours_to_hf_speed"],
    "in_context": ["accuracy_by_shots.*", "sst2_accuracy_by_shots.*", "train_seconds"],
    "inference": ["*_ratio", "outputs_match"],
    "language_models": ["*_test_word_ppl", "*_tokens_per_s"],
    "multimodal": ["*_acc.mean", "*_f1.mean"],
    "own_pretraining": ["starts.*.*.mean", "verdicts.*.own_minus_scratch", "pretrain_minutes", "pretrain_tokens"],
    "sampled_profile": ["*_share.matmuls*", "*_step_s"],
    "tabular": ["*_auc.mean", "best_transformer", "best_transformer_within_xgboost_std"],
    "throughput": ["peak_fp32_tflops", "peak_bf16_tflops", "*_ours_to_hf_speed", "*_project_loss_speedup",
                   "*_chosen_rows_speedup"],
    "transfer": ["task", "summary.*.dev_acc.mean", "summary.*.dev_f1.mean", "summary.*.dev_em.mean",
                 "summary.*.test_intent_acc.mean", "summary.*.test_slot_f1.mean", "reference.*_dev_acc"],
    "translation": ["bleu_test_2016_flickr", "hf_bleu_test_2016_flickr", "seconds_per_step", "hf_seconds_per_step",
                    "steps"],
    "vit_digits": ["test_acc", "test_macro_f1", "logreg_acc", "cnn_acc", "train_seconds"],
    "word2vec_vs_gensim": ["corpus_words", "ours_to_gensim_speed", "ours_words_per_s", "gensim_words_per_s",
                           "ours_gensim_agreement", "gensim_seed_agreement"],
}
# Up to this many headline keys a benchmark gets a column each; more go one per line in one cell.
MAX_COLUMNS = 8


class Refused(Exception):
    """A result file this table cannot stand behind; the message is the one line to print."""


def load(path: Path) -> dict:
    try:
        result = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise Refused(f"{path}: not a readable JSON file ({error})") from None
    if not isinstance(result, dict):
        raise Refused(f"{path}: not a JSON object")
    record = result.get("machine")
    if not isinstance(record, dict):
        raise Refused(f"{path}: no machine record: add \"machine\" with {', '.join(REQUIRED)} (null where unknown)")
    missing = [key for key in REQUIRED if key not in record]
    if missing:
        raise Refused(f"{path}: the machine record lacks {', '.join(missing)} (null where unknown)")
    return result


def script_of(command: str | None) -> str | None:
    """The script a command ran: `benchmarks/throughput.py` in `X=1 python benchmarks/throughput.py ...`."""
    if not command:
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return next((word for word in words if word.endswith((".py", ".sh"))), None)


def benchmark_of(name: str, command: str | None) -> str:
    script = script_of(command)
    if script:
        return Path(script).stem
    stem = Path(name).stem
    known = [key for key in HEADLINE if stem == key or stem.startswith(key + "_")]
    return max(known, key=len) if known else stem.split("_")[0]


def flatten(value, prefix: str = "") -> dict:
    """Nested dicts as dotted keys; a list of dicts labelled by each entry's start and size."""
    out = {}
    if isinstance(value, dict):
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}{key}."))
    elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        for index, item in enumerate(value):
            label = "@".join(str(item[key]).split(":")[0] for key in ("init", "train_examples") if key in item)
            out.update(flatten(item, f"{prefix}{label or index}."))
    elif not isinstance(value, list):
        out[prefix[:-1]] = value
    return out


def natural(key: str) -> list:
    """Sort key that puts `16_...` after `2_...` and `accuracy_by_shots.4` before `.16`."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", key)]


def headline(benchmark: str, result: dict) -> dict:
    if benchmark not in HEADLINE:
        return {key: value for key, value in sorted(result.items())
                if key != "machine" and not isinstance(value, (dict, list))}
    flat = flatten({key: value for key, value in result.items() if key not in ("machine", "settings")})
    chosen = {}
    for pattern in HEADLINE[benchmark]:
        for key in sorted(flat, key=natural):
            if fnmatch.fnmatchcase(key, pattern) and key not in chosen and not isinstance(flat[key], (dict, list)):
                chosen[key] = flat[key]
    return chosen


def number(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1e6 else f"{value:.6g}"
    return str(value)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def machine_cells(record: dict) -> list[str]:
    cpu = record.get("cpu") or "unknown"
    accelerator = record.get("gpu") or (record.get("device") if record.get("device") not in (None, "x86_64") else None)
    if accelerator:
        cpu = f"{cpu}; {accelerator}"
    cores = record.get("cpu_count")
    command = record.get("command")
    return [cell(cpu), "unknown" if cores is None else str(cores), cell(record.get("torch") or "unknown"),
            cell(record.get("date") or "unknown"), f"`{cell(command)}`" if command else "unknown"]


def render(results_dir: Path, out_dir: Path) -> str:
    """The whole page, its links relative to `out_dir`. Raises Refused for the first file (by name)
    without a complete machine record."""
    link_prefix = Path(os.path.relpath(results_dir.resolve(), out_dir.resolve())).as_posix() + "/"
    groups: dict[str, list[tuple[str, dict]]] = {}
    for path in sorted(results_dir.glob("*.json")):
        result = load(path)
        groups.setdefault(benchmark_of(path.name, result["machine"].get("command")), []).append((path.name, result))
    lines = ["# Benchmark results", "",
             "Generated by `python benchmarks/results_table.py` (`make results-table`) from every",
             "`benchmarks/results/*.json`; edit the JSON files or the script, not this page.",
             "A row is one file: its headline figures, then the machine record the file carries (`machine`:",
             "CPU model, cores, torch, the date, the command). `unknown` is a fact the file does not record;",
             "`--out` in a command names the file's current path. What the figures mean, and what they were",
             "measured against, is on each family's page ([docs/](README.md)).", ""]
    for benchmark in sorted(groups):
        rows = groups[benchmark]
        scripts = sorted({script_of(result["machine"].get("command")) or "" for _, result in rows} - {""})
        figures = [headline(benchmark, result) for _, result in rows]
        keys = list(dict.fromkeys(key for row in figures for key in row))
        title = f"## {benchmark}" + (f" (`{'`, `'.join(scripts)}`)" if scripts else "")
        lines += [title, ""]
        columns = keys if len(keys) <= MAX_COLUMNS else ["figures"]
        header = ["file", *columns, "cpu", "cores", "torch", "date", "command"]
        lines += ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
        for (name, result), row in zip(rows, figures):
            if columns == keys:
                values = [cell(number(row[key])) if key in row else "–" for key in keys]
            else:
                values = ["<br>".join(f"{cell(key)}: {cell(number(value))}" for key, value in row.items()) or "–"]
            lines.append("| " + " | ".join([f"[{name}]({link_prefix}{name})", *values, *machine_cells(result["machine"])])
                         + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if --out differs from what would be written")
    args = parser.parse_args(argv)
    try:
        page = render(args.results, args.out.parent)
    except Refused as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.check:
        current = args.out.read_text() if args.out.is_file() else None
        if current != page:
            print(f"{args.out} is stale: run python benchmarks/results_table.py", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page)
    print(f"wrote {args.out} ({sum(1 for _ in args.results.glob('*.json'))} result files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
