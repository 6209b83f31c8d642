"""`python -m transformer_lab.runtime.warm_start COMMAND` (what `make run` wraps `dvc repro` in): an entry point
started by COMMAND runs in a child of the warm interpreter, exactly as it would have run on its own."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import ROOT

# An entry point as pipelines/ writes them: `_project.bootstrap()` first, which hands over when it can.
SCRIPT = textwrap.dedent("""
    import _project
    _project.bootstrap()
    import json, os, sys, time
    report = {"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv, "cwd": os.getcwd(),
              "marker": os.environ.get("MARKER"),
              "parent": open(f"/proc/{os.getppid()}/cmdline").read().replace("\\0", " "),
              "handed_over_env": os.environ.get("TRANSFORMER_LAB_WARM_SOCKET"),
              "preloaded": sorted(name for name in sys.modules if name.startswith("slow_"))}
    print("to stdout"); print("to stderr", file=sys.stderr)
    (__import__("pathlib").Path(os.environ["REPORT"])).write_text(json.dumps(report))
    if sys.argv[1:2] == ["sleep"]:
        time.sleep(60)
    if sys.argv[1:2] == ["raise"]:
        raise ValueError("a bug in the stage")
    sys.exit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else 0)
""")


def entry_point(tmp_path: Path) -> Path:
    folder = tmp_path / "pipelines"
    folder.mkdir()
    (folder / "_project.py").write_text((ROOT / "pipelines" / "_project.py").read_text())
    script = folder / "stage.py"
    script.write_text(SCRIPT)
    return script


def warm(command: str, tmp_path: Path, preload: str = "json", **env) -> subprocess.CompletedProcess:
    """`command` (a shell line) run under the wrapper, with nothing heavy preloaded: the handing over is what is tested."""
    wrapper = [sys.executable, "-m", "transformer_lab.runtime.warm_start", "--preload", preload, "bash", "-c", command]
    return subprocess.run(wrapper, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "REPORT": str(tmp_path / "report.json"), **env})


def test_a_stage_runs_in_a_child_of_the_wrapper_with_its_own_arguments_directory_environment_and_streams(tmp_path):
    script = entry_point(tmp_path)
    (tmp_path / "work").mkdir()
    result = warm(f"cd work && MARKER=mine {sys.executable} {script} a b=c; echo exit=$?", tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["argv"] == [str(script), "a", "b=c"] and report["cwd"] == str(tmp_path / "work")
    assert report["marker"] == "mine"
    assert report["handed_over_env"] is None  # what the stage starts (DDP ranks) starts cold
    assert "-m transformer_lab.runtime.warm_start" in report["parent"]  # forked by the wrapper, not started by bash
    assert result.stdout.splitlines() == ["to stdout", "exit=0"] and "to stderr" in result.stderr


def test_exit_codes_and_errors_come_back_to_the_caller_and_the_wrappers_own_code_is_the_commands(tmp_path):
    script = entry_point(tmp_path)
    result = warm(f"{sys.executable} {script} 3; echo exit=$?; {sys.executable} {script} raise; echo exit=$?; exit 5",
                  tmp_path)
    assert result.returncode == 5
    assert "exit=3" in result.stdout and "exit=1" in result.stdout
    assert "ValueError: a bug in the stage" in result.stderr


def test_a_signal_to_the_caller_reaches_the_stage(tmp_path):
    script = entry_point(tmp_path)
    result = warm(f"{sys.executable} {script} sleep & caller=$!; "
                  "while [ ! -s $REPORT ]; do sleep 0.1; done; kill -TERM $caller; wait $caller; echo exit=$?", tmp_path)
    assert "exit=143" in result.stdout, result.stdout + result.stderr  # 128 + SIGTERM, as a stage killed cold exits
    stage = json.loads((tmp_path / "report.json").read_text())["pid"]
    time.sleep(0.2)
    assert not Path(f"/proc/{stage}").exists()


def test_without_the_wrapper_an_entry_point_runs_as_it_always_has(tmp_path):
    script = entry_point(tmp_path)
    env = {**os.environ, "REPORT": str(tmp_path / "report.json")}
    env.pop("TRANSFORMER_LAB_WARM_SOCKET", None)
    result = subprocess.run([sys.executable, str(script), "4"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 4
    assert json.loads((tmp_path / "report.json").read_text())["ppid"] == os.getpid()  # this test started it
    # a socket variable left over from a wrapper that has gone: still runs, cold
    env["TRANSFORMER_LAB_WARM_SOCKET"] = str(tmp_path / "gone.sock")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0 and json.loads((tmp_path / "report.json").read_text())["ppid"] == os.getpid()


def slow_module(tmp_path: Path, name: str, seconds: float) -> None:
    """A module whose import leaves NAME.started behind, takes `seconds`, then leaves NAME.imported."""
    (tmp_path / f"{name}.py").write_text(f"import time, pathlib\n"
                                         f"pathlib.Path(__file__).with_suffix('.started').touch()\n"
                                         f"time.sleep({seconds})\n"
                                         f"pathlib.Path(__file__).with_suffix('.imported').touch()\n")


def test_the_command_starts_while_the_wrapper_imports_and_stages_wait_for_the_imports(tmp_path):
    """DVC reads the pipeline while the libraries load; a stage it starts meanwhile still runs warm."""
    script = entry_point(tmp_path)
    slow_module(tmp_path, "slow_library", 2.0)
    result = warm(f"test ! -e slow_library.imported && echo started-first; {sys.executable} {script}", tmp_path,
                  preload="slow_library", PYTHONPATH=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "started-first" in result.stdout  # the command ran before the import had finished
    assert json.loads((tmp_path / "report.json").read_text())["preloaded"] == ["slow_library"]


def test_a_command_that_ends_during_the_imports_is_not_kept_waiting_for_the_rest(tmp_path):
    """A second `dvc repro` with nothing to do ends at once; the wrapper stops importing then."""
    slow_module(tmp_path, "slow_first", 1.0)
    slow_module(tmp_path, "slow_second", 0.0)
    # the command ends while the first module is importing (not before: then nothing would be imported)
    ends_during_first = "until [ -e slow_first.started ]; do sleep 0.05; done; exit 0"
    result = warm(ends_during_first, tmp_path, preload="slow_first,slow_second", PYTHONPATH=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "slow_first.imported").exists() and not (tmp_path / "slow_second.started").exists()
