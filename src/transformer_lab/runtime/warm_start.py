"""Run a command whose pipeline stages start in a warm interpreter: `python -m transformer_lab.runtime.warm_start dvc repro`.

Every stage of `dvc repro` is a fresh `python3 pipelines/X.py`, and importing Lightning, torch,
MLflow and their neighbours costs each one about 7 s on two cores, more than many stages spend
working. This wrapper starts the command it is given and meanwhile imports those libraries once. While
the command runs, each entry point in pipelines/ that finds TRANSFORMER_LAB_WARM_SOCKET in its
environment hands its command line, working directory, environment and stdin/stdout/stderr
over that socket instead of importing anything: the wrapper forks, and the child runs the
script as `python3 pipelines/X.py` would, in a copy of the warm interpreter. The entry point
exits with the child's exit status, and a signal it receives is passed on to the child.

Only third-party libraries are imported ahead: the project's own code is read afresh by each
stage, so a stage runs what DVC hashed. A stage's extra processes (DDP) start cold. Without the
variable, or where the socket does not answer, an entry point runs as it always has.
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

SOCKET_ENV = "TRANSFORMER_LAB_WARM_SOCKET"
# What a training or evaluation stage imports before it does any work (`python -X importtime`
# on a stage: MLflow's SQL store alone is 2 s, imported when a run first opens its store); each
# is optional. Imports only: no store is opened, no connection inherited.
PRELOAD = ("torch", "lightning", "torchmetrics", "mlflow", "hydra", "omegaconf", "matplotlib.pyplot",
           "transformers", "tokenizers", "datasets", "pandas", "sklearn", "xgboost",
           "mlflow.store.tracking.sqlalchemy_store", "mlflow.store.model_registry.sqlalchemy_store",
           "sqlalchemy.dialects.sqlite", "alembic.config", "mlflow.pyfunc", "IPython", "git", "pyarrow.parquet")
_HEADER = struct.Struct("!Q")  # the length of the JSON request that follows the file descriptors


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("warm_start: the request was cut short")
        data += chunk
    return data


# --- the entry point's side -------------------------------------------------------------------

def hand_over(script: str) -> None:
    """If a warm interpreter is listening, run `script` with this process's arguments there and exit
    with its status; otherwise return, and the caller runs as usual."""
    path = os.environ.get(SOCKET_ENV)
    if not path:
        return
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        return  # the wrapper has gone (or this is a copy of its environment): run cold
    request = json.dumps({"argv": [str(Path(script).resolve()), *sys.argv[1:]], "cwd": os.getcwd(),
                          "env": dict(os.environ)}).encode()
    socket.send_fds(conn, [_HEADER.pack(len(request))], [0, 1, 2])
    conn.sendall(request)
    child = int(_read_exactly(conn, 8).decode())

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    status = _read_exactly(conn, 4)
    os._exit(struct.unpack("!i", status)[0])


# --- the warm interpreter's side --------------------------------------------------------------

def _preload(modules: tuple[str, ...], command_process: subprocess.Popen | None = None) -> None:
    """Import `modules`, stopping early once `command_process` has ended (nothing left to warm up for)."""
    import importlib

    for name in modules:
        if command_process is not None and command_process.poll() is not None:
            return
        try:
            importlib.import_module(name)
        except Exception:  # not installed, or broken: the stage that needs it will say so itself
            pass


def _run_script(request: dict, fds: list[int]) -> int:
    """In the forked child: become `python3 SCRIPT ARGS` started in the caller's directory."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.pop(SOCKET_ENV, None)  # processes this stage starts (DDP ranks) start cold
    script, *_ = sys.argv[:] = request["argv"]
    sys.path[0] = str(Path(script).parent)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)  # as `python3 SCRIPT` on a terminal or pipe
    try:
        runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as exit_:
        code = exit_.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1


def _leave(code: int) -> None:
    """Exit as the script would (its threads joined, atexit handlers run: MLflow ends its run, buffers
    flushed) but skip tearing down the interpreter: with torch and Lightning loaded that alone takes 2-3 s."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def serve(command: list[str], preload: tuple[str, ...] = PRELOAD) -> int:
    """Run `command` with SOCKET_ENV set, preload meanwhile, then fork a child per request until the command
    ends; its exit status. The command starts first: DVC reads the pipeline and hashes its dependencies while
    this process imports, and a stage that asks before the imports are done waits in the socket's queue."""
    folder = tempfile.mkdtemp(prefix="transformer-lab-warm-")
    path = os.path.join(folder, "socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    running: dict[int, socket.socket] = {}  # child pid -> the entry point waiting for it
    server = os.getpid()  # an exception in a child before _leave must not remove the socket
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the command and the stages themselves
    try:
        command_process = subprocess.Popen(command, env={**os.environ, SOCKET_ENV: path},
                                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        _preload(preload, command_process)
        gc.freeze()  # the preloaded objects stay shared with every child instead of being copied by its collector
        while command_process.poll() is None or running:
            readable, _, _ = select.select([listener, *running.values()], [], [], 0.1)
            for conn in readable:
                if conn is listener:
                    _start_child(listener, running)
                else:  # the entry point went away (killed): its stage must not run on unattended
                    pid = next(p for p, c in running.items() if c is conn)
                    if not conn.recv(1, socket.MSG_PEEK):
                        os.kill(pid, signal.SIGTERM)
            for pid, conn in list(running.items()):
                finished, status = os.waitpid(pid, os.WNOHANG)
                if finished:
                    try:
                        conn.sendall(struct.pack("!i", _exit_code(status)))
                    except OSError:
                        pass
                    conn.close()
                    del running[pid]
        return command_process.returncode
    finally:
        if os.getpid() == server:
            listener.close()
            os.unlink(path)
            os.rmdir(folder)


def _start_child(listener: socket.socket, running: dict[int, socket.socket]) -> None:
    conn, _ = listener.accept()
    header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
    request = json.loads(_read_exactly(conn, _HEADER.unpack(header)[0]))
    pid = os.fork()
    if pid == 0:
        listener.close()
        for other in running.values():
            other.close()
        conn.close()
        _leave(_run_script(request, fds))
    for fd in fds:
        os.close(fd)
    conn.sendall(str(pid).rjust(8).encode())
    running[pid] = conn


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m transformer_lab.runtime.warm_start",
        description="Run COMMAND (e.g. `dvc repro`) with the project's pipeline stages started in a warm "
                    "interpreter: Lightning, torch and MLflow are imported once, not once per stage.")
    parser.add_argument("--preload", default=",".join(PRELOAD), metavar="MODULES",
                        help="comma-separated modules to import ahead (default: %(default)s)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments")
    args = parser.parse_args()
    if not args.command:
        parser.error("give the command to run, e.g. `dvc repro`")
    sys.exit(serve(args.command, tuple(filter(None, args.preload.split(",")))))


if __name__ == "__main__":
    main()
