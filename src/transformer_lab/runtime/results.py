"""The pipeline's metrics at a glance: a table per model family, each as wide as a screen (`make results`).

`dvc metrics show` prints every metrics file in one table whose header holds every metric name of every
family (about 100 columns). This reads the same files, the `metrics:` that dvc.yaml's stages declare,
through DVC (another revision's from the cache, as `dvc metrics diff` reads them), and prints a table per
family of families.py, in pipeline order: a row per stage, a comparison file (an object per model) a row
per model, and only the columns its rows have: the metrics a family is selected on first (families.py),
their test/ twins next, the rest after. A table wider than --width is cut into column groups (val/,
test/, the rest, as many to a group as fit), each repeating the row names and showing only the rows that
have a value in it. Numbers to 4 significant digits.

    python -m transformer_lab.runtime.results                # `make results`
    python -m transformer_lab.runtime.results --rev HEAD~1   # `make results REV=HEAD~1`: each change old→new

Nothing imports this module: changing it reruns no stage.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from transformer_lab.errors import TransformerLabError
from transformer_lab.families import FAMILIES, Family

OTHER = "other"  # the table of metrics no family's stage writes
ARROW = "→"
GAP = "  "


@dataclass
class Row:
    label: str               # the stage (`train_tabular@ft_transformer`), `stage: model` in a comparison
    new: dict[str, object]   # metric -> value, in the workspace
    old: dict[str, object] | None = None  # at --rev; None: no --rev


STUDIES = "studies" + os.sep  # studies/dvc.yaml's summaries: tables of their own (studies/README.md, make report)


def family_of(stage: str) -> str:
    """The family whose stages list `stage` (a `foreach`/`matrix` stage by its name before the @)."""
    name = stage.split("@", 1)[0]
    return next((family.name for family in FAMILIES.values() if name in family.stages), OTHER)


def flatten(metrics: dict, prefix: str = "") -> dict[str, object]:
    """Nested objects as dotted names, as `dvc metrics show` names them; lists are left out."""
    flat = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        elif not isinstance(value, list):
            flat[f"{prefix}{key}"] = value
    return flat


def rows_of(label: str, metrics: dict) -> dict[str, dict[str, object]]:
    """A metrics file's rows: a comparison file (every value an object, one per model) a row per key."""
    if metrics and all(isinstance(value, dict) for value in metrics.values()):
        return {f"{label}: {key}": flatten(value) for key, value in metrics.items()}
    return {label: flatten(metrics)} if metrics else {}


def read(repo_dir: str | None, rev: str | None) -> tuple[dict[str, str], dict[str, dict], dict[str, dict] | None]:
    """(metrics file -> its stage, in dvc.yaml's order; the workspace's metrics by file; those at `rev`).
    A file that cannot be read (not written yet, not in the cache) is left out."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo
    from scmrepo.exceptions import SCMError

    try:
        with Repo(repo_dir) as repo:
            stage_of = {os.path.relpath(out.fs_path, repo.root_dir): stage.name
                        for stage in repo.index.stages for out in stage.outs if out.metric}
            stage_of = {path: stage for path, stage in stage_of.items() if not path.startswith(STUDIES)}
            shown = repo.metrics.show(revs=[rev] if rev else None, hide_workspace=False)
    except (DvcException, SCMError) as err:
        raise TransformerLabError(" ".join(str(err).split())) from None

    def files(revision: str) -> dict[str, dict]:
        result = shown.get(revision, {})
        if "error" in result:
            raise TransformerLabError(f"{revision or 'workspace'}: {' '.join(str(result['error']).split())}")
        return {path: file["data"] for path, file in result.get("data", {}).items()
                if "data" in file and not path.startswith(STUDIES)}

    # DVC names the workspace "" when it reads no other revision, else "workspace" beside the revision's names
    if not rev:
        return stage_of, files(""), None
    names = [name for name in shown if name != "workspace"]
    if not names:
        raise TransformerLabError(f"--rev {rev}: no such revision (a commit, branch, tag or `dvc exp show`'s name)")
    return stage_of, files("workspace"), files(names[0])


def group(stage_of: dict[str, str], new: dict[str, dict], old: dict[str, dict] | None) -> dict[str, list[Row]]:
    """The rows of each family, families and rows in dvc.yaml's order (files no stage declares last)."""
    tables: dict[str, list[Row]] = {}
    for path in [*stage_of, *sorted((set(new) | set(old or {})) - set(stage_of))]:
        label = stage_of.get(path, path)
        family = family_of(label) if path in stage_of else OTHER
        new_rows = rows_of(label, new.get(path, {}))
        old_rows = rows_of(label, old.get(path, {})) if old is not None else {}
        for row in dict.fromkeys([*new_rows, *old_rows]):
            tables.setdefault(family, []).append(
                Row(row, new_rows.get(row, {}), None if old is None else old_rows.get(row, {})))
    return tables


