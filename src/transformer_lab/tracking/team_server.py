"""A team tracking server: `mlflow server` on a PostgreSQL backend store, with the artifacts served
through it (`--serve-artifacts`), so that several people and jobs write to one place.

    python -m transformer_lab.tracking.team_server                      # `make server`: a PostgreSQL of its own
    python -m transformer_lab.tracking.team_server --backend-store-uri postgresql://USER@HOST:5432/mlflow

Without --backend-store-uri it runs a PostgreSQL cluster of its own in DIR/postgres (the server
binaries come from the `pgserver` package, the `server` extra that `make server` installs, else from a
PostgreSQL on PATH), listening on 127.0.0.1 only, password-protected (DIR/postgres.password); the
artifacts go to DIR/artifacts. Clients point `MLFLOW_TRACKING_URI` at the printed address. Ctrl-C (or
SIGTERM) stops the MLflow server, then PostgreSQL, and exits 0; a restart on the same DIR serves every
run stored before.

One server per DIR: it holds a lock on DIR/team-server.lock while it runs, and a second start on
the same DIR exits 2 without touching the first. Both ports are checked free before anything starts,
and the address is printed only once the server that answers on it is the one started here.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path
from typing import IO

import psutil

from transformer_lab.errors import TransformerLabError

DATABASE = "mlflow"
SUPERUSER = "postgres"
LOCK_FILE = "team-server.lock"
MLFLOW_STOP_GRACE_S = 10  # then its process group is killed: workers of a server that is going away


def lock_folder(root: Path) -> IO:
    """Hold DIR's lock for as long as this process lives (the OS drops it when the process dies, however
    it dies): a second server on the same DIR would share the first's PostgreSQL cluster and stop it."""
    root.mkdir(parents=True, exist_ok=True)
    lock = open(root / LOCK_FILE, "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise TransformerLabError(f"{root} is in use by another team server (pid {holder}): stop that one, "
                                  "or give this one another --dir") from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def listeners(port: int) -> set[int | None]:
    """The processes listening on a TCP port (None for one this user may not inspect)."""
    return {c.pid for c in psutil.net_connections("inet")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}


def require_free_port(host: str, port: int, option: str) -> None:
    """Bind the port once, as the servers will: a server already on it would answer for this one."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # as uvicorn and PostgreSQL do: a connection of a server stopped a moment ago is no obstacle
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
            return
        except OSError as err:
            failure = err
    if failure.errno != errno.EADDRINUSE:
        raise TransformerLabError(f"{host}:{port} cannot be listened on ({failure.strerror}): pass another {option}")
    holders = ""
    for pid in sorted(pid for pid in listeners(port) if pid):
        with contextlib.suppress(psutil.Error):
            command = " ".join(" ".join(psutil.Process(pid).cmdline()).split())  # on one line
            holders += f" (pid {pid}: {command[:100]})"
    raise TransformerLabError(f"{host}:{port} is already in use{holders}: stop what listens there (`make ui`?) "
                              f"or pass another {option}")


def postgres_bin_dir() -> Path:
    """Where initdb, pg_ctl and postgres are: the `pgserver` wheel's, else PATH's, else Debian's."""
    try:
        with warnings.catch_warnings():  # the package's import looks for a runtime folder it is not asked to use
            warnings.simplefilter("ignore")
            from pgserver._commands import POSTGRES_BIN_PATH
        if (POSTGRES_BIN_PATH / "pg_ctl").is_file():
            return POSTGRES_BIN_PATH
    except ImportError:
        pass
    on_path = shutil.which("pg_ctl")
    candidates = ([str(Path(on_path).resolve().parent)] if on_path else []) + sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for folder in candidates:
        if Path(folder, "initdb").is_file():
            return Path(folder)
    raise TransformerLabError("no PostgreSQL server binaries: `make server` installs them (pip install "
                              "'transformer-lab[server]'), or install Debian's postgresql, or pass "
                              "--backend-store-uri of a running server")


def last_lines(text: str, count: int = 3) -> str:
    """A tool's last words on one line: an error message is one line."""
    return " / ".join(line.strip() for line in text.strip().splitlines()[-count:])


