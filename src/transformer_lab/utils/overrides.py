"""Command-line values that Hydra's override grammar would misread (pipelines/predict.py, generate.py)."""

from __future__ import annotations


def quote_free_text(argv: list[str], keys: tuple[str, ...]) -> list[str]:
    """argv with the values of `key=value` overrides for free text quoted for Hydra: its override
    grammar reads commas as lists and brackets as syntax (`text=a fine, funny film`,
    `text=the [MASK] sat`). A value already in quotes is left as it is."""
    quoted = []
    for arg in argv:
        key, equals, value = arg.partition("=")
        if equals and key in keys and not (len(value) > 1 and value[0] == value[-1] and value[0] in "'\""):
            escaped = value.replace("'", "\\'")  # Hydra: a backslash escapes a quote, else it is literal
            if escaped.endswith("\\"):
                escaped += "\\"  # else it would escape the closing quote
            arg = f"{key}='{escaped}'"
        quoted.append(arg)
    return quoted
