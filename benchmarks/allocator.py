"""What keeping freed memory (`utils/memory.py`) is worth: this project's BERT and GPT training
steps in processes of their own, with glibc's defaults and with freed memory kept, taking turns.

    python benchmarks/allocator.py --out FILE.json [--models bert,gpt] [--size mini] [--pairs 3]
                                   [--steps 8] [--warmup 3]

Each process builds one model (as `benchmarks/throughput.py` does: same config, batch 32 x 128,
dropout 0.1, the tasks' losses; but per-tensor AdamW, with which `allocator_cpu.json` was
measured, where `throughput.py`'s steps now take the fused one), runs `--warmup` untimed training steps, then `--steps`
timed ones, and reports per step: wall milliseconds, minor page faults, and user and kernel
(system) CPU milliseconds (getrusage). `--pairs` pairs of processes per model, defaults first in
odd pairs and kept first in even ones. Writes every process's figures and, per model and setting,
their medians: `{model}_{setting}_ms_per_step`, `_page_faults_per_step`, `_system_ms_per_step`
(setting: `glibc_defaults` or `kept`), and `{model}_kept_speedup` (median defaults / median kept
milliseconds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"glibc_defaults": "0", "kept": "1"}

# One process: build, warm up, time; print one JSON line. The opt-out variable decides the allocator.
CHILD = """
import json, resource, sys, time
sys.path.insert(0, {benchmarks!r})
import torch
from transformer_lab.utils.memory import keep_freed_memory
kept = keep_freed_memory()
import hf_parity, throughput
torch.set_num_threads(throughput.THREADS)
torch.manual_seed(0)
kind, size, warmup, steps = {kind!r}, {size!r}, {warmup}, {steps}
model, _, loss_fn, _, _ = throughput.PAIRS[kind](size, torch.device("cpu"))
generator = torch.Generator().manual_seed(0)
batch = (hf_parity.random_batch(generator, 32, 128, padded=False) if kind == "bert"
         else hf_parity.random_gpt_batch(generator, 32, 128))
optimizer = torch.optim.AdamW(model.parameters(), lr=hf_parity.LR)
model.train()
def step():
    loss_fn(model, batch).backward()
    optimizer.step()
    optimizer.zero_grad()
for _ in range(warmup):
    step()
before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
for _ in range(steps):
    step()
seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({{"kept": kept, "ms_per_step": 1000 * seconds / steps,
                  "page_faults_per_step": (after.ru_minflt - before.ru_minflt) / steps,
                  "user_ms_per_step": 1000 * (after.ru_utime - before.ru_utime) / steps,
                  "system_ms_per_step": 1000 * (after.ru_stime - before.ru_stime) / steps}}))
"""


def run_one(kind: str, size: str, setting: str, args) -> dict:
    code = CHILD.format(benchmarks=str(ROOT / "benchmarks"), kind=kind, size=size, warmup=args.warmup,
                        steps=args.steps)
    env = {**os.environ, "TRANSFORMER_LAB_KEEP_FREED_MEMORY": SETTINGS[setting], "PROJECT_ROOT": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--models", default="bert,gpt", help="comma-separated: bert, gpt")
    parser.add_argument("--size", default="mini", help="a named size of both (tiny, mini)")
    parser.add_argument("--pairs", type=int, default=3, help="pairs of processes per model")
    parser.add_argument("--steps", type=int, default=8, help="timed training steps per process")
    parser.add_argument("--warmup", type=int, default=3, help="untimed training steps before them")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if not set(models) <= {"bert", "gpt"} or min(args.pairs, args.steps) < 1 or args.warmup < 0:
        parser.error("--models from bert, gpt; --pairs and --steps at least 1, --warmup at least 0")

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from transformer_lab.utils.io import atomic_write_json
    from transformer_lab.utils.machine import machine

    result: dict = {"runs": {}}
    for kind in models:
        runs = {setting: [] for setting in SETTINGS}
        for pair in range(args.pairs):
            for setting in (list(SETTINGS) if pair % 2 == 0 else list(SETTINGS)[::-1]):
                runs[setting].append(run_one(kind, args.size, setting, args))
                print(f"{kind} {args.size} {setting}: {runs[setting][-1]}", flush=True)
        for setting, values in runs.items():
            for key in ("ms_per_step", "page_faults_per_step", "system_ms_per_step"):
                result[f"{kind}_{setting}_{key}"] = round(statistics.median(v[key] for v in values), 1)
        result[f"{kind}_kept_speedup"] = round(result[f"{kind}_glibc_defaults_ms_per_step"]
                                               / result[f"{kind}_kept_ms_per_step"], 3)
        result["runs"][kind] = runs
    result["machine"] = machine()
    result["settings"] = {k: v for k, v in vars(args).items() if k != "out"}
    atomic_write_json(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