class LocalPostgres:
    """A PostgreSQL cluster in one folder, on 127.0.0.1:port. PostgreSQL refuses to run as root, so
    a root user runs it as `nobody` (the folder's parents must then be readable by everyone)."""

    def __init__(self, root: Path, port: int):
        self.root, self.port = root, port
        self.data, self.log = root / "postgres", root / "postgres.log"
        self.password_file = root / "postgres.password"
        self.bin = postgres_bin_dir()
        self.account = pwd.getpwnam("nobody") if os.geteuid() == 0 else None

    def _run(self, tool: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a PostgreSQL tool to its end. In a session of its own, so that the terminal's Ctrl-C goes to
        this process only, and waited for even then: a `pg_ctl start` killed half-way could leave a
        postmaster behind that `stop` does not know of yet."""
        kwargs = {"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []} if self.account else {}
        command = [str(self.bin / tool), *args]
        tool_process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        cwd=self.root, start_new_session=True, **kwargs)
        try:
            stdout, stderr = tool_process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            tool_process.kill()
            tool_process.communicate()
            raise TransformerLabError(f"{tool} did not finish within {timeout:.0f} s (cluster {self.data})") from None
        except BaseException:  # Ctrl-C or SIGTERM: `main` stops what was started once the tool is done
            tool_process.communicate(timeout=timeout)
            raise
        return subprocess.CompletedProcess(command, tool_process.returncode, stdout, stderr)

    def _owned(self, path: Path) -> None:
        if self.account:
            os.chown(path, self.account.pw_uid, self.account.pw_gid)

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    def initialise(self) -> None:
        """initdb once: password authentication over TCP, the password kept beside the cluster (0600)."""
        if (self.data / "PG_VERSION").is_file():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(self.root.stat().st_mode | 0o711)  # `nobody` must reach the cluster's folder
        password = secrets.token_urlsafe(24)
        self.password_file.write_text(password + "\n")
        self.password_file.chmod(0o600)
        shutil.rmtree(self.data, ignore_errors=True)  # a half-made cluster of an interrupted initdb
        self.data.mkdir(mode=0o700)
        self._owned(self.data)
        given = self.root / "initdb.password"  # read by initdb, removed at once
        given.write_text(password + "\n")
        self._owned(given)
        try:
            result = self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--encoding=UTF8", "--locale=C",
                               "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={given}")
        finally:
            given.unlink()
        if result.returncode:
            raise TransformerLabError(f"initdb {self.data} failed: {last_lines(result.stderr or result.stdout)}")

    def running(self) -> bool:
        if not (self.data / "PG_VERSION").is_file():
            return False
        return self._run("pg_ctl", "-D", str(self.data), "status").returncode == 0

    def stop_leftover(self) -> bool:
        """Stop a cluster an earlier server of this DIR left running when it was killed (kill -9, a crash).
        The caller holds DIR's lock, so no live server uses it; adopting it would keep the port it was
        started on, which need not be --postgres-port."""
        if not self.running():
            return False
        self.stop()
        return True

    def start(self) -> None:
        self.initialise()
        if not self.log.exists():
            self.log.touch()
        self._owned(self.log)
        # the socket lives in the cluster's folder: /var/run/postgresql may not exist or be writable
        result = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                           "-o", f"-h 127.0.0.1 -p {self.port} -k {self.data}", "start")
        if result.returncode:
            tail = last_lines(self.log.read_text() if self.log.is_file() else result.stderr)
            raise TransformerLabError(f"PostgreSQL on 127.0.0.1:{self.port} did not start: {tail} (log {self.log})")
        self.create_database()

    def create_database(self) -> None:
        import psycopg2

        connection = psycopg2.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, password=self.password,
                                      dbname="postgres", connect_timeout=10)
        connection.autocommit = True  # CREATE DATABASE runs outside a transaction block
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
                if cursor.fetchone() is None:
                    cursor.execute(f"CREATE DATABASE {DATABASE}")
        finally:
            connection.close()

    def stop(self) -> None:
        if self.running():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    @property
    def uri(self) -> str:
        # no password in the URI (it would show in `ps`): libpq reads PGPASSWORD, set for the server
        return f"postgresql+psycopg2://{SUPERUSER}@127.0.0.1:{self.port}/{DATABASE}"


def wait_until_healthy(url: str, process: subprocess.Popen, port: int, timeout_s: float = 180) -> None:
    """Until `process` (or one of its workers) answers /health on `port`. An answer from anything else
    means the port was taken after it was checked: runs sent there would land in another store."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if process.poll() is not None:
            raise TransformerLabError(f"mlflow server exited with code {process.returncode} before it answered")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                answered = response.status == 200
        except OSError:
            answered = False
        if answered:
            try:
                ours = {process.pid} | {child.pid for child in psutil.Process(process.pid).children(recursive=True)}
            except psutil.NoSuchProcess:
                continue  # it has just exited: the next round says so
            if not listeners(port) & ours:
                raise TransformerLabError(f"another program answers at {url}, not the mlflow server started here: "
                                          "pass another --port")
            return
        time.sleep(0.5)
    raise TransformerLabError(f"mlflow server at {url} did not answer within {timeout_s:.0f} s")


def stop_process_group(leader: subprocess.Popen, grace_s: float = MLFLOW_STOP_GRACE_S) -> None:
    """SIGTERM to the leader's process group (the mlflow CLI, uvicorn, the job runner and its huey
    consumers, which outlive their parents), SIGKILL to what is left of it after grace_s."""
    def group_alive() -> bool:
        leader.poll()  # reaps the leader: a zombie still counts as a member of its group
        try:
            os.killpg(leader.pid, 0)
            return True
        except ProcessLookupError:
            return False

    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signum)
        deadline = time.monotonic() + wait_s
        while group_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not group_alive():
            break
    leader.wait()


