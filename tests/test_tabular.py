"""Tables: schema validation, encoding (unknown and missing values, train-only statistics), the
TabTransformer's column-set symmetry, the baselines, and the command-line stages."""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import PYTHON, ROOT, SHARED_DATA, run

from transformer_lab.data.tabular import (
    LABEL,
    MISSING,
    UNKNOWN,
    TableSchema,
    TabularDataModule,
    TabularEncoder,
    fold_rows,
    prepare,
    read_prepared,
    read_table,
)
from transformer_lab.errors import DataError
from transformer_lab.models.tab_transformer import TabTransformer, TabTransformerConfig

HEART = SHARED_DATA / "heart" / "processed.cleveland.csv"


def write_table(directory: Path, rows: int = 60, seed: int = 0) -> tuple[Path, Path]:
    """A small learnable table: the label follows colour and size; a few missing cells."""
    rng = np.random.default_rng(seed)
    colour = rng.choice(["red", "green", "blue"], rows)
    size = rng.normal(0, 1, rows).round(3)
    label = np.where((colour == "red") | (size > 0.5), "yes", "no")
    frame = pd.DataFrame({"colour": colour, "shape": rng.choice(["round", "square"], rows), "size": size,
                          "weight": rng.normal(5, 2, rows).round(2).astype(str), "label": label})
    frame.loc[[3, 7], "shape"] = "?"
    frame.loc[[5], "weight"] = "?"
    csv, schema = directory / "table.csv", directory / "schema.yaml"
    frame.to_csv(csv, index=False)
    schema.write_text("name: toy\ntarget: label\ncategorical: [colour, shape]\ncontinuous: [size, weight]\n"
                      'missing_values: ["?"]\n')
    return csv, schema


def test_schema_errors_name_the_field_column_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: t\ntarget: y\ncategorical: [a]\ncontinous: [b]\n")
    with pytest.raises(DataError, match=r"bad.yaml: unknown schema field 'continous'"):
        TableSchema.load(bad)
    bad.write_text("name: t\ncategorical: [a]\n")
    with pytest.raises(DataError, match=r"schema field 'target' is required"):
        TableSchema.load(bad)

    csv, schema_path = write_table(tmp_path)
    schema = TableSchema.load(schema_path)
    schema.continuous.append("height")
    with pytest.raises(DataError, match=r"table.csv: column 'height' named in the schema is not in the file"):
        read_table(csv, schema)

    text = csv.read_text().splitlines()
    cells = text[9].split(",")
    cells[2] = "tall"  # the size column of the row on line 10
    text[9] = ",".join(cells)
    csv.write_text("\n".join(text) + "\n")
    with pytest.raises(DataError, match=r"table.csv:10: column 'size': 'tall' is not a number"):
        read_table(csv, TableSchema.load(schema_path))


@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_prepare_cli_exits_2_with_one_line_and_leaves_nothing(tmp_path):
    csv, schema = write_table(tmp_path)
    csv.write_text(csv.read_text().replace("label", "target", 1))  # the schema's target column is gone
    out = tmp_path / "prepared"
    result = run([PYTHON, "pipelines/prepare.py", "data=tabular", "data.source=local", f"data.local_path={csv}",
                  f"data.schema={schema}", f"data.prepared_dir={out}", f"hydra.run.dir={tmp_path / 'run'}"])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {csv}: column 'label' named in the schema is not in the file "
        "(columns: colour, shape, size, weight, target)"]
    assert not out.exists()


def test_unseen_and_missing_values_and_train_only_statistics(tmp_path):
    csv, schema_path = write_table(tmp_path)
    schema = TableSchema.load(schema_path)
    table = read_table(csv, schema)
    assert table["shape"].isna().sum() == 2 and table["weight"].isna().sum() == 1
    train = table.iloc[:40]
    encoder = TabularEncoder.fit(train, schema, ["no", "yes"])
    assert encoder.means["size"] == pytest.approx(train["size"].mean())  # not the whole table's
    assert encoder.means["size"] != pytest.approx(table["size"].mean())
    assert encoder.indicators == ["weight"]  # only columns with missing training cells get one
    assert encoder.cardinalities == [2 + 3, 2 + 2]

    rows = pd.DataFrame({"colour": ["purple", "red"], "shape": [None, "round"], "size": [np.nan, 1.0],
                         "weight": [np.nan, 5.0], LABEL: ["no", "yes"]})
    encoded = encoder.transform(rows)
    assert encoded.categorical[0].tolist() == [UNKNOWN, MISSING]
    assert encoded.categorical[1, 0] == 2 + encoder.categories["colour"].index("red")
    # a missing continuous cell is the training mean (0 once standardised) and sets its indicator
    assert encoded.continuous[0].tolist() == [0.0, 0.0, 1.0]
    assert encoded.continuous[1, 2] == 0.0
    assert encoded.continuous[1, 0] == pytest.approx((1.0 - encoder.means["size"]) / encoder.stds["size"])
    assert encoded.labels.tolist() == [0, 1]
    one_hot = encoder.one_hot(encoded)
    assert one_hot.shape == (2, 5 + 4 + 3) and one_hot[0, UNKNOWN] == 1 and one_hot[0, 5 + MISSING] == 1


