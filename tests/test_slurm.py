"""Sweeps through SLURM's machinery: hydra-submitit-launcher with submitit's local executor
(always), and with a real single-node SLURM (slurmctld + slurmd on 127.0.0.1) where Debian's
`slurm-wlm` is installed (`apt-get install slurm-wlm`) and its daemons start; skipped otherwise."""

import os
import shutil
import socket
import subprocess
import time

import pytest
from conftest import PYTHON, ROOT, free_port, run, sweep_runs

pytestmark = pytest.mark.slow


def test_two_job_sweep_through_submitits_local_executor(tmp_path, prepared_atis):
    uri, sweep = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "sweep"
    result = run([PYTHON, ROOT / "pipelines" / "train.py", "-m", "hydra/launcher=local", "model.n_heads=2,4",
                  "debug=smoke", f"data.prepared_dir={prepared_atis}", f"hydra.sweep.dir={sweep}"],
                 env={"MLFLOW_TRACKING_URI": uri}, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    parent, jobs = sweep_runs(uri, "atis")
    assert parent.data.tags["sweeper"] == "BasicSweeper" and len(jobs) == 2
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in jobs)
    assert sorted(r.data.params["model.n_heads"] for r in jobs) == ["2", "4"]
    # each job ran by submitit in a process of its own, its log and result in submitit's folder
    logs = sorted((sweep / ".submitit").glob("*/*_log.out"))
    assert len(logs) == 2 and len({log.parent.name for log in logs}) == 2
    assert all(list(log.parent.glob("*_result.pkl")) for log in logs)
    assert all((sweep / str(job) / "metrics.json").is_file() for job in (0, 1))


@pytest.fixture
def slurm(tmp_path):
    """A one-node SLURM cluster on loopback, its state in tmp_path; the environment that reaches it."""
    if not (shutil.which("slurmctld") and shutil.which("slurmd") and shutil.which("sbatch")):
        pytest.skip("SLURM is not installed (Debian: apt-get install slurm-wlm)")
    if os.geteuid() != 0:
        pytest.skip("slurmd needs root to start jobs as their user")
    state = tmp_path / "slurm"
    (state / "ctld").mkdir(parents=True)
    (state / "spool").mkdir()
    host = socket.gethostname()
    conf = state / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=transformerlab", f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
        "AuthType=auth/none", "CredType=cred/none", "SlurmUser=root", "SlurmdUser=root",
        f"StateSaveLocation={state / 'ctld'}", f"SlurmdSpoolDir={state / 'spool'}",
        f"SlurmctldPidFile={state / 'slurmctld.pid'}", f"SlurmdPidFile={state / 'slurmd.pid'}",
        "ProctrackType=proctrack/pgid", "TaskPlugin=task/none", "MpiDefault=none",
        "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "ReturnToService=2", "JobCompType=jobcomp/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        f"SlurmctldLogFile={state / 'slurmctld.log'}", f"SlurmdLogFile={state / 'slurmd.log'}",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP", ""]))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons = [subprocess.Popen([daemon, "-D", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT, start_new_session=True)
               for daemon in ("slurmctld", "slurmd")]
    try:
        deadline = time.monotonic() + 30
        while True:
            states = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout
            if "idle" in states:
                break
            if time.monotonic() > deadline or any(d.poll() is not None for d in daemons):
                logs = " | ".join(p.read_text()[-300:] for p in state.glob("*.log"))
                pytest.skip(f"SLURM's daemons did not start here: {logs}")
            time.sleep(0.5)
        yield env
    finally:
        subprocess.run(["scancel", "--user", "root"], env=env, capture_output=True)
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()


def test_a_training_submitted_to_a_real_slurm_through_the_hydra_launcher(tmp_path, prepared_atis, slurm):
    uri, sweep = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "sweep"
    result = subprocess.run(
        [PYTHON, ROOT / "pipelines" / "train.py", "-m", "hydra/launcher=slurm", "hydra.launcher.partition=debug",
         "hydra.launcher.gpus_per_node=null", "hydra.launcher.mem_gb=null", "hydra.launcher.cpus_per_task=1",
         "hydra.launcher.timeout_min=15", "debug=smoke", f"data.prepared_dir={prepared_atis}",
         f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, env={**slurm, "MLFLOW_TRACKING_URI": uri}, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    parent, [job] = sweep_runs(uri, "atis")
    assert job.info.status == "FINISHED" and job.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert "val/slot_f1" in job.data.metrics
    assert (sweep / "0" / "metrics.json").is_file()
    [log] = (sweep / ".submitit").glob("*/*_log.out")
    job_id = log.parent.name  # SLURM's job id: the scheduler allocated the node and ran it
    assert f"JobEnvironment(job_id={job_id}," in log.read_text()
    assert f"Allocate JobId={job_id} " in (tmp_path / "slurm" / "slurmctld.log").read_text()
