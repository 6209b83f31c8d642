"""Data parallelism on CPU (`trainer=ddp_cpu`, two gloo processes) gives the same training as one
process with the same global batch and seed, and checkpoints move between the two."""

import os
import subprocess

import pytest
import torch
from conftest import PYTHON, ROOT, free_port, run, sweep_runs
from mlflow import MlflowClient

from transformer_lab.data.tabular import prepare

pytestmark = pytest.mark.slow


def train(run_dir, prepared, *overrides: str, tracking_uri: str | None = None):
    # the TabTransformer: fixed-size rows and a per-row mean loss, so two half batches average to
    # exactly the full batch's gradient; no dropout (each process draws its own masks)
    logger = ["tracking.log_trained_model=false"] if tracking_uri else ["logger=none"]
    result = run([PYTHON, ROOT / "pipelines" / "train.py", "experiment=tabular/tab_transformer", *logger,
                  "callbacks.rich_progress_bar=null", f"data.prepared_dir={prepared}", "data.datamodule.shuffle=false",
                  "model.dropout=0", "model.mlp_dropout=0", f"hydra.run.dir={run_dir}", *overrides],
                 env={"MLFLOW_TRACKING_URI": tracking_uri} if tracking_uri else None)
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    checkpoint["processes"] = (result.stdout + result.stderr).count("Initializing distributed: GLOBAL_RANK") or 1
    return checkpoint


def test_two_processes_match_one_with_the_same_global_batch(tmp_path):
    prepared = tmp_path / "penguins"
    prepare("builtin", str(prepared), str(ROOT / "conf/schemas/penguins.yaml"))
    one = train(tmp_path / "one", prepared, "++trainer.max_steps=6", "data.datamodule.batch_size=16")
    uri = f"sqlite:///{tmp_path}/ddp.db"
    two = train(tmp_path / "two", prepared, "trainer=ddp_cpu", "++trainer.max_steps=6", "data.datamodule.batch_size=8",
                tracking_uri=uri)
    assert one["global_step"] == two["global_step"] == 6
    assert two["processes"] == 2 and one["processes"] == 1  # the second process really ran
    client = MlflowClient(uri)
    [mlflow_run] = client.search_runs([client.get_experiment_by_name("tabular").experiment_id])  # one, not two
    assert mlflow_run.info.status == "FINISHED" and "test/auroc" in mlflow_run.data.metrics
    # AdamW divides each gradient by its running RMS, so where a gradient is ~0 the all-reduce's
    # different summation order can move a weight by up to lr; elsewhere the runs agree to 2e-5
    lr = one["hyper_parameters"]["lr"]
    differences = torch.cat([(two["state_dict"][name] - value).abs().flatten()
                             for name, value in one["state_dict"].items() if value.is_floating_point()])
    assert differences.numel() > 1000
    assert differences.max() <= lr, differences.max()
    assert (differences > 2e-5).float().mean() < 0.01, (differences > 2e-5).sum()

    # a checkpoint written by two processes resumes in one, and one written by one resumes in two
    # (a resume keeps the run's own settings, trainer included, unless the command changes them)
    resumed = train(tmp_path / "two", prepared, "trainer=cpu", "++trainer.max_steps=9",
                    "data.datamodule.batch_size=16", "ckpt_path=last")
    assert resumed["global_step"] == 9 and resumed["processes"] == 1
    resumed = train(tmp_path / "one", prepared, "trainer=ddp_cpu", "++trainer.max_steps=9",
                    "data.datamodule.batch_size=8", "ckpt_path=last")
    assert resumed["global_step"] == 9 and resumed["processes"] == 2


