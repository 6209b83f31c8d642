import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
PYTHON = sys.executable

# Tiny builtin sample: enough words and labels to train on, seconds per run.
TINY_BUILTIN = ["data.builtin.n_train=300", "data.builtin.n_dev=60", "data.builtin.n_test=60"]


def run(args: list[str], cwd: Path = ROOT, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    merged = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=merged, capture_output=True, text=True, timeout=timeout)


def wait_until_up(url: str, log: Path, process: subprocess.Popen | None = None, timeout_s: float = 120) -> None:
    """Until an MLflow server or UI at url answers /health (and so has made its store's tables);
    its log's end in the failure when it does not, or when its process ends first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if (process is not None and process.poll() is not None) or time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not start:\n{Path(log).read_text()[-3000:]}")
        time.sleep(0.5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pytest_collection_modifyitems(config, items):
    """The end-to-end tests first: a worker that is free takes queued tests from the other
    (--dist worksteal), so the longest run must not be the last one started."""
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, "test_dvc" not in item.nodeid))


if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per worker and per process a test starts: two workers on two cores, not four threads.
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolated_tracking(tmp_path, monkeypatch):
    """No test writes into the project's own MLflow store or outputs."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """The Hugging Face clients read their offline switch at import time; set it where they look."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")


@pytest.fixture(scope="session")
def prepared_atis(tmp_path_factory) -> Path:
    from transformer_lab.data.atis import prepare_atis
    from transformer_lab.data.atis_builtin import generate_atis_sample

    out = tmp_path_factory.mktemp("prepared") / "atis"
    prepare_atis(generate_atis_sample(seed=0, n_train=300, n_dev=60, n_test=60), out)
    return out


@pytest.fixture
def smoke_overrides(prepared_atis) -> list[str]:
    return ["debug=smoke", f"data.prepared_dir={prepared_atis}"]


def copy_project(dst: Path) -> Path:
    """The tracked files of the project (what a fresh clone holds), without generated outputs."""
    files = run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT).stdout.split()
    for name in files:
        src = ROOT / name
        if src.is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)
    return dst


def sweep_runs(tracking_uri: str, experiment: str):
    """A multirun's MLflow runs: (the sweep's parent run, the jobs' runs)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    everything = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    [parent] = [r for r in everything if r.info.run_name.startswith("sweep ")]
    return parent, [r for r in everything if r is not parent]
