"""What a benchmark's seconds were measured on, written beside its figures."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def machine() -> dict:
    """CPU model, cores, torch threads, platform and torch version of this machine."""
    import torch

    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
              if line.startswith("model name")] if cpuinfo.is_file() else []
    return {"cpu": models[0] if models else platform.processor(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "platform": platform.platform(), "torch": torch.__version__}
