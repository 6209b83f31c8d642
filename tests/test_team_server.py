"""The team tracking server for real: PostgreSQL (the `pgserver` wheel's binaries) under `mlflow
server --serve-artifacts`, started by `python -m transformer_lab.tracking.team_server`; two trainings at once
and a two-job multirun write to it, everything is read back, the server goes down and comes back.
A second server on the same folder, a port another server has, and Ctrl-C leave nothing behind."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from conftest import PYTHON, ROOT, free_port, run, sweep_runs
from mlflow import MlflowClient

from transformer_lab.errors import TransformerLabError
from transformer_lab.tracking import team_server
from transformer_lab.tracking.team_server import LocalPostgres, wait_until_healthy


def test_an_experiment_created_by_another_job_meanwhile_is_used(tmp_path):
    from transformer_lab.tracking.runs import experiment_id

    class LateClient(MlflowClient):  # finds nothing, as a job does whose neighbour creates it a moment later
        looked = 0

        def get_experiment_by_name(self, name):
            self.looked += 1
            return None if self.looked == 1 else super().get_experiment_by_name(name)

    uri = f"sqlite:///{tmp_path}/race.db"
    created = MlflowClient(uri).create_experiment("atis")
    assert experiment_id(LateClient(uri), "atis", str(tmp_path)) == created


def start_server(folder: Path, port: int, postgres_port: int) -> subprocess.Popen:
    log = open(folder / "team_server.out", "a")
    server = subprocess.Popen([PYTHON, "-m", "transformer_lab.tracking.team_server", "--dir", str(folder / "server"),
                               "--port", str(port), "--postgres-port", str(postgres_port), "--workers", "1"],
                              stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return server
        except OSError:
            pass
        if server.poll() is not None:
            break
        time.sleep(0.5)
    server.kill()
    pytest.fail(f"team server did not start:\n{(folder / 'team_server.out').read_text()[-3000:]}")


def stop_server(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=60)


def train_command(prepared, out: Path, *overrides: str, sweep: bool = False) -> list[str]:
    return [PYTHON, ROOT / "pipelines" / "train.py", *(["-m"] if sweep else []), "debug=smoke",
            f"data.prepared_dir={prepared}", *overrides, f"hydra.{'sweep' if sweep else 'run'}.dir={out}"]


@pytest.fixture
def server_folder():
    # run as root, PostgreSQL runs as `nobody`, who cannot enter pytest's private tmp_path
    folder = Path(tempfile.mkdtemp(prefix="team-server-"))
    folder.chmod(0o755)
    yield folder
    postgres = LocalPostgres(folder / "server", 0)
    postgres.stop()  # whatever a failed assertion left running
    subprocess.run(["rm", "-rf", str(folder)], check=False)


@pytest.mark.slow
def test_team_server_on_postgres_keeps_every_run(server_folder, prepared_atis):
    port, postgres_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": url, "PYTHONUNBUFFERED": "1"}
    server = start_server(server_folder, port, postgres_port)
    try:
        # two people's trainings at the same time, then a sweep
        single = {heads: server_folder / f"run-{heads}" for heads in (2, 4)}
        running = [subprocess.Popen([str(a) for a in train_command(prepared_atis, out, f"model.n_heads={heads}")],
                                    cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for heads, out in single.items()]
        outputs = [process.communicate(timeout=600)[0] for process in running]
        for process, output in zip(running, outputs):
            assert process.returncode == 0, output[-3000:]
        sweep = server_folder / "sweep"
        result = run(train_command(prepared_atis, sweep, "model.n_layers=1,2", sweep=True), env={"MLFLOW_TRACKING_URI": url})
        assert result.returncode == 0, result.stderr[-3000:]

        client = MlflowClient(url)
        experiment = client.get_experiment_by_name("atis").experiment_id
        for heads, out in single.items():
            reference = json.loads((out / "mlflow_run.json").read_text())
            stored = client.get_run(reference["run_id"])
            assert stored.info.status == "FINISHED" and stored.data.params["model.n_heads"] == str(heads)
            local = json.loads((out / "metrics.json").read_text())
            assert stored.data.metrics["val/slot_f1"] == pytest.approx(local["val/slot_f1"])
            assert [m.step for m in client.get_metric_history(stored.info.run_id, "train/loss_step")] == [0, 1, 2, 3]
            downloaded = client.download_artifacts(stored.info.run_id, "metrics.json", str(out / "back"))
            assert json.loads(Path(downloaded).read_text()) == local
            [model] = client.search_logged_models([experiment], filter_string=f"source_run_id = '{stored.info.run_id}'")
            assert (Path(client.download_artifacts(stored.info.run_id, "checkpoints", str(out / "ckpt")))
                    / "best.ckpt").is_file()
            assert model.source_run_id == stored.info.run_id
        parent, jobs = sweep_runs(url, "atis")
        jobs = [j for j in jobs if j.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert sorted(j.data.params["model.n_layers"] for j in jobs) == ["1", "2"]
        assert all(j.info.status == "FINISHED" and "val/slot_f1" in j.data.metrics for j in jobs)
        stored_ids = {r.info.run_id for r in client.search_runs([experiment])}
        assert len(stored_ids) == 5  # 2 trainings + sweep parent + 2 jobs: nothing lost, nothing mixed

        # what the server stored is in PostgreSQL, not in a file beside it
        import psycopg2

        postgres = LocalPostgres(server_folder / "server", postgres_port)
        with psycopg2.connect(host="127.0.0.1", port=postgres_port, user="postgres", password=postgres.password,
                              dbname="mlflow") as connection, connection.cursor() as cursor:
            cursor.execute("SELECT run_uuid FROM runs")
            assert {row[0] for row in cursor.fetchall()} >= stored_ids
        # and the artifacts went through the server into its own folder
        assert any(p.name == "best.ckpt" for p in (server_folder / "server" / "artifacts").rglob("*"))
    finally:
        stop_server(server)

    # the server is down: a training fails at once with one line, it does not retry for minutes
    started = time.perf_counter()
    result = run(train_command(prepared_atis, server_folder / "while-down"), env={"MLFLOW_TRACKING_URI": url})
    assert result.returncode != 0 and time.perf_counter() - started < 60
    assert f"MLflow tracking server {url} does not answer" in result.stderr
    assert not (server_folder / "while-down" / "metrics.json").exists()

    server = start_server(server_folder, port, postgres_port)  # the same folder: the same store
    try:
        client = MlflowClient(url)
        assert {r.info.run_id for r in client.search_runs([experiment])} == stored_ids
        assert all(r.info.status == "FINISHED" for r in client.search_runs([experiment]))
    finally:
        stop_server(server)
    assert not LocalPostgres(server_folder / "server", postgres_port).running()  # stopped with the server


class AnswersEverything(BaseHTTPRequestHandler):
    """Another web server on the port, as `make ui` is: 200 to /health and to every other GET."""

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, *_):
        pass


@pytest.fixture
def other_http_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), AnswersEverything)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def team_server_command(folder: Path, port: int, postgres_port: int) -> list[str]:
    return [PYTHON, "-m", "transformer_lab.tracking.team_server", "--dir", str(folder), "--port", str(port),
            "--postgres-port", str(postgres_port), "--workers", "1"]


def processes_of(folder: Path) -> list[psutil.Process]:
    """Every process whose command line names the folder: its PostgreSQL, its mlflow server."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if str(folder) in " ".join(process.info["cmdline"] or []) and process.pid != os.getpid():
            found.append(process)
    return found


