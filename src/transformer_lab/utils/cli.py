"""What every Hydra entry point in pipelines/ shares."""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
import warnings
from pathlib import Path

import yaml
from hydra.errors import OverrideParseException
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from transformer_lab.errors import TransformerLabError
from transformer_lab.utils.resolvers import register_resolvers

register_resolvers()  # before Hydra composes any config that uses them


class _DropMessages(logging.Filter):
    def __init__(self, *fragments: str):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(fragment in record.getMessage() for fragment in self.fragments)


def quiet_console() -> None:
    """Keep the console for what a user needs: no adverts, no notices about choices made on purpose."""
    lightning_notices = _DropMessages("💡 Tip", "to estimate number of stepping batches")
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(lightning_notices)
    # MLflow's bars while it logs and checks a run's model (a few small files): the run's own summary says it
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for name in ("mlflow.store.db.utils", "alembic"):  # "Creating initial MLflow database tables..."
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")  # inside Lightning


quiet_console()


def lightning_logs_through_hydra() -> None:
    """Lightning's messages once, through Hydra's handlers (the console and the job's log file).

    Lightning sets up its loggers when first imported: before Hydra configured logging, its own
    handlers; after, its records reach Hydra's and, through `lightning`'s console handler, the
    console a second time. The entry points import it after Hydra (so that `--help` and a rejected
    config answer before torch loads) and call this right after: keep the records, drop Lightning's
    own handlers."""
    import lightning  # noqa: F401  (its import adds the handlers)

    root_handlers = logging.getLogger().handlers
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        if root_handlers:
            for handler in [h for h in logger.handlers if h not in root_handlers]:
                logger.removeHandler(handler)
            logger.propagate = True


def entry_point(fn):
    """A TransformerLabError (bad input, missing file) becomes one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return _run_task(fn, args, kwargs)

    return wrapper


def _run_task(fn, args, kwargs):
    try:
        return fn(*args, **kwargs)
    except MissingMandatoryValue as err:
        _refuse(f"{err.full_key} is required: pass {err.full_key}=VALUE", err)
    except Exception as err:
        cause = user_error(err)
        if cause is None:
            raise
        _refuse(str(cause), err)


def _refuse(line: str, err: Exception) -> None:
    """The one line on stderr; then exit 2, or, in a job of a multirun, the error handed back to Hydra:
    an exit would end the whole sweep, where the sweep record (hydra_callbacks.SweepRecord) counts the
    job as failed and the other jobs still run."""
    print(f"error: {line}", file=sys.stderr, flush=True)
    if _in_multirun():
        raise TransformerLabError(line) from err
    sys.exit(2)


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def rename_overrides(argv: list[str], names: dict[str, str]) -> list[str]:
    """argv with `name=value` overrides renamed to `names[name]=value`.

    For keys that share a name with a config group of conf/ (model/, task/): Hydra reads `model=X`
    as the choice of conf/model/X.yaml and refuses a plain key of that name."""
    renamed = []
    for arg in argv:
        key, equals, value = arg.partition("=")
        renamed.append(f"{names[key]}={value}" if equals and key in names else arg)
    return renamed


def run(main) -> None:
    """Run an entry point's `main`: a config Hydra cannot compose (an unknown key or option, an
    override it cannot parse) is one line and exit code 2, like every other mistake on the command
    line; a crash keeps its traceback and exit code 1. Under `dvc repro` (which deletes a stage's
    outputs before its command runs), a stage that fails for any reason gets the outputs of its
    last successful run back from the DVC cache."""
    # Hydra prints what it cannot compose over several lines and exits 1; told to raise it instead, it
    # leaves the report to us. Whoever set HYDRA_FULL_ERROR asked for Hydra's whole tracebacks.
    hydra_tracebacks = bool(os.environ.get("HYDRA_FULL_ERROR"))
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        try:
            main()
        except Exception as err:
            line = _refusal_line(err, composition_errors=not hydra_tracebacks)
            if line is None:
                raise
            print(f"error: {line}", file=sys.stderr, flush=True)
            sys.exit(2)
    except BaseException as err:
        stage = os.environ.get("DVC_STAGE")
        if stage and not (isinstance(err, SystemExit) and not err.code):
            from transformer_lab.utils.dvc_outputs import restore_stage_outputs

            if restore_stage_outputs(stage, Path.cwd(), os.environ.get("DVC_ROOT")):
                print(f"{stage}: failed; its previous outputs are back in place (from the DVC cache)",
                      file=sys.stderr)
        raise


def _refusal_line(err: Exception, composition_errors: bool = True) -> str | None:
    """One line for a mistake in the command line or the config; None for a crash."""
    cause = user_error(err)
    if cause is not None:
        return str(cause)
    if not composition_errors or _raised_in_task(err) or not _raised_by(err, ("hydra.", "omegaconf.")):
        return None  # out of the project's code (a Hydra or OmegaConf error in a task is its code's): a crash
    if isinstance(err, OverrideParseException):
        detail = _one_line(err, skip=("Error parsing override",))
        return f"cannot parse the override {err.override!r}: {detail}"
    line = _one_line(err)
    if isinstance(err.__cause__, OmegaConfBaseException):  # what Hydra prints below its own message
        line = _joined([line, _one_line(err.__cause__)])
    return line


def _raised_in_task(err: BaseException) -> bool:
    """Whether `err` came out of an entry point's task function (the @entry_point one) rather than out of
    Hydra composing its config: a frame of _run_task is on its traceback."""
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is _run_task.__code__:
            return True
        tb = tb.tb_next
    return False


def _raised_by(err: BaseException, packages: tuple[str, ...]) -> bool:
    """Whether the innermost frame of `err`'s traceback runs code of one of `packages`."""
    tb = err.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_globals.get("__name__", "").startswith(packages)