def test_split_is_stratified_and_folds_keep_test_rows_out(tmp_path):
    csv, schema = write_table(tmp_path, rows=100)
    summary = prepare("local", str(tmp_path / "p"), str(schema), local_path=str(csv), seed=3, folds=5)
    assert sum(summary["splits"].values()) == 100 and summary["missing_cells"] == {"shape": 2, "weight": 1}
    again = prepare("local", str(tmp_path / "q"), str(schema), local_path=str(csv), seed=3, folds=5)
    table, _, encoder = read_prepared(tmp_path / "p")
    assert table.equals(read_prepared(tmp_path / "q")[0]) and summary == again
    share = (table[LABEL] == "yes").mean()
    for part in fold_rows(table, None).values():
        assert abs((part[LABEL] == "yes").mean() - share) < 0.1
    seen = []
    for k in range(5):
        rows = fold_rows(table, k)
        lines = [set(rows[name]["_line"]) for name in ("train", "validation", "test")]
        assert not (lines[0] & lines[1] or lines[0] & lines[2] or lines[1] & lines[2])
        seen += sorted(lines[2])
    assert sorted(seen) == sorted(table["_line"])  # every row is tested exactly once
    data = TabularDataModule(str(tmp_path / "p"), fold=2)
    data.setup()
    assert len(data.sets["test"]) == len(fold_rows(table, 2)["test"])
    assert data.encoder.means != encoder.means  # refitted on the fold's training rows


def test_without_column_embeddings_the_columns_are_a_set():
    """Permuting the categorical columns (their values and their embedding tables together)
    permutes the contextual embeddings the same way: no hidden positional signal."""
    torch.manual_seed(0)
    cardinalities = [5, 3, 7, 4]
    config = dict(cardinalities=cardinalities, n_continuous=2, d_model=16, n_layers=2, n_heads=4, dropout=0.0)
    model = TabTransformer(TabTransformerConfig(**config, column_embedding_dim=0)).eval()
    perm = [2, 0, 3, 1]
    permuted = TabTransformer(TabTransformerConfig(**{**config, "cardinalities": [cardinalities[p] for p in perm]},
                                                   column_embedding_dim=0)).eval()
    state = model.state_dict()
    tables = torch.split(state["embedding.values.weight"], cardinalities)
    state["embedding.values.weight"] = torch.cat([tables[p] for p in perm])
    permuted.load_state_dict(state)
    categorical = torch.stack([torch.randint(0, n, (6,)) for n in cardinalities], dim=1)
    with torch.no_grad():
        contextual, _ = model.contextualize(categorical)
        contextual_permuted, _ = permuted.contextualize(categorical[:, perm])
    torch.testing.assert_close(contextual_permuted, contextual[:, perm], atol=1e-5, rtol=1e-5)
    # the columns do read each other: changing one column's value changes the others' states
    changed = categorical.clone()
    changed[:, 0] = (changed[:, 0] + 1) % cardinalities[0]
    with torch.no_grad():
        assert not torch.allclose(model.contextualize(changed)[0][:, 1:], contextual[:, 1:])

    # With the paper's column embedding the same swap is told apart.
    tagged = TabTransformer(TabTransformerConfig(**{**config, "cardinalities": [4, 4]}, column_embedding_dim=4)).eval()
    pair = torch.tensor([[1, 2]])
    with torch.no_grad():
        assert not torch.allclose(tagged.contextualize(pair)[0].flip(1), tagged.contextualize(pair.flip(1))[0])


def test_mlp_ablation_has_no_transformer_and_same_head_width():
    config = dict(cardinalities=[4, 6], n_continuous=3, d_model=8, n_heads=2, n_layers=2)
    transformer = TabTransformer(TabTransformerConfig(**config))
    mlp = TabTransformer(TabTransformerConfig(**config, architecture="mlp"))
    assert len(transformer.blocks) == 2 and len(mlp.blocks) == 0
    assert transformer.head[0].in_features == mlp.head[0].in_features == 2 * 8 + 3
    logits = mlp(torch.tensor([[0, 5], [1, 1]]), torch.zeros(2, 3)).logits
    assert logits.shape == (2, 2)


