"""Tables at real size: numeric features as tokens (FT-Transformer), the piecewise-linear and
periodic encodings, bins from the training rows only, schema inference, and the defaults that
follow the table's size."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import PYTHON, ROOT, run
from test_tabular import write_table

from transformer_lab.data.tabular import (
    TableSchema,
    TabularDataModule,
    auto_batch_size,
    infer_schema,
    prepare,
    quantile_bin_edges,
)
from transformer_lab.errors import DataError
from transformer_lab.models.tab_transformer import (
    NumericEmbedding,
    PiecewiseLinearEncoding,
    TabTransformer,
    TabTransformerConfig,
)
from transformer_lab.training.callbacks import EarlyStoppingSteps

BINS = [[-1.0, 0.0, 1.0, 2.0], [0.0, 1.0]]  # two continuous inputs: three bins, then one


def config(**overrides) -> TabTransformerConfig:
    base = dict(cardinalities=[4, 3], n_continuous=2, d_model=16, n_layers=2, n_heads=4, dropout=0.0,
                numeric="tokens", readout="cls", norm_first=True, column_embedding_dim=0, numeric_bins=BINS)
    return TabTransformerConfig(**{**base, **overrides})


def test_piecewise_linear_encoding_by_hand():
    encode = PiecewiseLinearEncoding(BINS)
    values = torch.tensor([[-3.0, 0.5], [0.5, 3.0], [1.5, -1.0], [5.0, 0.25]])
    expected = torch.tensor([
        [[-2.0, 0.0, 0.0], [0.5, 0.0, 0.0]],  # left of the first edge: the first bin extends left
        [[1.0, 0.5, 0.0], [3.0, 0.0, 0.0]],   # a column's only bin is open on both sides
        [[1.0, 1.0, 0.5], [-1.0, 0.0, 0.0]],
        [[1.0, 1.0, 4.0], [0.25, 0.0, 0.0]],  # right of the last edge: the last bin extends right
    ])
    torch.testing.assert_close(encode(values), expected)
    with pytest.raises(ValueError, match=r"numeric_bins\[0\]: needs at least 2 strictly increasing edges"):
        PiecewiseLinearEncoding([[1.0, 1.0]])


@pytest.mark.parametrize("encoding", ["linear", "piecewise", "periodic"])
def test_numeric_encodings_give_one_token_per_column_and_tell_values_apart(encoding):
    torch.manual_seed(0)
    embed = NumericEmbedding(config(numeric_encoding=encoding))
    x = torch.tensor([[-0.5, 0.0], [0.5, 0.0], [1.5, 0.0]])  # first column: a value in each of three bins
    tokens = embed(x)
    assert tokens.shape == (3, 2, 16)
    # a monotone feature stays distinguishable: values in different bins give different tokens
    for a, b in ((0, 1), (1, 2), (0, 2)):
        assert not torch.allclose(tokens[a, 0], tokens[b, 0])
    # each column has its own map: the same value in the two columns gives two tokens
    assert not torch.allclose(embed(torch.zeros(1, 2))[0, 0], embed(torch.zeros(1, 2))[0, 1])
    tokens.sum().backward()
    assert all(p.grad is not None for p in embed.parameters())


def test_ft_layout_attends_over_continuous_columns():
    """Changing one continuous value changes every column's contextual embedding, categorical ones
    included; in the TabTransformer layout it reaches no column token."""
    torch.manual_seed(0)
    categorical = torch.tensor([[1, 2], [3, 0]])
    continuous = torch.tensor([[0.3, 1.0], [-0.7, 0.0]])
    changed = continuous.clone()
    changed[:, 0] += 1.0
    for encoding in ("linear", "piecewise", "periodic"):
        model = TabTransformer(config(numeric_encoding=encoding)).eval()
        with torch.no_grad():
            before, after = model(categorical, continuous), model(categorical, changed)
        assert before.hidden_states.shape == (2, 4, 16)  # 2 categorical + 2 continuous tokens, [CLS] left out
        assert before.logits.shape == (2, 2)
        moved = (before.hidden_states - after.hidden_states).abs().amax(dim=-1)
        assert bool((moved > 1e-6).all()), encoding
    tab = TabTransformer(config(numeric="concat", readout="flatten", numeric_encoding="linear")).eval()
    with torch.no_grad():
        before, after = tab(categorical, continuous), tab(categorical, changed)
    torch.testing.assert_close(before.hidden_states, after.hidden_states)
    assert not torch.allclose(before.logits, after.logits)  # it reaches the head beside the encoder


def test_layouts_and_readouts_build_and_validate():
    for numeric in ("concat", "tokens"):
        for encoding in ("linear", "piecewise", "periodic"):
            for readout, architecture in (("flatten", "transformer"), ("cls", "transformer"), ("flatten", "mlp")):
                model = TabTransformer(config(numeric=numeric, numeric_encoding=encoding, readout=readout,
                                              architecture=architecture))
                assert model(torch.tensor([[0, 1]]), torch.tensor([[0.5, 1.0]])).logits.shape == (1, 2)
    with pytest.raises(ValueError, match="numeric='columns'; expected one of concat, tokens"):
        config(numeric="columns")
    with pytest.raises(ValueError, match="readout='cls' needs the transformer"):
        config(architecture="mlp")
    with pytest.raises(ValueError, match="needs bin edges for each of the 2 continuous inputs"):
        config(numeric_encoding="piecewise", numeric_bins=[[0.0, 1.0]])


def test_bins_come_from_training_rows_only(tmp_path):
    csv, schema = write_table(tmp_path, rows=200)
    frame = pd.read_csv(csv, dtype=str, keep_default_na=False)
    frame.loc[10:40, "weight"] = "?"  # missing in training rows too: weight gets a 0/1 indicator input
    frame.to_csv(csv, index=False)
    prepare("local", str(tmp_path / "p"), str(schema), local_path=str(csv), seed=0, folds=5)
    data = TabularDataModule(str(tmp_path / "p"), n_bins=8)
    bins = data.model_kwargs()["numeric_bins"]
    train = data.sets["train"].continuous.numpy()
    assert bins == quantile_bin_edges(train, 8)
    assert len(bins) == 3  # size, weight and weight's missing indicator
    assert bins[2] == [0.0, 1.0]  # the 0/1 indicator: one bin
    assert all(len(edges) <= 9 and edges == sorted(set(edges)) for edges in bins)
    # rows outside the training split move no edge: the test rows' values changed
    table = pd.read_parquet(tmp_path / "p" / "table.parquet")
    table.loc[table["_split"] != "train", "size"] = 1000.0
    table.to_parquet(tmp_path / "p" / "table.parquet", index=False)
    assert TabularDataModule(str(tmp_path / "p"), n_bins=8).model_kwargs()["numeric_bins"] == bins
    # a cross-validation fold's bins come from that fold's training rows
    fold = TabularDataModule(str(tmp_path / "p"), n_bins=8, fold=1)
    assert fold.model_kwargs()["numeric_bins"] == quantile_bin_edges(fold.sets["train"].continuous.numpy(), 8)
    assert quantile_bin_edges(np.full((5, 1), 2.0), 4) == [[2.0, 3.0]]  # one value: one unit bin


def test_inferred_schema_on_mixed_types(tmp_path, capsys):
    rng = np.random.default_rng(0)
    rows = 120
    frame = pd.DataFrame({
        "customer_id": [f"c{i:04d}" for i in range(rows)],       # unique text: an identifier
        "age": rng.integers(18, 80, rows).astype(str),            # many numbers: continuous
        "grade": rng.choice(["1", "2", "3"], rows),               # few numbers: codes
        "city": rng.choice(["Oslo", "Lima", "Pune"], rows),       # text: categorical
        "income": rng.normal(50, 10, rows).round(1).astype(str),
        "empty": ["?"] * rows,
        "bought": rng.choice(["yes", "no"], rows),
    })
    frame.loc[[2, 9], "income"] = "?"
    frame.loc[4, "city"] = ""
    schema, reasons = infer_schema(frame, "shop.csv")
    assert schema.target == "bought"  # the last column by default
    assert schema.categorical == ["grade", "city"] and schema.continuous == ["age", "income"]
    assert reasons["customer_id"].startswith("left out") and reasons["empty"].startswith("left out")
    assert reasons["grade"].startswith("categorical: numbers with only 3")
    assert infer_schema(frame, "shop.csv", target="grade")[0].target == "grade"
    with pytest.raises(DataError, match=r"shop.csv: target column 'spend' \(data.target\) is not in the file"):
        infer_schema(frame, "shop.csv", target="spend")

    # through prepare: the schema it used is written beside the table and loads as a schema file
    csv = tmp_path / "shop.csv"
    frame.to_csv(csv, index=False)
    summary = prepare("local", str(tmp_path / "p"), "infer", local_path=str(csv))
    assert summary["categorical"] == ["grade", "city"] and summary["continuous"] == ["age", "income"]
    written = TableSchema.load(tmp_path / "p" / "schema.yaml")
    assert (written.target, written.categorical, written.continuous) == ("bought", ["grade", "city"], ["age", "income"])
    assert "# customer_id: left out" in (tmp_path / "p" / "schema.yaml").read_text()
    said = capsys.readouterr().out  # which column it treated how, and where the schema is
    assert "column types inferred" in said and "continuous: numbers" in said and "schema.yaml" in said
    with pytest.raises(DataError, match="data.schema=infer reads the types off a CSV"):
        prepare("builtin", str(tmp_path / "q"), "infer")


def test_defaults_follow_the_table_size(tmp_path):
    assert [auto_batch_size(n) for n in (200, 2_000, 5_000, 24_000, 36_000, 100_000, 10**7)] == \
        [32, 32, 64, 512, 512, 1024, 1024]
    csv, schema = write_table(tmp_path, rows=200)
    prepare("local", str(tmp_path / "p"), str(schema), local_path=str(csv))
    data = TabularDataModule(str(tmp_path / "p"))
    data.setup()
    assert data.batch_size == 32 and data.train_dataloader().batch_size == 32
    fixed = TabularDataModule(str(tmp_path / "p"), batch_size=16)
    fixed.setup()
    assert fixed.train_dataloader().batch_size == 16
    with pytest.raises(DataError, match="batch_size='big'; expected a positive integer or auto"):
        TabularDataModule(str(tmp_path / "p"), batch_size="big")


class FakeTrainer:
    def __init__(self, batches):
        self.num_training_batches = batches


def test_early_stopping_patience_is_counted_in_steps_and_progress_is_relative():
    stop = EarlyStoppingSteps("val/loss", patience_steps=200, min_patience=3, min_delta_ratio=0.01)
    for batches, patience in ((7, 29), (47, 5), (1000, 3), (math.inf, 200)):
        stop.on_train_start(FakeTrainer(batches), None)
        assert stop.patience == patience
    stop.patience = 2
    for loss, waiting in ((1.0, 0), (0.5, 0), (0.499, 1), (0.4985, 2)):  # 0.499 is less than 1% better
        should_stop, _ = stop._evaluate_stopping_criteria(torch.tensor(loss))
        assert stop.wait_count == waiting
    assert should_stop
    # an absolute floor as well: near 0 a 1% step is no progress worth waiting for
    floor = EarlyStoppingSteps("val/loss", min_delta=0.001, min_delta_ratio=0.01)
    floor.patience = 5
    for loss, waiting in ((0.010, 0), (0.0095, 1), (0.0089, 0)):
        floor._evaluate_stopping_criteria(torch.tensor(loss))
        assert floor.wait_count == waiting


def test_a_run_ended_mid_epoch_by_max_steps_is_not_an_early_stopping_error(tmp_path):
    # early stopping is judged after validation; at the end of a cut-short epoch there is no val/loss yet
    from transformer_lab.training.train import train
    from transformer_lab.runtime.config import compose_config

    prepared = tmp_path / "penguins"
    prepare("builtin", str(prepared), str(ROOT / "conf/schemas/penguins.yaml"))
    cfg = compose_config("train", ["experiment=tabular/tab_transformer", "logger=none", f"data.prepared_dir={prepared}",
                                   "callbacks.rich_progress_bar=null", "++trainer.max_steps=3",
                                   "data.datamodule.batch_size=16"], tmp_path / "run")
    assert "callbacks" in cfg and cfg.callbacks.early_stopping.monitor == "val/loss"
    assert "test/auroc" in train(cfg)


@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_benchmark_runs_every_variant_on_the_same_folds(tmp_path):
    out = tmp_path / "tabular.json"
    result = run([PYTHON, ROOT / "benchmarks" / "tabular.py", "--census-rows", "300", "--folds", "2", "--out", out,
                  "--models", "ft_transformer_piecewise,ft_transformer_periodic,xgboost,logreg",
                  "--set", "trainer.max_epochs=2"])
    assert result.returncode == 0, result.stderr[-2000:]
    scores = json.loads(out.read_text())
    for model in ("ft_transformer_piecewise", "ft_transformer_periodic", "xgboost", "logreg"):
        assert len(scores[f"{model}_auc"]["folds"]) == len(scores[f"{model}_acc"]["folds"]) == 2
        assert 0 <= scores[f"{model}_auc"]["mean"] <= 1 and scores[f"{model}_seconds"] > 0
    assert scores["rows"] == 300 and scores["columns"] == 14
    assert scores["best_transformer"] in ("ft_transformer_piecewise", "ft_transformer_periodic")
    assert "within one std of XGBoost" in result.stdout
