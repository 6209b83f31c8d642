"""What a benchmark's seconds were measured on, written beside its figures.

Every file in `benchmarks/results/` carries such a record under `machine`, and
`benchmarks/results_table.py` refuses a file whose record lacks `cpu`, `cpu_count`, `torch`, `date`
or `command` (null where a fact is unknown)."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from pathlib import Path


def command_line(argv: list[str] | None = None) -> str:
    """The command that is running, as one would type it again: `python benchmarks/x.py --args`.

    The interpreter is written `python` (its path is this machine's), the rest as given: Python's
    own options (`-m module`, `-X ...`) from `sys.orig_argv`, the script and its arguments."""
    if argv is None:
        argv = list(getattr(sys, "orig_argv", None) or ["python", *sys.argv])
    return shlex.join(["python", *argv[1:]])


def machine() -> dict:
    """CPU model, cores, torch threads, platform and torch version of this machine, the UTC date and
    the command line that ran."""
    import torch

    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
              if line.startswith("model name")] if cpuinfo.is_file() else []
    return {"cpu": models[0] if models else (platform.processor() or None), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "platform": platform.platform(), "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(), "command": command_line()}