def test_training_and_baselines_learn_a_small_table(tmp_path):
    """TabTransformer through the Lightning trainer, XGBoost and logistic regression through their
    pipeline code: all beat chance clearly on a learnable table."""
    from transformer_lab.training.baselines import train_baseline
    from transformer_lab.training.train import train
    from transformer_lab.runtime.config import compose_config

    csv, schema = write_table(tmp_path, rows=240)
    prepared = tmp_path / "prepared"
    prepare("local", str(prepared), str(schema), local_path=str(csv), seed=0)
    common = ["logger=none", f"data.prepared_dir={prepared}"]
    cfg = compose_config("train", ["experiment=tabular/tab_transformer", *common, "callbacks.rich_progress_bar=null",
                                   "trainer.max_epochs=15", "task.lr=3e-3"], tmp_path / "tt")
    metrics = train(cfg)
    assert metrics["test/auroc"] > 0.8 and set(metrics) >= {"test/acc", "test/f1", "val/auroc"}
    for baseline in ("xgboost", "logistic_regression"):
        scores = train_baseline(compose_config("train_baseline", [f"baseline={baseline}", *common],
                                               tmp_path / baseline))
        assert scores["test/auroc"] > 0.8
    assert 0 <= scores["test/f1"] <= 1
    xgb = json.loads((tmp_path / "xgboost" / "metrics.json").read_text())
    assert xgb["best_iteration"] < 2000  # early stopping on the validation rows
    assert (tmp_path / "xgboost" / "model.ubj").is_file() and (tmp_path / "logistic_regression" / "model.skops").is_file()


def test_hub_source_offline_is_one_clear_error(tmp_path, offline_hub):
    with pytest.raises(DataError, match=r"could not load 'scikit-learn/adult-census-income'.*offline\?"):
        prepare("hub", str(tmp_path / "p"), str(ROOT / "conf/schemas/adult.yaml"),
                hub_id="scikit-learn/adult-census-income")


def test_builtin_penguins():
    schema = TableSchema.load(ROOT / "conf/schemas/penguins.yaml")
    from importlib.resources import files

    table = read_table(str(files("palmerpenguins") / "data" / "penguins.csv"), schema)
    assert len(table) == 344 and sorted(set(table[LABEL])) == ["Adelie", "Chinstrap", "Gentoo"]
    assert table["sex"].isna().sum() == 11 and table["body_mass_g"].isna().sum() == 2


@pytest.mark.skipif(not HEART.is_file(), reason="../shared/data/heart is not present")
def test_heart_missing_cells_are_handled(tmp_path):
    summary = prepare("local", str(tmp_path / "heart"), str(ROOT / "conf/schemas/heart.yaml"),
                      local_path=str(HEART), folds=5)
    assert summary["rows"] == 303 and summary["classes"] == ["num <= 0", "num > 0"]
    assert summary["missing_cells"] == {"ca": 4, "thal": 2}
    assert summary["class_counts"] == {"num <= 0": 164, "num > 0": 139}


def test_a_duplicated_column_name_is_refused_naming_the_file_and_the_column(tmp_path):
    """pandas renames a repeated header cell `size.1`: with a schema the first copy would win, with
    data.schema=infer the second would become a feature of its own."""
    csv, schema = write_table(tmp_path)
    lines = csv.read_text().splitlines()
    lines[0] = lines[0].replace("weight", "size")  # colour,shape,size,size,label
    csv.write_text("\n".join(lines) + "\n")
    for schema_path in (str(schema), "infer"):
        with pytest.raises(DataError, match=r"table.csv:1: column 'size' appears twice in the header "
                                            r"\(columns 3 and 4\)"):
            prepare("local", str(tmp_path / "p"), schema_path, local_path=str(csv))
    assert not (tmp_path / "p").exists()
    # rows handed to a trained model as a frame: the same refusal, not the first copy
    with pytest.raises(DataError, match=r"column 'size' appears more than once"):
        read_table("rows", TableSchema.load(schema), pd.DataFrame([[1.0, 2.0]], columns=["size", "size"]),
                   labelled=False)


@pytest.mark.parametrize("cell, reads_as", [("inf", "inf"), ("-Infinity", "-inf"), ("1e400", "inf"),
                                            ("nan", "nan")])
