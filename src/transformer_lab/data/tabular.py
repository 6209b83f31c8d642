"""Tables: a schema per data set, preparation (parse, validate, split), and the encoding that
turns rows into model inputs with statistics fitted on the training rows only.

A schema (YAML, `conf/schemas/*.yaml`) names the columns:

    name: heart
    target: num
    positive_above: 0            # optional: a binary target, value > 0 is the positive class
    categorical: [sex, cp, fbs, restecg, exang, slope, ca, thal]
    continuous: [age, trestbps, chol, thalach, oldpeak]
    missing_values: ["?"]        # cells that mean "missing" (an empty cell always does)

data.schema=infer reads the column types off the CSV instead (`infer_schema`: numbers with more
than a few distinct values are continuous, everything else categorical, near-unique text columns
left out as identifiers), says which column it treated how, and writes the schema it used
beside the prepared table (schema.yaml) for the user to edit and pass back.

Preparation reads the table as text, so nothing is silently converted: a continuous cell that is
neither a finite number nor a missing marker (text reading as inf or nan, such as "inf", "1e400" or
"nan", is not one) is an error naming the file, line and column, as is a column name the header
repeats. In rows handed to a trained model a float NaN is pandas' missing cell, and a value that
standardises beyond 32-bit floats is refused, so nothing non-finite reaches a model. The split is
stratified and seeded (train / validation / test), with an optional stratified k-fold column for
cross-validation on small tables.

Encoding (`TabularEncoder`, fitted on the training rows):
  categorical  index per column: 0 = a value never seen in training (unknown), 1 = missing,
               2.. = the training values; so "missing" is a learned category of its own
  continuous   missing cells imputed with the training mean, standardised with the training
               mean and standard deviation; a 0/1 missing-indicator is appended for every
               continuous column that has missing cells in the training rows

The datamodule adds what the models size themselves by: quantile bin edges of every continuous
input over the training rows (the piecewise-linear numeric encoding) and, with batch_size="auto",
a batch size that grows with the number of training rows (`auto_batch_size`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import torch
import yaml
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from transformer_lab.data.checks import require_file, require_two_classes
from transformer_lab.data.preprocessing import check_state
from transformer_lab.errors import DataError
from transformer_lab.utils.io import atomic_directory, atomic_write_json

UNKNOWN, MISSING = 0, 1  # reserved categorical indices; training values start at 2
LINE, SPLIT, FOLD, LABEL = "_line", "_split", "_fold", "_label"  # bookkeeping columns of the prepared table


@dataclass
class TableSchema:
    name: str
    target: str
    categorical: list[str] = field(default_factory=list)
    continuous: list[str] = field(default_factory=list)
    missing_values: list[str] = field(default_factory=lambda: ["?", "NA"])
    positive_above: float | None = None  # a binary target: value > positive_above is class 1

    @classmethod
    def load(cls, path: str | Path) -> TableSchema:
        path = Path(path)
        raw = read_schema_fields(path, cls, "name, target, categorical, continuous")
        schema = cls(**raw)
        columns = [schema.target, *schema.categorical, *schema.continuous]
        repeated = sorted({c for c in columns if columns.count(c) > 1})
        if repeated:
            raise DataError(f"{path}: column {repeated[0]!r} is listed more than once")
        if not schema.categorical and not schema.continuous:
            raise DataError(f"{path}: no feature columns (categorical and continuous are both empty)")
        return schema

    @property
    def features(self) -> list[str]:
        return [*self.categorical, *self.continuous]


def read_schema_fields(path: Path, schema_class: type, described: str) -> dict:
    """A schema file's mapping, checked against the dataclass `schema_class`: valid YAML, known
    fields only, name and target given, the column lists lists; each problem one DataError."""
    require_file(path, "a schema file (YAML)", "schema file not found")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise DataError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise DataError(f"{path}: a schema is a mapping with {described}")
    known = set(schema_class.__dataclass_fields__)
    for key in raw:
        if key not in known:
            raise DataError(f"{path}: unknown schema field {key!r} (expected: {', '.join(sorted(known))})")
    for key in ("name", "target"):
        if not raw.get(key):
            raise DataError(f"{path}: schema field {key!r} is required")
    for key in ("categorical", "continuous", "missing_values"):
        if key in raw and not isinstance(raw[key], list):
            raise DataError(f"{path}: schema field {key!r} must be a list of column names")
    return raw


def read_table(source: str | Path, schema: TableSchema, frame: pd.DataFrame | None = None,
               labelled: bool = True, in_file: bool = True) -> pd.DataFrame:
    """The schema's columns of a CSV (or of `frame`, with `source` naming it in errors), parsed:
    categoricals as stripped strings (None = missing), continuous as floats (NaN = missing), the
    label under LABEL (labelled=False: rows to predict, no target column), and each row's line in
    the file under LINE. in_file=False: `frame` holds rows handed over in memory, named in errors
    as "row I" (from 0), not by a line of `source`."""
    if frame is None:
        frame = read_local_frame(source)
    repeated = frame.columns[frame.columns.duplicated()]
    if len(repeated):
        raise DataError(f"{source}: column {repeated[0]!r} appears more than once")
    absent = [c for c in [schema.target] * labelled + schema.features if c not in frame.columns]
    if absent:
        raise DataError(f"{source}: column {absent[0]!r} named in the schema is not in the file "
                        f"(columns: {', '.join(map(str, frame.columns))})")
    lines = np.arange(len(frame)) + 2  # line 1 is the header
    missing = set(schema.missing_values) | {""}

    def at(row: int) -> str:
        return f"{source}:{lines[row]}" if in_file else f"row {row}"

    def text(column: str) -> pd.Series:
        values = frame[column].astype(object).map(lambda v: "" if v is None or v != v else str(v).strip())
        return values.where(~values.isin(missing), None)

    columns = {LINE: lines}  # the frame is built once: a column at a time fragments a wide one
    for column in schema.categorical:
        columns[column] = text(column).to_numpy()
    for column in schema.continuous:
        cells = text(column)
        numbers, not_numbers = parse_numbers(cells)
        if not_numbers.any():
            row = int(np.flatnonzero(not_numbers)[0])
            raise DataError(f"{at(row)}: column {column!r}: {cells.iloc[row]!r} is not a number "
                            f"(nor a missing-value marker {sorted(missing - {''})})")
        non_finite = cells.notna().to_numpy() & ~np.isfinite(numbers)
        if non_finite.any():
            row = int(np.flatnonzero(non_finite)[0])
            raise DataError(f"{at(row)}: column {column!r}: {cells.iloc[row]!r} reads as {numbers[row]}, not a "
                            f"finite number (a missing cell is empty or one of {sorted(missing - {''})})")
        columns[column] = numbers
    out = pd.DataFrame(columns)
    if not labelled:
        return out
    target = text(schema.target)
    if target.isna().any():
        row = int(np.flatnonzero(target.isna().to_numpy())[0])
        raise DataError(f"{at(row)}: target column {schema.target!r} is missing")
    if schema.positive_above is not None:
        numbers = pd.to_numeric(target, errors="coerce")
        if numbers.isna().any():
            row = int(np.flatnonzero(numbers.isna().to_numpy())[0])
            raise DataError(f"{at(row)}: target column {schema.target!r}: {target.iloc[row]!r} is not "
                            f"a number (the schema binarises it with positive_above)")
        threshold = schema.positive_above
        target = numbers.map(lambda v: f"{schema.target} > {threshold:g}" if v > threshold
                             else f"{schema.target} <= {threshold:g}")
    out[LABEL] = target.to_numpy()
    return out


def parse_numbers(cells: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Text cells (None = missing) as float64 (missing: NaN), and which present cells are not
    numbers at all. Text that reads as nan ("nan", "NaN") is a number here, one that is not finite,
    as "inf" and "1e400" are, so that it is refused as such rather than taken for a word."""
    numbers = pd.to_numeric(cells, errors="coerce").astype(float).to_numpy()
    nan_text = cells.str.strip().str.lower().str.lstrip("+-").eq("nan").fillna(False).to_numpy(dtype=bool)
    return numbers, np.isnan(numbers) & cells.notna().to_numpy() & ~nan_text