def sections(rows: list[Row], family: Family | None) -> list[list[str]]:
    """The table's columns in sections: a section per prefix (`val/`, `test/`, ...), the prefix of the
    family's selection metrics first and in each section those metrics' names first; then the names
    without a prefix; counts (every value an integer: epochs, steps, params, test/n_images) last."""
    values: dict[str, list] = {}
    for row in rows:
        for name, value in [*row.new.items(), *(row.old or {}).items()]:
            values.setdefault(name, []).append(value)
    selected = [metric.name.rpartition("/") for metric in family.metrics] if family else []
    first_prefixes = list(dict.fromkeys(prefix for prefix, _, _ in selected))
    first_names = list(dict.fromkeys(name for _, _, name in selected))

    def section(name: str) -> tuple:
        prefix = name.rpartition("/")[0]
        if all(isinstance(value, int) and not isinstance(value, bool) for value in values[name]):
            return (3,)
        if prefix in first_prefixes:
            return (0, first_prefixes.index(prefix))
        return (1, prefix) if prefix else (2,)

    def order(name: str) -> tuple:
        rest = name.rpartition("/")[2]
        return (section(name), first_names.index(rest) if rest in first_names else len(first_names), name)

    grouped: dict[tuple, list[str]] = {}
    for name in sorted(values, key=order):
        grouped.setdefault(section(name), []).append(name)
    return list(grouped.values())


def number(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def cell(row: Row, name: str) -> str | None:
    """The value shown, old→new where it changed (to 4 significant digits); None: neither has one."""
    new = row.new.get(name)
    if row.old is None:
        return None if new is None else number(new)
    old = row.old.get(name)
    if old is None and new is None:
        return None
    return number(new) if number(old) == number(new) else f"{number(old)}{ARROW}{number(new)}"


def pack(groups: list[list[str]], widths: dict[str, int], room: int) -> list[list[str]]:
    """Columns cut into runs that fit `room` characters: whole sections where they fit, else column by column."""
    def width(columns: list[str]) -> int:
        return sum(len(GAP) + widths[name] for name in columns)

    runs, current = [], []
    for columns in groups:
        if width(current + columns) <= room:
            current += columns
            continue
        if current:
            runs.append(current)
            current = []
        for name in columns:
            if current and width(current + [name]) > room:
                runs.append(current)
                current = []
            current.append(name)
    return runs + [current] if current else runs


def title(name: str, family: Family | None) -> str:
    if family is None:
        return f"{name}  (metrics of stages no family in families.py lists)"
    better = {mode: ", ".join(m.name.rpartition("/")[2] for m in family.metrics if m.mode == mode)
              for mode in ("max", "min")}
    marks = "  ".join(f"{arrow} {better[mode]}" for arrow, mode in (("↑", "max"), ("↓", "min")) if better[mode])
    return f"{name}  ({marks})"


def table(name: str, rows: list[Row], width: int) -> list[str]:
    family = FAMILIES.get(name)
    groups = sections(rows, family)
    cells = {(row.label, column): cell(row, column) for row in rows for columns in groups for column in columns}
    widths = {column: max([len(column)] + [len(cells[row.label, column] or "") for row in rows])
              for columns in groups for column in columns}
    label_width = max(len("stage"), *(len(row.label) for row in rows))
    lines = [title(name, family)]
    for run in pack(groups, widths, width - label_width):
        lines.append("stage".ljust(label_width) + "".join(GAP + column.rjust(widths[column]) for column in run))
        for row in rows:
            values = [cells[row.label, column] for column in run]
            if any(value is not None for value in values):
                lines.append(row.label.ljust(label_width) + "".join(
                    GAP + (value or "-").rjust(widths[column]) for value, column in zip(values, run)))
    return lines


def report(stage_of: dict[str, str], new: dict[str, dict], old: dict[str, dict] | None = None,
           rev: str | None = None, width: int = 120) -> str:
    grouped = group(stage_of, new, old)
    blocks = ["\n".join(table(name, rows, width)) for name, rows in grouped.items()]
    missing = [stage for path, stage in stage_of.items() if path not in new]
    if missing:
        blocks.append(f"no metrics in the workspace yet: {', '.join(missing)} (`make run`, or `dvc pull`)")
    if old is not None:
        changed = sum(ARROW in (cell(row, name) or "")
                      for rows in grouped.values() for row in rows for name in {*row.new, *row.old})
        blocks.append(f"{changed} value(s) differ from {rev} at 4 significant digits (old{ARROW}new)")
        absent = [stage for path, stage in stage_of.items() if path not in old]
        if absent:
            blocks.append(f"no metrics at {rev} (not run there, or not in this cache: `dvc fetch --all-commits` "
                          f"gets them): {', '.join(absent)}")
    return "\n\n".join(blocks) if blocks else "no metrics: dvc.yaml's stages declare none"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_lab.runtime.results", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The metrics files dvc.yaml's stages declare, as a table per model family (families.py):\n"
                    "a row per stage (a comparison file: a row per model), the family's own metric names as\n"
                    "columns, numbers to 4 significant digits; tables wider than --width cut into column groups.",
        epilog="examples:\n"
               "  make results                          # the workspace\n"
               "  make results REV=HEAD~1               # what changed since the commit before: old→new\n"
               "  python -m transformer_lab.runtime.results --rev exp-a1b2c --width 200\n"
               "The full precision and every file at once: dvc metrics show / dvc metrics diff REV.")
    parser.add_argument("--rev", help="also read the metrics at this git revision (commit, branch, tag, or an "
                                      "experiment's name from `dvc exp show`) and show each change as old→new")
    parser.add_argument("--width", type=int, default=120,
                        help="the most characters a line takes; wider tables are cut into column groups (120)")
    parser.add_argument("--repo", help="the DVC project (default: the one the current directory is in)")
    args = parser.parse_args(argv)
    try:
        stage_of, new, old = read(args.repo, args.rev)
    except TransformerLabError as err:
        print(f"results: {err}", file=sys.stderr)
        return 2
    print(report(stage_of, new, old, args.rev, args.width))
    return 0


if __name__ == "__main__":
    sys.exit(main())