@pytest.mark.parametrize("taken", ["--port", "--postgres-port"])
def test_a_taken_port_is_refused_before_anything_starts(server_folder, other_http_server, taken):
    port, postgres_port = (other_http_server, free_port()) if taken == "--port" else (free_port(), other_http_server)
    result = run(team_server_command(server_folder / "server", port, postgres_port), timeout=180)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""  # no banner with an address that belongs to another server
    [line] = result.stderr.splitlines()
    assert f"127.0.0.1:{other_http_server} is already in use" in line and taken in line
    assert not (server_folder / "server" / "postgres").exists()  # no cluster made, none started
    assert processes_of(server_folder) == []


def test_without_postgres_binaries_one_line_names_the_install(monkeypatch):
    """pgserver is the `server` extra, not a core dependency: an install without it is told how to get it."""
    monkeypatch.setitem(sys.modules, "pgserver", None)  # as if not installed: its import fails
    monkeypatch.setitem(sys.modules, "pgserver._commands", None)
    monkeypatch.setattr(team_server.shutil, "which", lambda name: None)  # no PostgreSQL on PATH
    monkeypatch.setattr(team_server.glob, "glob", lambda pattern: [])  # nor Debian's
    with pytest.raises(TransformerLabError) as raised:
        team_server.postgres_bin_dir()
    message = str(raised.value)
    assert "\n" not in message
    assert "`make server` installs them (pip install 'transformer-lab[server]')" in message
    assert "--backend-store-uri" in message


def test_health_answered_by_another_server_is_not_taken_for_ours(other_http_server):
    # ours never binds the port: something else took it between the check and the start
    ours = subprocess.Popen(["sleep", "60"])
    try:
        url = f"http://127.0.0.1:{other_http_server}"
        with pytest.raises(TransformerLabError, match=f"another program answers at {url}"):
            wait_until_healthy(url, ours, other_http_server, timeout_s=30)
    finally:
        ours.kill()
        ours.wait()