def class_names(table: pd.DataFrame, schema: TableSchema) -> list[str]:
    """Class order: negative before positive for a binarised target, else sorted."""
    names = sorted(set(table[LABEL]))
    if schema.positive_above is not None:
        names.sort(key=lambda name: ">" in name)
    return names


def split_rows(labels: np.ndarray, validation_fraction: float, test_fraction: float, seed: int,
               folds: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Stratified, seeded split names (train/validation/test) and, with folds > 1, a stratified
    k-fold index over all rows (-1 without)."""
    from sklearn.model_selection import StratifiedKFold, train_test_split

    indices = np.arange(len(labels))
    rest, test = train_test_split(indices, test_size=test_fraction, stratify=labels, random_state=seed)
    share = validation_fraction / (1 - test_fraction)
    train, validation = train_test_split(rest, test_size=share, stratify=labels[rest], random_state=seed)
    split = np.empty(len(labels), dtype=object)
    split[train], split[validation], split[test] = "train", "validation", "test"
    fold = np.full(len(labels), -1)
    if folds > 1:
        for k, (_, held_out) in enumerate(StratifiedKFold(folds, shuffle=True, random_state=seed)
                                          .split(indices, labels)):
            fold[held_out] = k
    return split, fold


INFERRED = "infer"  # data.schema=infer: column types read off the CSV
MAX_CATEGORICAL_NUMBERS = 10  # a numeric column with at most this many distinct values is categorical


def infer_schema(frame: pd.DataFrame, source: str, target: str | None = None,
                 missing_values: tuple[str, ...] = ("?", "NA")) -> tuple[TableSchema, dict[str, str]]:
    """A schema read off a table of text cells, and for every column the reason for its type.
    target: the label column (None = the last column). A column whose non-missing cells are all
    numbers is continuous if it has more than MAX_CATEGORICAL_NUMBERS distinct values, else
    categorical (codes like 1/2/3); any other column is categorical, unless nearly every row has
    its own value (an identifier, left out)."""
    columns = [str(c) for c in frame.columns]
    target = columns[-1] if target is None else target
    if target not in columns:
        raise DataError(f"{source}: target column {target!r} (data.target) is not in the file "
                        f"(columns: {', '.join(columns)})")
    missing = set(missing_values) | {""}
    categorical, continuous, reasons = [], [], {target: "target"}
    for column in columns:
        if column == target:
            continue
        cells = frame[column].astype(str).str.strip()
        present = cells[~cells.isin(missing)]
        distinct = present.nunique()
        if len(present) == 0:
            reasons[column] = "left out: every cell is missing"
        elif not parse_numbers(present)[1].any():
            if distinct > MAX_CATEGORICAL_NUMBERS:
                continuous.append(column)
                reasons[column] = f"continuous: numbers, {distinct} distinct values"
            else:
                categorical.append(column)
                reasons[column] = f"categorical: numbers with only {distinct} distinct values (codes)"
        elif distinct > 0.5 * len(present) and distinct > 50:
            reasons[column] = f"left out: text with {distinct} distinct values in {len(present)} rows (an identifier?)"
        else:
            categorical.append(column)
            reasons[column] = f"categorical: text, {distinct} distinct values"
    if not categorical and not continuous:
        raise DataError(f"{source}: no usable feature columns besides the target {target!r}")
    name = Path(source).stem or "table"
    return TableSchema(name, target, categorical, continuous, list(missing_values)), reasons


def schema_yaml(schema: TableSchema, reasons: dict[str, str] | None = None) -> str:
    """A schema as the YAML file conf/schemas/ holds, each column's reason as a comment."""
    lines = [f"# inferred from the CSV (data.schema=infer); edit, then pass data.schema=THIS_FILE",
             f"name: {schema.name}", f"target: {schema.target}"]
    for key in ("categorical", "continuous"):
        lines.append(f"{key}:")
        for column in getattr(schema, key):
            why = f"  # {reasons[column]}" if reasons and column in reasons else ""
            lines.append(f"  - {yaml.safe_dump(column, default_style=None).splitlines()[0]}{why}")
        if not getattr(schema, key):
            lines[-1] += " []"
    left_out = [c for c, why in (reasons or {}).items() if why.startswith("left out")]
    for column in left_out:
        lines.append(f"# {column}: {reasons[column]}")
    lines.append(f"missing_values: {yaml.safe_dump(schema.missing_values, default_flow_style=True).strip()}")
    return "\n".join(lines) + "\n"


def read_local_frame(path: str | Path) -> pd.DataFrame:
    """A CSV as text cells (nothing converted), or one DataError naming the file; a column name
    the header repeats is one too (pandas would rename the second `name.1`)."""
    options = dict(dtype=str, keep_default_na=False, skipinitialspace=True)
    try:
        frame = pd.read_csv(path, **options)
        header = pd.read_csv(path, header=None, nrows=1, **options).iloc[0].tolist()
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}:1: the file is empty (expected a header line naming the columns)") from None
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: cannot read as CSV ({str(err).splitlines()[0]})") from None
    for position, name in enumerate(header):
        if name in header[:position]:
            raise DataError(f"{path}:1: column {name!r} appears twice in the header "
                            f"(columns {header.index(name) + 1} and {position + 1})")
    return frame


