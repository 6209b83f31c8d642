"""Loading a data set from the Hugging Face Hub, with one clear line when that is not possible."""

from __future__ import annotations

from transformer_lab.errors import DataError


def load_hub_dataset(hub_id: str, config_name: str | None = None, local_hint: str = "data.local_dir=DIR"):
    import datasets

    try:
        return datasets.load_dataset(hub_id, config_name) if config_name else datasets.load_dataset(hub_id)
    except Exception as err:  # the hub client raises many types when offline
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        name = f"{hub_id!r} ({config_name})" if config_name else repr(hub_id)
        raise DataError(f"could not load {name} from the Hugging Face Hub ({reason}); "
                        f"offline? use data.source=builtin, or data.source=local {local_hint}") from None
