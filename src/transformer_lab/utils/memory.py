"""Keep freed memory in the process for the next training step, instead of giving it back to the
kernel and faulting it in again.

glibc serves a large allocation from fresh pages (mmap) until one that size has been freed, and it
gives the free top of its heap back to the kernel once that exceeds twice the mmap threshold (at
most 64 MiB). A training step holds hundreds of megabytes of activations and frees them in its
backward pass, so every step gave most of them back and the next one faulted them in anew as
zeroed pages: kernel time on every step (figures in the README's *Training speed*). With the
mmap threshold at glibc's largest (32 MiB) and the trim threshold at 1 GiB, the freed blocks are
reused; the cost is that the process keeps its peak heap for its lifetime, which a training
process reaches again on its next step anyway.

`TRANSFORMER_LAB_KEEP_FREED_MEMORY=0` leaves glibc's defaults (to measure the difference).
"""

from __future__ import annotations

import ctypes
import os
import sys

OPT_OUT_ENV = "TRANSFORMER_LAB_KEEP_FREED_MEMORY"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
MMAP_THRESHOLD = 32 * 1024 * 1024  # the largest glibc accepts on 64-bit
TRIM_THRESHOLD = 1024 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (and the processes it forks).
    Returns whether they were set: False off Linux, without glibc's mallopt, or when opted out."""
    if not sys.platform.startswith("linux") or os.environ.get(OPT_OUT_ENV, "1") == "0":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; musl's is a stub that returns 0
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