def load_source(source: str, schema_path: str, local_path: str | None = None, hub_id: str | None = None,
                hub_split: str = "train", target: str | None = None
                ) -> tuple[pd.DataFrame, TableSchema, str, dict[str, str] | None]:
    """The parsed table, its schema, a name for it in messages, and (data.schema=infer) why each
    column got its type."""
    if schema_path == INFERRED:
        if source != "local":
            raise DataError("data.schema=infer reads the types off a CSV: it needs data.source=local "
                            "data.local_path=FILE.csv")
        require_file(local_path or "", "a CSV file", setting="data.local_path")
        frame = read_local_frame(local_path)
        schema, reasons = infer_schema(frame, str(local_path), target)
        return read_table(local_path, schema, frame), schema, str(local_path), reasons
    table, schema, origin = load_with_schema(source, schema_path, local_path, hub_id, hub_split)
    return table, schema, origin, None


def load_with_schema(source: str, schema_path: str, local_path: str | None = None, hub_id: str | None = None,
                     hub_split: str = "train") -> tuple[pd.DataFrame, TableSchema, str]:
    schema = TableSchema.load(schema_path)
    if source == "builtin":  # the Palmer penguins CSV that the palmerpenguins package ships
        from importlib.resources import files

        path = files("palmerpenguins") / "data" / "penguins.csv"
        return read_table(str(path), schema), schema, "palmerpenguins"
    if source == "local":
        if not local_path:
            raise DataError("data.source=local needs data.local_path=FILE.csv (and data.schema=FILE.yaml)")
        require_file(local_path, "a CSV file", setting="data.local_path")
        return read_table(local_path, schema), schema, str(local_path)
    if source == "hub":
        from transformer_lab.data.hub import load_hub_dataset

        dataset = load_hub_dataset(hub_id, local_hint="data.local_path=FILE.csv data.schema=FILE.yaml")
        frame = dataset[hub_split].to_pandas().astype(str)
        return read_table(f"hf:{hub_id}", schema, frame), schema, f"hf:{hub_id}"
    raise DataError(f"data.source={source!r}; expected builtin, local or hub")