def test_a_non_finite_number_in_a_file_is_refused_with_its_line_and_column(tmp_path, cell, reads_as):
    csv, schema = write_table(tmp_path)
    lines = csv.read_text().splitlines()
    cells = lines[6].split(",")
    cells[3] = cell  # the weight of the row on line 7
    lines[6] = ",".join(cells)
    csv.write_text("\n".join(lines) + "\n")
    for schema_path in (str(schema), "infer"):
        with pytest.raises(DataError, match=rf"table.csv:7: column 'weight': '{cell}' reads as {reads_as}, "
                                            r"not a finite number \(a missing cell is empty or one of \['\?'"):
            prepare("local", str(tmp_path / "p"), schema_path, local_path=str(csv))


@pytest.fixture
def prepared_toy(tmp_path):
    """A prepared table, its preprocessor as a checkpoint carries it, and three raw rows."""
    from transformer_lab.data.tabular import TabularPreprocessor

    csv, schema = write_table(tmp_path, rows=100)
    prepared = tmp_path / "p"
    prepare("local", str(prepared), str(schema), local_path=str(csv))
    preprocessor = TabularPreprocessor.from_state(TabularDataModule(str(prepared)).preprocessor.to_state())
    rows = pd.read_csv(csv, dtype=str, keep_default_na=False).drop(columns="label").head(3).to_dict(orient="records")
    return preprocessor, rows, prepared


@pytest.mark.parametrize("value, message", [
    (1e400, r"row 1: column 'size': 'inf' reads as inf, not a finite number"),
    (float("-inf"), r"row 1: column 'size': '-inf' reads as -inf, not a finite number"),
    ("nan", r"row 1: column 'size': 'nan' reads as nan, not a finite number"),
    # finite, but standardised by the training rows it is beyond float32: inf at the model
    (1e300, r"row 1: column 'size': 1e\+300 is out of range: standardised by the training rows"),
])
def test_a_non_finite_number_never_reaches_a_model_at_inference(prepared_toy, value, message):
    """What the tabular pipeline, the MLflow model and the baselines call: the preprocessor's encoding."""
    from sklearn.linear_model import LogisticRegression

    from transformer_lab.data.tabular import encoded_splits
    from transformer_lab.training.baselines import FittedBaseline, fit

    preprocessor, rows, prepared = prepared_toy
    rows[1]["size"] = value
    with pytest.raises(DataError, match=message):
        preprocessor.batch(rows)
    with pytest.raises(DataError, match=message):
        preprocessor.encode(pd.DataFrame(rows))
    encoded, encoder = encoded_splits(prepared)
    estimator = fit(LogisticRegression(max_iter=200), encoder, encoded["train"], encoded["validation"])
    with pytest.raises(DataError, match=message):  # not scikit-learn's "Input X contains infinity"
        FittedBaseline(estimator, preprocessor).predict(rows)


def test_a_nan_value_in_a_row_is_pandas_missing_cell_not_a_number(prepared_toy):
    """float NaN is how pandas writes a missing cell (a frame of rows where one lacks a column), so
    it is a missing cell, as None and the empty string are; only text reading as nan is refused."""
    preprocessor, rows, _ = prepared_toy
    missing = [{**rows[0], "size": value} for value in (float("nan"), None, "", "?")]
    continuous = preprocessor.batch(missing)["continuous"]
    assert torch.isfinite(continuous).all()
    assert (continuous == continuous[0]).all()


def test_a_missing_cell_of_a_served_row_is_imputed_not_taken_for_a_missing_column(prepared_toy):
    """The served model reads a table of rows; pandas fills a cell it lacks with NaN, which is a
    missing cell of that row, not a column the row has not got."""
    from transformer_lab.inference.served import records_to_inputs

    preprocessor, rows, _ = prepared_toy
    served = records_to_inputs("tabular-classification", pd.DataFrame([{**rows[0], "size": float("nan")}]))
    assert set(served[0]) == set(rows[0])
    assert torch.isfinite(preprocessor.batch(served)["continuous"]).all()


def test_training_values_whose_mean_overflows_are_refused_by_column():
    """Every value finite, but their sum is not: the mean would be inf and every input NaN."""
    schema = TableSchema("t", "y", continuous=["distance"])
    rows = pd.DataFrame({"distance": [1e308, 1e308, 1.0], LABEL: ["a", "b", "a"]})
    with pytest.raises(DataError, match=r"column 'distance': its training values are too large to standardise "
                                        r"\(mean inf, standard deviation .*\); rescale the column"):
        TabularEncoder.fit(rows, schema, ["a", "b"])


