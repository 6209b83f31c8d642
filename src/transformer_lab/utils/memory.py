"""Keep freed memory in the process for the next training step, instead of giving it back to the
kernel and faulting it in again.

glibc serves a large allocation with fresh pages (mmap) and unmaps them when it is freed: any
block over 32 MiB always, a smaller one until a block that size has been freed once. It also
gives the free top of its heap back to the kernel once that exceeds twice the mmap threshold. A
training step holds hundreds of megabytes of activations (GPT's logits alone, 32 x 128 tokens over
8,000 words, are 131 MB) and frees them in its backward pass, so every step gave them back and the
next one faulted them in anew as zeroed pages: kernel time on every step (figures in docs/performance.md,
*Training speed*). With mmap off (M_MMAP_MAX 0: every block from the heap; glibc still maps one
the heap cannot grow to hold) and the trim threshold at 1 GiB, freed blocks are reused. The cost:
the process keeps its peak heap, which a training process reaches again on its next step anyway.

`TRANSFORMER_LAB_KEEP_FREED_MEMORY=0` leaves glibc's defaults (to measure the difference).
"""

from __future__ import annotations

import ctypes
import os
import sys

OPT_OUT_ENV = "TRANSFORMER_LAB_KEEP_FREED_MEMORY"
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt's parameter numbers (malloc.h)
TRIM_THRESHOLD = 1024 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Serve every block from glibc's heap and keep up to 1 GiB of its free top, for this process
    (and the processes it forks).
    Returns whether they were set: False off Linux, without glibc's mallopt, or when opted out."""
    if not sys.platform.startswith("linux") or os.environ.get(OPT_OUT_ENV, "1") == "0":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; musl's is a stub that returns 0
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
