"""What every Hydra entry point in pipelines/ shares."""

from __future__ import annotations

import functools
import sys

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