@pytest.mark.filterwarnings("error::pandas.errors.PerformanceWarning")
def test_a_wide_table_is_prepared_trained_on_and_encoded_without_fragmenting_frames(tmp_path):
    """500 columns: a frame built a column at a time warns (PerformanceWarning) for each numeric column past
    about the hundredth."""
    rng = np.random.default_rng(0)
    rows = 40
    columns = {f"number_{i}": rng.normal(0, 1, rows).round(3).astype(str) for i in range(250)}
    columns |= {f"code_{i}": rng.choice(["a", "b", "c"], rows) for i in range(250)}
    csv = tmp_path / "wide.csv"
    pd.DataFrame({**columns, "label": rng.choice(["x", "y"], rows)}).to_csv(csv, index=False)
    prepare("local", str(tmp_path / "p"), "infer", local_path=str(csv), folds=2)
    data = TabularDataModule(str(tmp_path / "p"), fold=1)
    data.setup()
    data.preprocessor.batch(pd.read_csv(csv, dtype=str).drop(columns="label").to_dict(orient="records"))
    TabularDataModule(str(tmp_path / "p")).setup()
    assert data.model_kwargs()["n_continuous"] == 250 and len(data.model_kwargs()["cardinalities"]) == 250


def test_a_directory_given_for_a_file_and_a_one_class_target_say_what_is_wrong(tmp_path):
    csv, schema = write_table(tmp_path)
    folder = tmp_path / "folder.csv"
    folder.mkdir()
    is_a_directory = re.escape(f"{folder}: is a directory, expected a CSV file (data.local_path)")
    for schema_path in (str(schema), "infer"):
        with pytest.raises(DataError, match=is_a_directory):
            prepare("local", str(tmp_path / "p"), schema_path, local_path=str(folder))
    with pytest.raises(DataError, match=re.escape(f"{tmp_path}: is a directory, expected a schema file (YAML)")):
        prepare("local", str(tmp_path / "p"), str(tmp_path), local_path=str(csv))
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'absent.csv'}: file not found (data.local_path)")):
        prepare("local", str(tmp_path / "p"), str(schema), local_path=str(tmp_path / "absent.csv"))

    frame = pd.read_csv(csv, dtype=str, keep_default_na=False)
    frame.assign(label="yes").to_csv(csv, index=False)
    with pytest.raises(DataError, match=rf"^{re.escape(str(csv))}: target column 'label' has one class \('yes'\): "
                                        r"a classifier needs at least 2$"):
        prepare("local", str(tmp_path / "p"), str(schema), local_path=str(csv))
    frame.assign(label=["no"] + ["yes"] * (len(frame) - 1)).to_csv(csv, index=False)
    with pytest.raises(DataError, match=r"every class needs at least 2 rows for a stratified split "
                                        r"\(counts: \{'yes': 59, 'no': 1\}\)"):
        prepare("local", str(tmp_path / "p"), str(schema), local_path=str(csv))


@pytest.mark.slow  # three CLI processes and a baseline fitted: the full suite's
def test_a_non_finite_cell_stops_the_prepare_and_predict_commands_with_one_line(tmp_path):
    from test_trust import assert_one_line_error

    from transformer_lab.training.baselines import train_baseline
    from transformer_lab.runtime.config import compose_config

    csv, schema = write_table(tmp_path, rows=120)
    prepared = tmp_path / "prepared"
    prepare("local", str(prepared), str(schema), local_path=str(csv))
    train_baseline(compose_config("train_baseline", ["baseline=logistic_regression", f"data.prepared_dir={prepared}",
                                                     "logger=none"], tmp_path / "logreg"))
    result = run([PYTHON, "pipelines/predict.py", f"model={tmp_path / 'logreg'}", f"hydra.run.dir={tmp_path / 'p'}",
                  "row={colour: red, shape: round, size: 1e400, weight: 5}"])
    assert_one_line_error(result, "row 0: column 'size': 'inf' reads as inf, not a finite number")
    assert result.stdout == ""  # no answer with a NaN score

    lines = csv.read_text().splitlines()
    lines[4] = lines[4].replace(lines[4].split(",")[2], "1e400", 1)
    csv.write_text("\n".join(lines) + "\n")
    prepare_command = [PYTHON, "pipelines/prepare.py", "data=tabular", "data.source=local", f"data.schema={schema}",
                       f"data.prepared_dir={tmp_path / 'again'}", f"hydra.run.dir={tmp_path / 'run'}"]
    result = run([*prepare_command, f"data.local_path={csv}"])
    assert_one_line_error(result, f"{csv}:5: column 'size': '1e400' reads as inf, not a finite number")
    result = run([*prepare_command, f"data.local_path={tmp_path}"])
    assert_one_line_error(result, f"{tmp_path}: is a directory, expected a CSV file (data.local_path)")
    assert not (tmp_path / "again").exists()
