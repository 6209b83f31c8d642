"""A team tracking server: `mlflow server` on a PostgreSQL backend store, with the artifacts served
through it (`--serve-artifacts`), so that several people and jobs write to one place.

    python -m transformer_lab.team_server                      # `make server`: a PostgreSQL of its own
    python -m transformer_lab.team_server --backend-store-uri postgresql://USER@HOST:5432/mlflow

Without --backend-store-uri it runs a PostgreSQL cluster of its own in DIR/postgres (the server
binaries come from the `pgserver` package, else from a PostgreSQL on PATH), listening on 127.0.0.1
only, password-protected (DIR/postgres.password); the artifacts go to DIR/artifacts. Clients point
`MLFLOW_TRACKING_URI` at the printed address. Ctrl-C (or SIGTERM) stops the MLflow server, then
PostgreSQL; a restart on the same DIR serves every run stored before.
"""

from __future__ import annotations

import argparse
import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

from transformer_lab.errors import TransformerLabError

DATABASE = "mlflow"
SUPERUSER = "postgres"


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
    raise TransformerLabError("no PostgreSQL server binaries: `pip install pgserver` (what `make install` does), "
                              "install Debian's postgresql, or pass --backend-store-uri of a running server")


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
        kwargs = {"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []} if self.account else {}
        return subprocess.run([str(self.bin / tool), *args], capture_output=True, text=True, timeout=timeout,
                              cwd=self.root, **kwargs)

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
        result = self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--encoding=UTF8", "--locale=C",
                           "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={given}")
        given.unlink()
        if result.returncode:
            raise TransformerLabError(f"initdb {self.data} failed: {(result.stderr or result.stdout).strip()[-300:]}")

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status").returncode == 0

    def start(self) -> None:
        self.initialise()
        if self.running():
            return
        if not self.log.exists():
            self.log.touch()
        self._owned(self.log)
        # the socket lives in the cluster's folder: /var/run/postgresql may not exist or be writable
        result = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                           "-o", f"-h 127.0.0.1 -p {self.port} -k {self.data}", "start")
        if result.returncode:
            tail = self.log.read_text()[-400:].strip() if self.log.is_file() else result.stderr.strip()
            raise TransformerLabError(f"PostgreSQL on 127.0.0.1:{self.port} did not start: {tail}")
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
        if (self.data / "PG_VERSION").is_file() and self.running():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    @property
    def uri(self) -> str:
        # no password in the URI (it would show in `ps`): libpq reads PGPASSWORD, set for the server
        return f"postgresql+psycopg2://{SUPERUSER}@127.0.0.1:{self.port}/{DATABASE}"


def wait_until_healthy(url: str, process: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if process.poll() is not None:
            raise TransformerLabError(f"mlflow server exited with code {process.returncode} before it answered")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TransformerLabError(f"mlflow server at {url} did not answer within {timeout_s:.0f} s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m transformer_lab.team_server",
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = args.dir.resolve()
    (root / "artifacts").mkdir(parents=True, exist_ok=True)
    environment = dict(os.environ)
    postgres = None
    if args.backend_store_uri:
        backend = args.backend_store_uri
    else:
        postgres = LocalPostgres(root, args.postgres_port)
        try:
            postgres.start()
        except BaseException:
            postgres.stop()  # nothing left running behind a failed start
            raise
        backend, environment["PGPASSWORD"] = postgres.uri, postgres.password
        print(f"PostgreSQL: 127.0.0.1:{args.postgres_port}, database {DATABASE}, cluster {postgres.data}", flush=True)
    url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}"
    log = open(root / "mlflow-server.log", "a")
    server = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", backend,
                               "--serve-artifacts", "--artifacts-destination", str(root / "artifacts"),
                               "--host", args.host, "--port", str(args.port), "--workers", str(args.workers)],
                              stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True)

    def stop(*_) -> None:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)  # the server and its workers
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        if postgres:
            postgres.stop()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # runs the `finally` below
    try:
        wait_until_healthy(url, server)
        print(f"MLflow tracking server: {url}   (export MLFLOW_TRACKING_URI={url}; log {root / 'mlflow-server.log'})",
              flush=True)
        return server.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop()
        log.close()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TransformerLabError as err:
        print(f"team_server: {err}", file=sys.stderr)
        sys.exit(2)