def prepare(source: str, output_dir: str, schema: str, local_path: str | None = None,
            hub_id: str | None = None, validation_fraction: float = 0.15, test_fraction: float = 0.15,
            seed: int = 0, folds: int = 0, target: str | None = None) -> dict:
    """Parse and validate the table, split it, fit the encoder on the training rows and write
    table.parquet, schema.json, encoder.json and summary.json into output_dir (atomically); with
    schema="infer" also the inferred schema as schema.yaml. target: the label column of an
    inferred schema (None = the last column)."""
    table, table_schema, origin, reasons = load_source(source, schema, local_path, hub_id, target=target)
    classes = class_names(table, table_schema)
    require_two_classes(origin, f"target column {table_schema.target!r}", classes)
    labels = table[LABEL].to_numpy()
    counts = pd.Series(labels).value_counts()
    if counts.min() < 2:
        raise DataError(f"{origin}: every class needs at least 2 rows for a stratified split "
                        f"(counts: {counts.to_dict()})")
    table[SPLIT], table[FOLD] = split_rows(labels, validation_fraction, test_fraction, seed, folds)
    encoder = TabularEncoder.fit(table[table[SPLIT] == "train"], table_schema, classes)
    encoder.features(table, origin)  # a value the training rows' statistics cannot encode names its line
    summary = {
        "source": origin, "rows": len(table), "classes": classes,
        "class_counts": {name: int(counts[name]) for name in classes},
        "splits": {name: int((table[SPLIT] == name).sum()) for name in ("train", "validation", "test")},
        "folds": folds if folds > 1 else 0,
        "missing_cells": {c: int(table[c].isna().sum()) for c in table_schema.features if table[c].isna().any()},
        "categorical": table_schema.categorical, "continuous": table_schema.continuous,
    }
    with atomic_directory(output_dir) as tmp:
        table.to_parquet(tmp / "table.parquet", index=False)
        atomic_write_json(tmp / "schema.json", asdict(table_schema))
        atomic_write_json(tmp / "encoder.json", encoder.to_dict())
        atomic_write_json(tmp / "summary.json", summary)
        if reasons is not None:
            (tmp / "schema.yaml").write_text(schema_yaml(table_schema, reasons))
    if reasons is not None:
        print(f"{origin}: column types inferred (data.schema=infer)")
        for column, why in reasons.items():
            print(f"  {column:24s} {why}")
        print(f"  the schema: {Path(output_dir) / 'schema.yaml'} (edit it and pass data.schema=FILE to change a type)")
    return summary