def let_signals_pass() -> None:
    """From here on Ctrl-C and SIGTERM do nothing: a second one must not cut short the stopping of what
    was started. (A no-op handler, not SIG_IGN, which the PostgreSQL tools run meanwhile would inherit.)"""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: None)


def stop_requested(signum: int, _frame) -> None:
    """Ctrl-C or SIGTERM: unwind `serve`, whose exit stack stops the MLflow server, then PostgreSQL."""
    let_signals_pass()
    print(f"team_server: {signal.Signals(signum).name}: stopping the MLflow server, then PostgreSQL",
          file=sys.stderr, flush=True)
    raise KeyboardInterrupt


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m transformer_lab.tracking.team_server",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path(".team-server"),
                        help="the server's folder: PostgreSQL cluster, artifacts, logs")
    parser.add_argument("--host", default="127.0.0.1", help="address the MLflow server binds to (0.0.0.0: every "
                        "interface; put authentication in front first)")
    parser.add_argument("--port", type=int, default=5000, help="MLflow server port")
    parser.add_argument("--postgres-port", type=int, default=5433, help="port of the local PostgreSQL (127.0.0.1)")
    parser.add_argument("--backend-store-uri", help="a running PostgreSQL (postgresql://USER@HOST:PORT/DB; the "
                        "password from PGPASSWORD or ~/.pgpass) instead of a local one")
    parser.add_argument("--workers", type=int, default=2, help="MLflow server worker processes")
    return parser.parse_args(argv)


def serve(args: argparse.Namespace, root: Path) -> None:
    """Start PostgreSQL (unless --backend-store-uri), then the MLflow server, and serve until interrupted;
    what was started is stopped in reverse order however it ends. Returns only by an exception."""
    require_free_port(args.host, args.port, "--port")
    environment = dict(os.environ)
    banner = []
    with contextlib.ExitStack() as started:
        try:
            if args.backend_store_uri:
                backend = args.backend_store_uri
            else:
                postgres = LocalPostgres(root, args.postgres_port)
                if postgres.stop_leftover():
                    print(f"team_server: stopped the PostgreSQL that an earlier server of {root} left running",
                          file=sys.stderr, flush=True)
                require_free_port("127.0.0.1", args.postgres_port, "--postgres-port")
                started.callback(postgres.stop)
                postgres.start()
                backend, environment["PGPASSWORD"] = postgres.uri, postgres.password
                banner.append(f"PostgreSQL: 127.0.0.1:{args.postgres_port}, database {DATABASE}, "
                              f"cluster {postgres.data}")
            (root / "artifacts").mkdir(exist_ok=True)
            log = started.enter_context(open(root / "mlflow-server.log", "a"))
            url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}"
            # in a session of its own: the terminal's Ctrl-C reaches this process only, which stops the
            # MLflow server before PostgreSQL
            server = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
                                       backend, "--serve-artifacts", "--artifacts-destination", str(root / "artifacts"),
                                       "--host", args.host, "--port", str(args.port), "--workers", str(args.workers)],
                                      stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True)
            started.callback(stop_process_group, server)
            wait_until_healthy(url, server, args.port)
            banner.append(f"MLflow tracking server: {url}   (export MLFLOW_TRACKING_URI={url}; "
                          f"log {root / 'mlflow-server.log'})")
            print("\n".join(banner), flush=True)
            code = server.wait()
            raise TransformerLabError(f"mlflow server stopped by itself with code {code}: see {log.name}")
        finally:
            let_signals_pass()


def main(argv: list[str] | None = None) -> int:
    """0 once stopped by Ctrl-C or SIGTERM; a TransformerLabError (exit 2) for whatever keeps it from serving."""
    args = parse_args(argv)
    try:
        # set, not inherited: a shell script's `make server &` would hand it SIGINT ignored
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, stop_requested)
        root = args.dir.resolve()
        with lock_folder(root):
            serve(args, root)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TransformerLabError as err:
        print(f"team_server: {err}", file=sys.stderr)
        sys.exit(2)