def _one_line(err: BaseException, skip: tuple[str, ...] = ()) -> str:
    """Hydra's or OmegaConf's message on one line: its sentences, the indented list below a line that
    announces it ("Available options in 'model':") after that line; without the config search path,
    the link to Hydra's docs and the indented details (full_key, object_type)."""
    parts, listing = [], False
    for line in str(err).splitlines():
        if line.startswith(("Config search path", "See https://hydra.cc")):
            break
        if line[:1].isspace():
            if listing:
                parts[-1] += (" " if parts[-1].endswith(":") else ", ") + line.strip()
            continue
        listing = False
        if line.strip() and not line.startswith(skip):
            parts.append(line.strip())
            listing = line.endswith(":")
    return _joined(parts)


def _joined(sentences: list[str]) -> str:
    """Sentences on one line: after a full stop a space, else a semicolon (a line that ends with an
    override must not gain a full stop that would be copied with it)."""
    text = ""
    for sentence in sentences:
        text += sentence if not text else (" " if text.endswith((".", "!", "?")) else "; ") + sentence
    return text


def user_error(err: BaseException | None) -> TransformerLabError | None:
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


RESUME_RECORD_PREFIX = "resume-"


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def resume_run_arguments(arguments: list[str]) -> list[str]:
    """`hydra.run.dir=DIR ckpt_path=...` resumes the run in DIR with that run's own configuration:
    the overrides recorded when it started (DIR/.hydra/overrides.yaml) come first, the command
    line's apply on top (a group it chooses anew replaces the run's keys inside that group), and
    this attempt's record goes to DIR/.hydra/resume-<time>/, so the run's original record is never
    overwritten. Any other command line is returned as it is."""
    given = {_override_key(a): a for a in arguments if "=" in a and not a.startswith("-")}
    run_dir, checkpoint = given.get("hydra.run.dir"), given.get("ckpt_path")
    if not run_dir or not checkpoint or checkpoint.split("=", 1)[1] in ("", "null") or "LOCAL_RANK" in os.environ:
        return arguments  # an extra DDP process gets the command line its rank-0 process already rewrote
    record = Path(run_dir.split("=", 1)[1], ".hydra", "overrides.yaml")
    if not record.is_file() or {"-m", "--multirun"} & set(arguments):
        return arguments
    merged = {_override_key(o): o for o in yaml.safe_load(record.read_text()) or []}
    for argument in arguments:
        key = _override_key(argument) if "=" in argument else argument
        # a group chosen anew (logger=none, trainer=cpu) drops the run's settings inside the old choice
        merged = {k: o for k, o in merged.items() if not k.startswith(f"{key}.")}
        previous = merged.get(key)
        if previous and previous.startswith("+") and not argument.startswith(("+", "~")):
            argument = "+" + argument  # the key exists only because the run added it
        merged[key] = argument
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    return [*merged.values(), f"hydra.output_subdir=.hydra/{RESUME_RECORD_PREFIX}{stamp}"]
