"""utils/memory.py: after keep_freed_memory(), memory freed by one step is reused by the next
instead of being given back and faulted in again (counted in page faults, not timed)."""

import ctypes
import subprocess
import sys

import pytest

from transformer_lab.utils.memory import OPT_OUT_ENV, keep_freed_memory

# Like a training step: hold 96 MiB in 8 MiB tensors and one of 48 MiB (over any mmap threshold, as GPT's
# logits), free them all, again; count the page faults of the later rounds (the first three fault the memory
# in whatever the setting, and the heap's layout can take until the third to settle).
ROUNDS = """
import resource, sys
import torch
from transformer_lab.utils.memory import keep_freed_memory
kept = keep_freed_memory()
for round in range(8):
    if round == 3:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    held = [torch.ones(2 * 1024 * 1024) for _ in range(12)] + [torch.ones(12 * 1024 * 1024)]
    del held
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

linux_glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(
    ctypes.CDLL(None), "gnu_get_libc_version"), reason="glibc's mallopt")


def faults(env: dict) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", ROUNDS], capture_output=True, text=True, check=True, env=env)
    kept, count = out.stdout.split()
    return kept, int(count)


@linux_glibc
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    import os

    round_pages = 144 * 1024 * 1024 // 4096  # one round's memory in 4 KiB pages
    kept, count = faults({**os.environ, OPT_OUT_ENV: "1"})
    assert kept == "True" and count < round_pages / 10
    kept, count = faults({**os.environ, OPT_OUT_ENV: "0"})  # glibc's defaults: given back, faulted in again
    assert kept == "False" and count > round_pages / 2


def test_opting_out_sets_nothing(monkeypatch):
    monkeypatch.setenv(OPT_OUT_ENV, "0")
    assert keep_freed_memory() is False


@linux_glibc
@pytest.mark.slow  # two processes, each importing torch and transformers
def test_the_allocator_benchmark_times_each_setting_in_its_own_process(tmp_path):
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "allocator.json"
    subprocess.run([sys.executable, root / "benchmarks" / "allocator.py", "--out", out, "--models", "bert",
                    "--size", "tiny", "--pairs", "1", "--steps", "1", "--warmup", "0"], check=True, capture_output=True)
    result = json.loads(out.read_text())
    runs = result["runs"]["bert"]
    assert [r["kept"] for r in runs["glibc_defaults"]] == [False] and [r["kept"] for r in runs["kept"]] == [True]
    assert result["bert_kept_speedup"] == pytest.approx(
        result["bert_glibc_defaults_ms_per_step"] / result["bert_kept_ms_per_step"], rel=0.01)
    assert result["bert_kept_page_faults_per_step"] >= 0 and result["bert_kept_system_ms_per_step"] >= 0
