"""What computing causal attention in halves is worth (`models/attention_fast.py`): one training layer of
attention, forward and backward with dropout, whole against in halves (the first half of the
queries against the first half of the keys only), at each context length, taking turns.

    python benchmarks/causal_halves.py --out FILE.json [--lengths 16,32,64,128,512] [--tokens 4096]
                                       [--width 128] [--heads 4] [--iterations 40] [--warmup 5]

The batch holds `--tokens` positions at every length (batch = tokens / length), so every length
does the same projection work. Writes, per length, the median milliseconds of a forward and
backward `{length}_whole_ms` and `{length}_halves_ms`, and `{length}_halves_speedup` (whole /
halves), with the machine and settings. `CAUSAL_HALVES_MIN_LENGTH` in `models/attention_fast.py` is
where halves stop losing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def measure(length: int, args) -> dict:
    import torch

    from transformer_lab.models import attention, attention_fast

    layer = attention.MultiHeadAttention(args.width, args.heads, dropout=0.1).train()
    x = torch.randn(max(args.tokens // length, 1), length, args.width, requires_grad=True)
    limits = {"halves": 1, "whole": 2**62}  # CAUSAL_HALVES_MIN_LENGTH for each way
    seconds = {name: [] for name in limits}
    saved = attention_fast.CAUSAL_HALVES_MIN_LENGTH
    try:
        for iteration in range(args.warmup + args.iterations):
            for name, limit in limits.items():
                attention_fast.CAUSAL_HALVES_MIN_LENGTH = limit
                start = time.perf_counter()
                out, _ = layer(x, is_causal=True)
                out.sum().backward()
                if iteration >= args.warmup:
                    seconds[name].append(time.perf_counter() - start)
    finally:
        attention_fast.CAUSAL_HALVES_MIN_LENGTH = saved
    whole, halves = (statistics.median(seconds[name]) for name in ("whole", "halves"))
    print(f"{length:>5} positions: whole {whole * 1e3:.2f} ms, halves {halves * 1e3:.2f} ms", flush=True)
    return {f"{length}_whole_ms": round(whole * 1e3, 3), f"{length}_halves_ms": round(halves * 1e3, 3),
            f"{length}_halves_speedup": round(whole / halves, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--lengths", default="16,32,64,128,512", help="comma-separated context lengths")
    parser.add_argument("--tokens", type=int, default=4096, help="positions per batch at every length")
    parser.add_argument("--width", type=int, default=128, help="d_model (GPT tiny: 128, mini: 256)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=40, help="timed forward-backward passes per way")
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)

    import torch
    from throughput import THREADS, cpu_model  # the thread count every benchmark here uses

    from transformer_lab.utils.memory import keep_freed_memory

    kept = keep_freed_memory()
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    result: dict = {}
    for length in (int(n) for n in args.lengths.split(",")):
        result.update(measure(length, args))
    result["settings"] = {"tokens": args.tokens, "width": args.width, "heads": args.heads, "dropout": 0.1,
                          "iterations": args.iterations, "warmup": args.warmup, "threads": THREADS,
                          "keep_freed_memory": kept, "torch": torch.__version__, "cpu": cpu_model()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