@pytest.mark.slow
def test_a_second_server_on_the_same_folder_is_refused_and_the_first_keeps_serving(server_folder):
    port, postgres_port = free_port(), free_port()
    first = start_server(server_folder, port, postgres_port)
    try:
        for second_ports in ((port, postgres_port), (free_port(), free_port())):
            result = run(team_server_command(server_folder / "server", *second_ports), timeout=180)
            assert result.returncode == 2, result.stdout + result.stderr
            assert result.stdout == ""
            [line] = result.stderr.splitlines()
            assert f"{(server_folder / 'server').resolve()} is in use by another team server (pid {first.pid})" in line
        # the first one still has its PostgreSQL: a real call, not only /health
        client = MlflowClient(f"http://127.0.0.1:{port}")
        created = client.create_experiment("still-served")
        assert created in {e.experiment_id for e in client.search_experiments()}
        assert first.poll() is None
    finally:
        stop_server(first)
    assert first.returncode == 0
    assert processes_of(server_folder) == []


def interrupt_and_check_everything_stops(server: subprocess.Popen, folder: Path) -> str:
    """Ctrl-C to the team server: it exits 0 within a hang guard, leaving no process behind."""
    children = psutil.Process(server.pid).children(recursive=True)
    postmaster_pid = folder / "server" / "postgres" / "postmaster.pid"
    if postmaster_pid.is_file():  # pg_ctl's postmaster is no child of ours: it runs in a session of its own
        postmaster = psutil.Process(int(postmaster_pid.read_text().split()[0]))
        children += [postmaster, *postmaster.children(recursive=True)]
    server.send_signal(signal.SIGINT)
    output, _ = server.communicate(timeout=60)
    assert server.returncode == 0, output
    _, alive = psutil.wait_procs(children, timeout=10)  # for init to reap the orphans
    assert alive == [] and processes_of(folder) == []
    return output


@pytest.mark.slow
def test_ctrl_c_stops_the_mlflow_server_and_postgres_during_start_up_and_while_serving(server_folder):
    port, postgres_port = free_port(), free_port()
    def start() -> subprocess.Popen:
        # a script's `make server &` hands the server SIGINT ignored: Ctrl-C must work all the same
        return subprocess.Popen(team_server_command(server_folder / "server", port, postgres_port), cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))

    def is_mlflow_server(process: psutil.Process) -> bool:
        try:
            return "mlflow" in " ".join(process.cmdline())
        except psutil.NoSuchProcess:
            return False

    starting = start()
    deadline = time.time() + 180
    while not any(is_mlflow_server(p) for p in psutil.Process(starting.pid).children(recursive=True)):
        assert starting.poll() is None and time.time() < deadline, starting.communicate()[0]
        time.sleep(0.2)
    output = interrupt_and_check_everything_stops(starting, server_folder)
    assert "MLflow tracking server:" not in output

    serving = start()
    while True:  # the banner comes once the server answers
        line = serving.stdout.readline()
        assert line, "exited before it served"
        if line.startswith("MLflow tracking server:"):
            break
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).status == 200
    interrupt_and_check_everything_stops(serving, server_folder)


@pytest.mark.slow
def test_a_cluster_left_by_a_killed_server_is_stopped_and_started_again_on_the_asked_port(server_folder):
    port, old_postgres_port, new_postgres_port = free_port(), free_port(), free_port()
    killed = start_server(server_folder, port, old_postgres_port)
    created = MlflowClient(f"http://127.0.0.1:{port}").create_experiment("before-the-crash")
    [mlflow_cli] = psutil.Process(killed.pid).children()
    killed.kill()  # kill -9: nothing stopped, PostgreSQL (a session of its own) runs on
    killed.wait()
    os.killpg(mlflow_cli.pid, signal.SIGKILL)  # what the user does next: their MLflow port is taken
    # a killed worker lets go of its socket only once the kernel has finished it off: wait, as a user would
    deadline = time.time() + 60
    while team_server.listeners(port) and time.time() < deadline:
        time.sleep(0.2)
    assert LocalPostgres(server_folder / "server", old_postgres_port).running()

    server = start_server(server_folder, port, new_postgres_port)
    try:
        assert MlflowClient(f"http://127.0.0.1:{port}").get_experiment(created).name == "before-the-crash"
        socket.create_connection(("127.0.0.1", new_postgres_port), timeout=5).close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", old_postgres_port), timeout=5)
    finally:
        stop_server(server)
    assert "stopped the PostgreSQL that an earlier server" in (server_folder / "team_server.out").read_text()
    assert processes_of(server_folder) == []
