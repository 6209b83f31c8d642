"""The model registry: each task's logged model registered, the best version under the alias
`champion`, which moves only to a better score on the same data."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

import mlflow
from mlflow.exceptions import MlflowException

CHAMPION = "champion"
DATA_FINGERPRINT = "data_fingerprint"  # a version's tag: the data its run was scored on, as the run's tag (runs.data_record)


@dataclass(frozen=True)
class Registration:
    version: int
    champion: bool  # whether this version took the alias
    reason: str  # why it did or did not, for the person who ran it


def register(model_uri: str, name: str, run_id: str, metric: str, mode: str, data_fingerprint: str | None,
             force: bool = False) -> Registration:
    """A new version of registered model `name` from `model_uri`, tagged with the data its run was
    scored on. It becomes `champion` when there is none, when its run's `metric` beats the champion's
    (mode: max or min) on the same data, or with force; a champion scored on other data (or on data
    not recorded) is never replaced by a score, which would compare two different tests."""
    client = mlflow.MlflowClient()
    tags = {DATA_FINGERPRINT: data_fingerprint} if data_fingerprint else None
    with contextlib.redirect_stderr(io.StringIO()):  # its "Successfully registered ..." lines: the caller says it once
        version = int(mlflow.register_model(model_uri, name, tags=tags).version)
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        champion = None
    take, reason = champion_decision(client, champion, run_id, metric, mode, data_fingerprint, force)
    if take:
        client.set_registered_model_alias(name, CHAMPION, version)
    return Registration(version, take, reason)


def champion_decision(client, champion, run_id: str, metric: str, mode: str, data_fingerprint: str | None,
                      force: bool) -> tuple[bool, str]:
    """(whether the new version takes the alias from `champion` (a model version or None), why)."""
    if force:
        return True, "asked for (tracking.champion=force)" + (f"; version {champion.version} had it" if champion else "")
    if champion is None:
        return True, "no champion before"
    held_by = f"champion version {champion.version}"
    champion_data = champion.tags.get(DATA_FINGERPRINT)
    if data_fingerprint is None or champion_data != data_fingerprint:
        return False, (f"{held_by} was scored on other data ({champion_data or 'not recorded'}; this run: "
                       f"{data_fingerprint or 'not recorded'}), so the scores do not compare; "
                       "tracking.champion=force gives this run the alias")
    new = client.get_run(run_id).data.metrics.get(metric)
    old = client.get_run(champion.run_id).data.metrics.get(metric)
    if new is None:
        return False, f"this run has no {metric}"
    if old is None:
        return True, f"{held_by} has no {metric}"
    if new > old if mode == "max" else new < old:
        return True, f"{metric} {new:.4g} beats {held_by}'s {old:.4g} on the same data"
    return False, f"{metric} {new:.4g} does not beat {held_by}'s {old:.4g} on the same data"