@dataclass
class EncodedRows:
    categorical: np.ndarray  # (rows, categorical columns) int64
    continuous: np.ndarray  # (rows, continuous columns + missing indicators) float32
    labels: np.ndarray  # (rows,) int64

    def head(self, n: int) -> EncodedRows:
        return EncodedRows(self.categorical[:n], self.continuous[:n], self.labels[:n])


@dataclass
class TabularEncoder:
    categorical: list[str]
    continuous: list[str]
    categories: dict[str, list[str]]  # the training values of each categorical column (index 2..)
    means: dict[str, float]
    stds: dict[str, float]
    indicators: list[str]  # continuous columns with a missing-indicator
    classes: list[str]

    @classmethod
    def fit(cls, rows: pd.DataFrame, schema: TableSchema, classes: list[str]) -> TabularEncoder:
        categories = {c: sorted(set(rows[c].dropna())) for c in schema.categorical}
        means, stds = {}, {}
        for c in schema.continuous:
            values = rows[c].dropna()
            with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported below, by its column
                means[c] = float(values.mean()) if len(values) else 0.0
                std = float(values.std(ddof=0)) if len(values) else 0.0
            if not (math.isfinite(means[c]) and math.isfinite(std)):
                raise DataError(f"column {c!r}: its training values are too large to standardise (mean "
                                f"{means[c]:g}, standard deviation {std:g}); rescale the column")
            stds[c] = std if std > 0 else 1.0
        indicators = [c for c in schema.continuous if rows[c].isna().any()]
        return cls(schema.categorical, schema.continuous, categories, means, stds, indicators, classes)

    @property
    def cardinalities(self) -> list[int]:
        """Embedding rows per categorical column: unknown, missing, then the training values."""
        return [len(self.categories[c]) + 2 for c in self.categorical]

    @property
    def n_continuous(self) -> int:
        return len(self.continuous) + len(self.indicators)

    def transform(self, rows: pd.DataFrame) -> EncodedRows:
        codes, continuous = self.features(rows)
        lookup = {name: i for i, name in enumerate(self.classes)}
        labels = np.array([lookup[v] for v in rows[LABEL]], dtype=np.int64)
        return EncodedRows(codes, continuous, labels)

    def features(self, rows: pd.DataFrame, source: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The categorical indices and continuous inputs of parsed rows (read_table's columns). A
        value that standardises beyond float32 (inf at the model) is one DataError naming the row:
        source:line with `source` (the file the rows' LINE points into), else row I (from 0)."""
        codes = np.zeros((len(rows), len(self.categorical)), dtype=np.int64)
        for j, c in enumerate(self.categorical):
            index = {value: i + 2 for i, value in enumerate(self.categories[c])}
            codes[:, j] = [MISSING if pd.isna(v) else index.get(v, UNKNOWN) for v in rows[c]]
        columns = [((rows[c].fillna(self.means[c]) - self.means[c]) / self.stds[c]).to_numpy()
                   for c in self.continuous]
        columns += [rows[c].isna().to_numpy(dtype=float) for c in self.indicators]
        continuous = np.stack(columns, axis=1) if columns else np.zeros((len(rows), 0))
        with np.errstate(over="ignore"):  # an overflow is reported below, by its row and column
            continuous = continuous.astype(np.float32)
        if not np.isfinite(continuous).all():
            row, j = (int(i[0]) for i in np.nonzero(~np.isfinite(continuous)))
            c = self.continuous[j]
            where = f"{source}:{rows[LINE].iloc[row]}" if source else f"row {row}"
            raise DataError(f"{where}: column {c!r}: {rows[c].iloc[row]:g} is out of range: standardised by the "
                            f"training rows (mean {self.means[c]:.4g}, standard deviation {self.stds[c]:.4g}) "
                            "it exceeds the model's 32-bit floats")
        return codes, continuous

    def one_hot(self, encoded: EncodedRows) -> np.ndarray:
        """One-hot categoricals beside the continuous inputs: the flat features of the scikit-learn
        and XGBoost baselines."""
        blocks = [np.eye(n, dtype=np.float32)[encoded.categorical[:, j]] for j, n in enumerate(self.cardinalities)]
        return np.concatenate([*blocks, encoded.continuous], axis=1)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TabularEncoder:
        return cls(**data)


@dataclass(eq=False)
class TabularPreprocessor:
    """Raw table rows (dicts or a DataFrame, cells as in the CSV) -> model inputs: parsed by the
    schema (missing markers, numbers checked), encoded by the encoder fitted on the training rows.

    State: {"schema": the TableSchema's fields, "encoder": the TabularEncoder's fields}."""

    schema: TableSchema
    encoder: TabularEncoder

    def to_state(self) -> dict:
        return {"schema": asdict(self.schema), "encoder": self.encoder.to_dict()}

    @classmethod
    def from_state(cls, state: dict) -> TabularPreprocessor:
        check_state(state, ["schema", "encoder"], cls.__name__)
        return cls(TableSchema(**state["schema"]), TabularEncoder.from_dict(state["encoder"]))

    @property
    def labels(self) -> list[str]:
        return self.encoder.classes

    def encode(self, rows: pd.DataFrame | list[dict]) -> EncodedRows:
        """Raw rows parsed and encoded (labels 0: rows to predict); a row lacking a feature column,
        or a continuous cell that is not a finite number, is one error naming the row (row I, from 0)."""
        frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
        categorical, continuous = self.encoder.features(read_table("rows", self.schema, frame, labelled=False,
                                                                   in_file=False))
        return EncodedRows(categorical, continuous, np.zeros(len(frame), dtype=np.int64))

    def batch(self, rows: pd.DataFrame | list[dict]) -> dict[str, torch.Tensor]:
        """Model inputs (categorical, continuous) of raw rows (see encode)."""
        encoded = self.encode(rows)
        return {"categorical": torch.from_numpy(encoded.categorical), "continuous": torch.from_numpy(encoded.continuous)}


def read_schema(prepared_dir: str | Path) -> TableSchema:
    return TableSchema(**json.loads((Path(prepared_dir) / "schema.json").read_text()))


def read_prepared(prepared_dir: str | Path) -> tuple[pd.DataFrame, TableSchema, TabularEncoder]:
    """The prepared table, its schema, and the encoder fitted on its training split."""
    directory = Path(prepared_dir)
    if not (directory / "table.parquet").is_file():
        raise DataError(f"{directory}: no prepared table; run `dvc repro prepare_tabular` "
                        "or `python pipelines/prepare.py data=tabular`")
    table = pd.read_parquet(directory / "table.parquet")
    schema = read_schema(directory)
    table = missing_as_none(table, schema.categorical)
    encoder = TabularEncoder.from_dict(json.loads((directory / "encoder.json").read_text()))
    return table, schema, encoder


def missing_as_none(table: pd.DataFrame, categorical: list[str]) -> pd.DataFrame:
    """The categorical columns of a table read from parquet as objects with None for a missing
    cell (what read_table gives), replaced in one go: one at a time fragments a wide frame."""
    cells = table[categorical].astype(object)
    cells = cells.where(cells.notna(), None)
    return pd.concat([table.drop(columns=categorical), cells], axis=1)[table.columns]


def fold_rows(table: pd.DataFrame, fold: int | None) -> dict[str, pd.DataFrame]:
    """train/validation/test rows: the prepared split, or with `fold` = k cross-validation fold k
    held out as the test rows, the other folds' validation-split rows for early stopping and
    checkpoint selection, and the rest for training (so the held-out fold never picks a model)."""
    if fold is None:
        return {name: table[table[SPLIT] == name] for name in ("train", "validation", "test")}
    if table[FOLD].max() < 0:
        raise DataError("data.datamodule.fold is set but the table was prepared without folds (data.folds=5)")
    if not 0 <= fold <= table[FOLD].max():
        raise DataError(f"data.datamodule.fold={fold}; the table has folds 0..{table[FOLD].max()}")
    rest = table[table[FOLD] != fold]
    return {"train": rest[rest[SPLIT] != "validation"], "validation": rest[rest[SPLIT] == "validation"],
            "test": table[table[FOLD] == fold]}


def encoded_splits(prepared_dir: str | Path, fold: int | None = None) -> tuple[dict[str, EncodedRows], TabularEncoder]:
    """train/validation/test rows of the prepared table (`fold_rows`), encoded by the saved
    encoder, or for a cross-validation fold by one refitted on that fold's training rows."""
    table, schema, encoder = read_prepared(prepared_dir)
    rows = fold_rows(table, fold)
    if fold is not None:
        encoder = TabularEncoder.fit(rows["train"], schema, encoder.classes)
    return {name: encoder.transform(part) for name, part in rows.items()}, encoder


class TabularRows(Dataset):
    def __init__(self, encoded: EncodedRows):
        self.categorical = torch.from_numpy(encoded.categorical)
        self.continuous = torch.from_numpy(encoded.continuous)
        self.labels = torch.from_numpy(encoded.labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"categorical": self.categorical[i], "continuous": self.continuous[i], "labels": self.labels[i]}


def auto_batch_size(train_rows: int) -> int:
    """A batch size for a table of train_rows: the power of two nearest train_rows / 64, within
    32..1024 (32 on a few hundred rows, 512 from about 23,000, 1024 from about 93,000), so an
    epoch is a few dozen steps at mid sizes, as in the FT-Transformer paper's size-dependent batches."""
    return int(min(1024, max(32, 2 ** round(math.log2(max(train_rows, 1) / 64)))))


def quantile_bin_edges(values: np.ndarray, n_bins: int) -> list[list[float]]:
    """Per column of values (rows, columns): the distinct quantiles at 0, 1/n_bins, .., 1, so at
    most n_bins bins with about as many rows in each (a column with one value gets one unit bin)."""
    edges = []
    for column in values.T:
        distinct = np.unique(np.quantile(column, np.linspace(0, 1, n_bins + 1)).astype(np.float32))
        if len(distinct) < 2:
            distinct = np.array([distinct[0], distinct[0] + 1], dtype=np.float32)
        edges.append([float(v) for v in distinct])
    return edges


class TabularDataModule(L.LightningDataModule):
    preprocessor: TabularPreprocessor

    def __init__(self, prepared_dir: str, batch_size: int | str = "auto", eval_batch_size: int = 512,
                 fold: int | None = None, num_workers: int = 0, shuffle: bool = True,
                 max_examples: int | None = None, n_bins: int = 16):
        """batch_size: an int, or "auto" (`auto_batch_size` of the training rows). fold: None = the
        prepared train/validation/test split; k = cross-validation fold k held out as the test rows
        (see `fold_rows`; the encoder is then refitted on that fold's training rows). shuffle=False
        keeps the training rows in order (comparing one process with several). max_examples: rows
        kept per split (None = all; debug=smoke). n_bins: quantile bins per continuous input for
        the piecewise-linear encoding, their edges from the training rows only."""
        super().__init__()
        if not (batch_size == "auto" or (isinstance(batch_size, int) and batch_size > 0)):
            raise DataError(f"data.datamodule.batch_size={batch_size!r}; expected a positive integer or auto")
        self.save_hyperparameters()
        self.sets: dict[str, TabularRows] = {}
        self.encoder: TabularEncoder | None = None
        self.batch_size = batch_size if isinstance(batch_size, int) else None

    def setup(self, stage: str | None = None) -> None:
        if self.sets:
            return
        encoded, self.encoder = encoded_splits(self.hparams.prepared_dir, self.hparams.fold)
        cap = self.hparams.max_examples
        self.sets = {name: TabularRows(rows if cap is None else rows.head(cap)) for name, rows in encoded.items()}
        if self.batch_size is None:
            self.batch_size = auto_batch_size(len(self.sets["train"]))

    @property
    def preprocessor(self) -> TabularPreprocessor:
        self.setup()  # the encoder of a cross-validation fold is fitted on that fold's training rows
        return TabularPreprocessor(read_schema(self.hparams.prepared_dir), self.encoder)

    def model_kwargs(self) -> dict:
        self.setup()
        return {"cardinalities": self.encoder.cardinalities, "n_continuous": self.encoder.n_continuous,
                "n_classes": len(self.encoder.classes),
                "numeric_bins": quantile_bin_edges(self.sets["train"].continuous.numpy(), self.hparams.n_bins)}

    def _loader(self, name: str, training: bool) -> DataLoader:
        size = self.batch_size if training else self.hparams.eval_batch_size
        return DataLoader(self.sets[name], batch_size=size, shuffle=training and self.hparams.shuffle,
                          num_workers=self.hparams.num_workers)

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        if not self.hparams.shuffle and trainer is not None and trainer.world_size > 1:
            # Lightning's own distributed sampler always shuffles training data; keep file order
            sampler = DistributedSampler(self.sets["train"], trainer.world_size, trainer.global_rank, shuffle=False)
            return DataLoader(self.sets["train"], batch_size=self.batch_size, sampler=sampler,
                              num_workers=self.hparams.num_workers)
        return self._loader("train", True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation", False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", False)
