"""Sweeps through SLURM's machinery: hydra-submitit-launcher with submitit's local executor
(always), and with a real single-node SLURM (slurmctld + slurmd on 127.0.0.1) where Debian's
`slurm-wlm` is installed (`apt-get install slurm-wlm`) and its daemons start; skipped otherwise.
A job sent the time-limit signal is requeued and resumes from the state it saved."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import PYTHON, ROOT, free_port, run, sweep_runs
from torch.utils.data import DataLoader

from transformer_lab.training.callbacks import CheckpointOnRequeue, requeue_checkpoint
from transformer_lab.training.train import resume_from


def test_only_a_later_attempt_of_the_same_job_resumes_from_its_requeue_checkpoint(tmp_path, monkeypatch):
    for name in ("requeue_41.ckpt", "requeue_42.ckpt", "last.ckpt"):
        (tmp_path / name).write_bytes(b"")
    # not a submitit job: no requeue checkpoint is looked for, ckpt_path alone decides
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    assert requeue_checkpoint(tmp_path) is None
    assert resume_from(None, str(tmp_path)) is None
    assert resume_from("last", str(tmp_path)) == str(tmp_path / "last.ckpt")
    # attempt 2 of local job 42 continues attempt 1 (which may itself have started from ckpt_path)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")
    monkeypatch.setenv("SUBMITIT_LOCAL_JOB_ID", "42")
    assert requeue_checkpoint(tmp_path) == tmp_path / "requeue_42.ckpt"
    assert resume_from(None, str(tmp_path)) == str(tmp_path / "requeue_42.ckpt")
    assert resume_from("last", str(tmp_path)) == str(tmp_path / "requeue_42.ckpt")
    # a first attempt (job 43: nothing saved under its id) starts as asked
    monkeypatch.setenv("SUBMITIT_LOCAL_JOB_ID", "43")
    assert resume_from(None, str(tmp_path)) is None
    assert resume_from("last", str(tmp_path)) == str(tmp_path / "last.ckpt")
    # SLURM array jobs: ARRAYID_TASKID, which `scontrol requeue` keeps
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setenv("SLURM_JOB_ID", "1007")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "1000")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "7")
    assert requeue_checkpoint(tmp_path) == tmp_path / "requeue_1000_7.ckpt"


class SignalledAt(L.LightningModule):
    """A linear model whose training step `signal_at` sends this process SIGUSR2, as SLURM does
    signal_delay_s before the job's time limit."""

    def __init__(self, signal_at: int | None = None):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.signal_at = signal_at

    def training_step(self, batch, batch_idx):
        if self.global_step == self.signal_at:
            os.kill(os.getpid(), signal.SIGUSR2)
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_signal_is_held_to_the_end_of_the_batch_then_the_state_is_saved_and_submitit_requeues(tmp_path, monkeypatch):
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")
    monkeypatch.setenv("SUBMITIT_LOCAL_JOB_ID", "7")
    path = requeue_checkpoint(tmp_path)
    calls = []

    def submitit_handler(signum, frame):  # what submitit's does: requeue, then exit (the local executor's code)
        calls.append((signum, path.is_file()))
        raise SystemExit(144)

    batches = DataLoader(torch.randn(40, 4), batch_size=4)  # 10 steps an epoch
    trainer_args = {"accelerator": "cpu", "max_epochs": 2, "logger": False, "enable_checkpointing": False,
                    "enable_progress_bar": False, "enable_model_summary": False}
    previous = signal.signal(signal.SIGUSR2, submitit_handler)
    try:
        callback = CheckpointOnRequeue(path)
        trainer = L.Trainer(callbacks=[callback], **trainer_args)
        with pytest.raises(SystemExit, match="144"):
            trainer.fit(SignalledAt(signal_at=12), batches)
        assert calls == [(signal.SIGUSR2, True)]  # once, after the checkpoint was in place
        assert callback.requeued and signal.getsignal(signal.SIGUSR2) is submitit_handler  # handed back
        saved = torch.load(path, weights_only=True)
        assert saved["global_step"] == 13 and saved["epoch"] == 1  # the signalled batch completed, nothing after it
        assert not path.with_name(path.name + ".partial").exists()

        # the next attempt continues from there to the same end
        resumed = L.Trainer(callbacks=[CheckpointOnRequeue(path)], **trainer_args)
        resumed.fit(SignalledAt(), batches, ckpt_path=path, weights_only=True)
        assert resumed.global_step == 20 and calls == [(signal.SIGUSR2, True)]
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_outside_a_submitit_job_the_signal_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        trainer = L.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[CheckpointOnRequeue(requeue_checkpoint(tmp_path))])
        trainer.fit(SignalledAt(signal_at=2), DataLoader(torch.randn(40, 4), batch_size=4))
        assert trainer.global_step == 10 and not list(tmp_path.iterdir())
    finally:
        signal.signal(signal.SIGUSR2, previous)