def test_multirun_with_ddp_is_one_mlflow_run_per_job(tmp_path):
    """Hydra multirun x DDP: each job's second process must join its job, not start a sweep of its own."""
    prepared = tmp_path / "penguins"
    prepare("builtin", str(prepared), str(ROOT / "conf/schemas/penguins.yaml"))
    uri = f"sqlite:///{tmp_path}/ddp_sweep.db"
    result = run([PYTHON, ROOT / "pipelines" / "train.py", "-m", "experiment=tabular/tab_transformer", "trainer=ddp_cpu",
                  "model.n_heads=2,4", "++trainer.max_steps=3", "callbacks.rich_progress_bar=null",
                  f"data.prepared_dir={prepared}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                 env={"MLFLOW_TRACKING_URI": uri})
    assert result.returncode == 0, result.stderr[-3000:]
    parent, jobs = sweep_runs(uri, "tabular")
    assert sorted(r.data.params["model.n_heads"] for r in jobs) == ["2", "4"]
    assert all(r.info.status == "FINISHED" and r.data.tags["mlflow.parentRunId"] == parent.info.run_id
               and "test/auroc" in r.data.metrics for r in jobs)
    folders = sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir() and not p.name.startswith("."))
    assert folders == ["0", "1"]
    for folder in folders:  # each job ran its two processes, and only its own
        assert (tmp_path / "sweep" / folder / "metrics.json").is_file()
    output = result.stdout + result.stderr
    assert output.count("Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2") == 2
    assert result.stdout.count("Launching 2 jobs") + result.stderr.count("Launching 2 jobs") == 1


def test_two_nodes_started_by_torchrun_match_one_process(tmp_path):
    """`torchrun --nnodes=2`, one launch per node rank, rendezvous on a loopback port: the same
    training as one process with the same global batch, one MLflow run, one set of outputs."""
    prepared = tmp_path / "penguins"
    prepare("builtin", str(prepared), str(ROOT / "conf/schemas/penguins.yaml"))
    one = train(tmp_path / "one", prepared, "++trainer.max_steps=6", "data.datamodule.batch_size=16")
    uri, port = f"sqlite:///{tmp_path}/nodes.db", free_port()
    nodes = [tmp_path / f"node{rank}" for rank in (0, 1)]
    launches = [subprocess.Popen(
        [PYTHON, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", f"--node_rank={rank}",
         "--master_addr=127.0.0.1", f"--master_port={port}", str(ROOT / "pipelines" / "train.py"),
         "experiment=tabular/tab_transformer", "trainer=ddp_cpu", "trainer.devices=1", "trainer.num_nodes=2",
         "++trainer.max_steps=6", "data.datamodule.batch_size=8", "tracking.log_trained_model=false",
         "callbacks.rich_progress_bar=null", f"data.prepared_dir={prepared}", "data.datamodule.shuffle=false",
         "model.dropout=0", "model.mlp_dropout=0", f"hydra.run.dir={node}"],
        cwd=ROOT, env={**os.environ, "MLFLOW_TRACKING_URI": uri, "OMP_NUM_THREADS": "1"},
        stdout=(tmp_path / f"node{rank}.log").open("w"), stderr=subprocess.STDOUT) for rank, node in enumerate(nodes)]
    try:
        for launch in launches:
            launch.wait(timeout=300)
    finally:  # a node that failed leaves the other waiting at the rendezvous: stop both
        for launch in launches:
            launch.kill() if launch.poll() is None else None
    outputs = [(tmp_path / f"node{rank}.log").read_text() for rank in (0, 1)]
    for rank, (launch, output) in enumerate(zip(launches, outputs)):
        assert launch.returncode == 0, f"node {rank}:\n{output[-3000:]}"
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in outputs[1]

    # node 0 holds the run's outputs; node 1 wrote none of them
    two = torch.load(nodes[0] / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert (nodes[0] / "metrics.json").is_file()
    assert not (nodes[1] / "metrics.json").exists() and not list(nodes[1].rglob("*.ckpt"))
    assert two["global_step"] == 6
    lr = one["hyper_parameters"]["lr"]  # the tolerance of the one-machine test above, for the same reason
    differences = torch.cat([(two["state_dict"][name] - value).abs().flatten()
                             for name, value in one["state_dict"].items() if value.is_floating_point()])
    assert differences.max() <= lr and (differences > 2e-5).float().mean() < 0.01
    client = MlflowClient(uri)
    [mlflow_run] = client.search_runs([client.get_experiment_by_name("tabular").experiment_id])
    assert mlflow_run.info.status == "FINISHED" and mlflow_run.data.params["trainer.num_nodes"] == "2"

    resumed = train(nodes[0], prepared, "trainer=cpu", "trainer.num_nodes=1", "++trainer.max_steps=9",
                    "data.datamodule.batch_size=16", "ckpt_path=last")  # the two-node run goes on on one node
    assert resumed["global_step"] == 9 and resumed["processes"] == 1
