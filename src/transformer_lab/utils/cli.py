"""What every Hydra entry point in pipelines/ shares."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import yaml

from transformer_lab.errors import TransformerLabError
from transformer_lab.tracking import register_resolvers

register_resolvers()  # before Hydra composes any config that uses them


def pipeline(fn):
    """A TransformerLabError (bad input, missing file) becomes one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            cause = _user_error(err)
            if cause is None:
                raise
            print(f"error: {cause}", file=sys.stderr, flush=True)
            sys.exit(2)

    return wrapper


def _user_error(err: BaseException | None) -> TransformerLabError | None:
    """The TransformerLabError behind `err`, also when Hydra's instantiate wrapped it."""
    while err is not None:
        if isinstance(err, TransformerLabError):
            return err
        err = err.__cause__
    return None


JOB_DIR_ENV = "TRANSFORMER_LAB_JOB_DIR"  # set by train() for the processes Lightning starts


def rejoin_ddp_job() -> None:
    """Lightning starts each extra DDP process by re-running the command line (plus a
    `hydra.run.dir` that, in a multirun, is not the job's folder). After `-m` every extra process
    would run a whole sweep of its own: a second MLflow parent run, jobs paired up only by luck,
    an Optuna study of its own. Such a process runs exactly its job instead: the overrides Hydra
    recorded in the job's folder, which train() passes on in the environment. Call before the
    @hydra.main function."""
    arguments = sys.argv[1:]
    job_dir = os.environ.get(JOB_DIR_ENV)
    if "LOCAL_RANK" not in os.environ or not job_dir or not {"-m", "--multirun"} & set(arguments):
        return
    overrides = Path(job_dir, ".hydra", "overrides.yaml")
    if not overrides.is_file():
        return
    launcher_settings = [a for a in arguments if a.startswith(("hydra.job.name=", "hydra.output_subdir="))]
    sys.argv = [sys.argv[0], *yaml.safe_load(overrides.read_text()), f"hydra.run.dir={job_dir}", *launcher_settings]