@pytest.mark.slow
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


REQUEUE_EPOCHS = 8  # of debug=smoke's 4 steps: seconds of training, long enough to be interrupted in


def start_signalled_sweep(launcher_overrides: list[str], sweep, uri: str, prepared_atis, env: dict):
    """A one-job training sweep, started in the background, its output in sweep.log."""
    sweep.mkdir()
    return subprocess.Popen(
        [PYTHON, ROOT / "pipelines" / "train.py", "-m", *launcher_overrides, "debug=smoke",
         f"data.prepared_dir={prepared_atis}", f"trainer.max_epochs={REQUEUE_EPOCHS}",
         "tracking.log_trained_model=false", f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, env={**env, "MLFLOW_TRACKING_URI": uri, "PYTHONUNBUFFERED": "1"},
        stdout=open(sweep / "sweep.log", "w"), stderr=subprocess.STDOUT)


def signal_when_training(launcher: subprocess.Popen, sweep, uri: str, send_signal) -> list[str]:
    """send_signal() once the job's first epoch is in its history (it is training), then wait for the
    sweep to end; the statuses its MLflow run went through from the signal on."""
    from mlflow import MlflowClient

    history, reference = sweep / "0" / "history.csv", sweep / "0" / "mlflow_run.json"
    statuses = []
    try:
        deadline = time.monotonic() + 300
        while not history.is_file() and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert history.is_file(), "the job did not train"
        send_signal()
        client, run_id = MlflowClient(uri), json.loads(reference.read_text())["run_id"]
        deadline = time.monotonic() + 600
        while launcher.poll() is None and time.monotonic() < deadline:
            status = client.get_run(run_id).info.status
            if not statuses or statuses[-1] != status:
                statuses.append(status)
            time.sleep(0.2)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.wait() == 0, (sweep / "sweep.log").read_text()[-3000:]
    return statuses


def assert_resumed_into_one_run(sweep, uri: str) -> str:
    """The job was requeued mid-training, resumed from the state it saved and ended as one uninterrupted
    run would: every step and epoch once, its own MLflow run FINISHED. Its job id."""
    from mlflow import MlflowClient

    [log] = (sweep / ".submitit").glob("*/*_log.out")  # both attempts of the job append to it
    job_id, total = log.parent.name, 4 * REQUEUE_EPOCHS
    text = log.read_text() + log.with_name(log.name.replace(".out", ".err")).read_text()
    checkpoint = sweep / "0" / "checkpoints" / f"requeue_{job_id}.ckpt"
    [saved_at] = [int(step) for step in re.findall(r"its state at step (\d+) goes to", text)]
    assert 4 <= saved_at < total  # after the first epoch, before the end
    assert f"Requeued job {job_id}" in text and f"resuming {checkpoint}" in text
    assert not checkpoint.exists()  # removed once the job ended: no later attempt resumes from it

    metrics = json.loads((sweep / "0" / "metrics.json").read_text())
    assert metrics["steps"] == total and metrics["epochs"] == REQUEUE_EPOCHS
    history = (sweep / "0" / "history.csv").read_text().splitlines()[1:]
    assert [line.split(",")[0] for line in history] == [str(epoch) for epoch in range(REQUEUE_EPOCHS)]
    parent, [job] = sweep_runs(uri, "atis")
    assert job.info.status == "FINISHED" and job.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert json.loads((sweep / "0" / "mlflow_run.json").read_text())["run_id"] == job.info.run_id
    # the per-step curve goes on where the first attempt stopped, each step once; the one gap: the batch
    # in flight at the signal, whose step metrics Lightning logs after the hook that saved the state
    steps = [m.step for m in MlflowClient(uri).get_metric_history(job.info.run_id, "train/loss_step")]
    assert sorted(steps) == [step for step in range(total) if step != saved_at - 1]
    return job_id


@pytest.mark.slow
def test_a_job_signalled_before_its_time_limit_is_requeued_and_resumes_into_the_same_run(tmp_path, prepared_atis):
    """SIGUSR2 is what SLURM sends signal_delay_s before a job's time limit (submitit's --signal); the
    local executor requeues a job as SLURM does (the same handler, the same pickled resubmission)."""
    import psutil

    uri, sweep = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "sweep"
    launcher = start_signalled_sweep(["hydra/launcher=local"], sweep, uri, prepared_atis, dict(os.environ))

    def signal_the_job():  # the process submitit runs the job in, under the launching command
        [task] = [p for p in psutil.Process(launcher.pid).children(recursive=True)
                  if "submitit.core._submit" in " ".join(p.cmdline())]
        task.send_signal(signal.SIGUSR2)

    statuses = signal_when_training(launcher, sweep, uri, signal_the_job)
    assert_resumed_into_one_run(sweep, uri)
    assert "KILLED" in statuses and statuses[statuses.index("KILLED") + 1] == "RUNNING"  # reopened, then FINISHED


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
        "AuthInfo=cred_expire=5",  # also how long a requeued job waits to start again (120 s by default)
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
        # a batch step's slurmstepd outlives slurmd (it keeps retrying to report the step's end): this
        # cluster's ones, known by the SLURM_CONF in their environment (read raw: its title overwrites the start)
        import psutil

        ours = f"SLURM_CONF={conf}\0".encode()
        for process in psutil.process_iter(["name"]):
            try:
                if process.info["name"] == "slurmstepd" and ours in Path(f"/proc/{process.pid}/environ").read_bytes():
                    process.kill()
            except (OSError, psutil.Error):
                pass


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_real_slurm_job_signalled_before_its_time_limit_is_requeued_and_resumes(tmp_path, prepared_atis, slurm):
    """The signal as slurmd delivers it at `--signal=USR2@signal_delay_s` (here sent at once by
    `scancel --signal`), submitit's `scontrol requeue`, and SLURM starting the job again."""
    uri, sweep = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "sweep"
    launcher = start_signalled_sweep(
        ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.gpus_per_node=null",
         "hydra.launcher.mem_gb=null", "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=15"],
        sweep, uri, prepared_atis, slurm)

    def signal_the_job():
        [job_id] = subprocess.run(["squeue", "-h", "-o", "%i"], env=slurm, capture_output=True, text=True,
                                  check=True).stdout.split()
        subprocess.run(["scancel", "--signal=USR2", job_id], env=slurm, check=True)

    signal_when_training(launcher, sweep, uri, signal_the_job)
    job_id = assert_resumed_into_one_run(sweep, uri)
    scheduler = (tmp_path / "slurm" / "slurmctld.log").read_text()
    assert f"Requeuing JobId={job_id} " in scheduler or f"Requeuing JobId={job_id}\n" in scheduler
