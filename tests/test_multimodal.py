"""The multimodal transformer: one sequence from image patches, word pieces and table columns.
Token counts, the modality-type embedding, masking a missing modality (not zero-filling it), the
single-modality variants against the ViT and TabTransformer paths, late fusion, the data (builtin,
local CSV + images, bad rows and images as one line, exit 2, nothing written) and a trained run
scored by the evaluation stage."""

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import PYTHON, ROOT, SHARED_DATA, run

from transformer_lab.data.multimodal import MultimodalDataModule, MultimodalPreprocessor, MultimodalSchema, prepare
from transformer_lab.errors import DataError, TransformerLabError
from transformer_lab.models.multimodal import MODALITIES, MultimodalConfig, MultimodalTransformer
from transformer_lab.models.tab_transformer import TabTransformer, TabTransformerConfig
from transformer_lab.models.vit import VisionTransformer, ViTConfig
from transformer_lab.tasks.bert_pretraining import published_body

FASHION = SHARED_DATA / "fashion"


def config(**overrides) -> MultimodalConfig:
    base = dict(n_classes=3, image_size=8, in_channels=1, patch_size=2, vocab_size=30, max_text_len=6,
                cardinalities=[4, 5], n_continuous=2, d_model=32, n_heads=4, n_layers=2, dropout=0.0)
    return MultimodalConfig(**{**base, **overrides})


def inputs(batch: int = 3, seed: int = 0, text_len: int = 6) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 30, (batch, text_len), generator=g)
    ids[0, 4:] = 0  # padding
    return {"images": torch.randn(batch, 1, 8, 8, generator=g), "input_ids": ids,
            "categorical": torch.randint(0, 4, (batch, 2), generator=g),
            "continuous": torch.randn(batch, 2, generator=g)}


def model(**overrides) -> MultimodalTransformer:
    torch.manual_seed(0)
    return MultimodalTransformer(config(**overrides)).eval()


def test_one_sequence_holds_cls_then_every_modality_s_tokens():
    m = model()
    assert m.config.token_counts() == {"image": 16, "text": 6, "table": 4}  # 4x4 patches, 6 pieces, 2 + 2 columns
    out = m(**inputs())
    assert out.hidden_states.shape == (3, 1 + 16 + 6 + 4, 32) and out.logits.shape == (3, 3)
    assert m.token_spans(**inputs()) == {"image": slice(1, 17), "text": slice(17, 23), "table": slice(23, 27)}
    # the configured order never depends on how the subset is written
    assert MultimodalConfig(modalities=["table", "image"], cardinalities=[3]).modalities == ["image", "table"]


def test_the_modality_type_embedding_tells_the_modalities_apart():
    m = model()
    x = inputs()
    before = m(**x).logits
    types = m.encoders["joint"].modality_embeddings.weight
    with torch.no_grad():
        types[[0, 1]] = types[[1, 0]].clone()  # swap the image and text type ids
    assert not torch.allclose(m(**x).logits, before, atol=1e-4)
    with torch.no_grad():
        types[1] = types[0]  # with the two ids equal, swapping them changes nothing: the test sees the ids only
        same = m(**x).logits
        types[[0, 1]] = types[[1, 0]].clone()
    torch.testing.assert_close(m(**x).logits, same)


def test_a_missing_modality_is_masked_out_not_zero_filled():
    m = model()
    x = inputs()
    present = torch.ones(3, len(MODALITIES), dtype=torch.bool)
    present[:, MODALITIES.index("image")] = False
    masked = m(**x, present=present).logits
    # whatever the missing images hold, [CLS] does not change
    torch.testing.assert_close(m(**{**x, "images": torch.randn(3, 1, 8, 8) * 9}, present=present).logits, masked)
    # and it is exactly the model without the image modality, run on the same weights
    text_table = MultimodalTransformer(replace(m.config, modalities=["text", "table"])).eval()
    text_table.load_state_dict({k: v for k, v in m.state_dict().items() if ".tokenizers.image." not in k})
    torch.testing.assert_close(text_table(**x).logits, masked, atol=1e-5, rtol=1e-5)
    # zero-filled images are tokens the model reads: another answer
    zero_filled = m(**{**x, "images": torch.zeros(3, 1, 8, 8)}).logits
    assert not torch.allclose(zero_filled, masked, atol=1e-4)
    # padding inside the text is masked the same way: what a padded position holds does not matter
    m.encoders["joint"].tokenizers["text"].word_embeddings.weight.data[0] += 5.0  # the padding id's vector
    torch.testing.assert_close(m(**x, present=present).logits, masked, atol=1e-5, rtol=1e-5)


def test_each_single_modality_model_matches_its_family_s_shapes():
    x = inputs()
    image = model(modalities=["image"])
    vit = VisionTransformer(ViTConfig(image_size=8, in_channels=1, n_classes=3, patch_size=2, n_layers=2,
                                      d_model=32, n_heads=4))
    assert image(**x).hidden_states.shape == vit(x["images"]).hidden_states.shape == (3, 17, 32)
    text = model(modalities=["text"])
    assert text(**x).hidden_states.shape == (3, 1 + 6, 32)
    table = model(modalities=["table"], n_continuous=0)
    tab = TabTransformer(TabTransformerConfig(cardinalities=[4, 5], n_continuous=0, n_classes=3, d_model=32,
                                              n_layers=2, n_heads=4))
    contextual = tab(x["categorical"], x["continuous"][:, :0]).hidden_states
    assert table(**{**x, "continuous": x["continuous"][:, :0]}).hidden_states[:, 1:].shape == contextual.shape \
        == (3, 2, 32)
    # a modality the model was not built for is never read; one it was built for is required
    assert torch.equal(image(**{**x, "input_ids": None}).logits, image(**x).logits)
    with pytest.raises(ValueError, match="the text modality needs input_ids"):
        text(images=x["images"])


@pytest.mark.parametrize("modalities, fusion", [(["image"], "joint"), (["text"], "joint"), (["table"], "joint"),
                                                (["image", "text", "table"], "joint"),
                                                (["image", "text", "table"], "late")])
def test_every_variant_trains_on_a_task_it_can_see(modalities, fusion):
    """The class is written into every modality (the digit drawn, the word, the column), so
    each variant can learn it: the training loss falls well below chance."""
    torch.manual_seed(0)
    n = 64
    labels = torch.arange(n) % 3
    images = torch.zeros(n, 1, 8, 8)
    images[torch.arange(n), 0, labels * 2, :] = 3.0
    x = {"images": images, "input_ids": torch.stack([labels + 1, labels + 4, torch.zeros(n, dtype=torch.long)], 1),
         "categorical": torch.stack([labels, (labels + 1) % 5], 1), "continuous": labels[:, None].float().repeat(1, 2)}
    m = MultimodalTransformer(config(modalities=modalities, fusion=fusion, max_text_len=3)).train()
    optimizer = torch.optim.AdamW(m.parameters(), lr=3e-3)
    for _ in range(120):
        loss = F.cross_entropy(m(**x).logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.2 * np.log(3)


def test_late_fusion_encodes_each_modality_alone_and_stands_in_for_a_missing_one():
    m = model(fusion="late")
    assert set(m.encoders) == {"image", "text", "table"}
    x = inputs()
    present = torch.ones(3, 3, dtype=torch.bool)
    present[1, MODALITIES.index("text")] = False
    out = m(**x, present=present).logits
    scrambled = {**x, "input_ids": torch.randint(1, 30, (3, 6))}
    changed = m(**scrambled, present=present).logits
    torch.testing.assert_close(changed[1], out[1])  # its text is missing: what it holds does not matter
    assert not torch.allclose(changed[0], out[0])
    with pytest.raises(ValueError, match="late fusion has no joint sequence"):
        m.token_spans(**x)


# --- data -------------------------------------------------------------------------------------

def test_the_builtin_task_needs_every_modality(tmp_path):
    summary = prepare("builtin", str(tmp_path / "mm"))
    assert summary["rows"] == 1797 and len(summary["classes"]) == 8 and summary["image_shape"] == [1, 8, 8]
    assert sum(summary["splits"].values()) == 1797 and 0 < summary["rows_without_text"] < 200
    table = __import__("pandas").read_parquet(tmp_path / "mm" / "table.parquet")
    size = [label.split("/")[2] for label in table["_label"]]
    # each fact sits in one modality: the colour word only in the text, the size only in the table
    with_text = table[table["_has_text"]]
    assert all(any(w in text for w in {"red": ["red", "crimson", "scarlet", "ruby"],
                                       "blue": ["blue", "navy", "azure", "cobalt"]}[label.split("/")[1]])
               for text, label in zip(with_text["_text"], with_text["_label"]))
    agree = np.mean([cell == s for cell, s in zip(table["size"], size)])
    assert 0.85 < agree < 0.95  # the size cell is wrong in 10 % of rows
    datamodule = MultimodalDataModule(str(tmp_path / "mm"), batch_size=16)
    datamodule.setup()
    batch = next(iter(datamodule.train_dataloader()))
    assert batch["images"].shape == (16, 1, 8, 8) and batch["input_ids"].shape == (16, 16)
    assert batch["categorical"].shape == (16, 2) and batch["continuous"].shape == (16, 1)
    assert batch["present"].shape == (16, 3) and batch["present"][:, 2].all()
    kwargs = datamodule.model_kwargs()
    assert kwargs["n_classes"] == 8 and kwargs["cardinalities"] == [4, 5] and kwargs["n_continuous"] == 1
    state = json.loads(json.dumps(datamodule.preprocessor.to_state()))  # plain data, as a checkpoint keeps it
    again = MultimodalPreprocessor.from_state(state)
    rows = [{"text": "a crimson plain item", "size": "large", "shade": "dark", "weight": "1.2"}]
    torch.testing.assert_close(again.batch(rows)["input_ids"], datamodule.preprocessor.batch(rows)["input_ids"])
    assert not again.batch(rows)["present"][0, 0]  # no picture given: the image modality is missing


def write_products(directory: Path, n: int = 24) -> Path:
    """A small catalogue as the fashion data lays it out: data.csv, images/<id>.png, a schema."""
    from PIL import Image

    (directory / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = ["id,usage,name,gender,year,image_path"]
    for i in range(n):
        usage = ["Casual", "Sports"][i % 2]
        Image.fromarray(rng.integers(0, 255, (20, 16, 3), dtype=np.uint8)).save(directory / "images" / f"{i}.png")
        lines.append(f"{i},{usage},{'Nike running' if i % 2 else 'Cotton'} shirt {i},{['Men', 'Women'][i % 3 % 2]},"
                     f"{2010 + i % 5},images/{i}.png")
    (directory / "data.csv").write_text("\n".join(lines) + "\n")
    (directory / "schema.yaml").write_text("name: products\ntarget: usage\nimage: image_path\ntext: name\n"
                                           "categorical: [gender]\ncontinuous: [year]\n")
    return directory


def test_a_local_catalogue_is_resized_once_and_split(tmp_path):
    products = write_products(tmp_path / "products")
    summary = prepare("local", str(tmp_path / "out"), schema=str(products / "schema.yaml"),
                      local_path=str(products / "data.csv"), image_size=12, vocab_size=100)
    assert summary["rows"] == 24 and summary["classes"] == ["Casual", "Sports"]
    with np.load(tmp_path / "out" / "images.npz") as data:
        assert data["images"].shape == (24, 3, 12, 12) and data["images"].dtype == np.uint8
    datamodule = MultimodalDataModule(str(tmp_path / "out"))
    datamodule.setup()
    assert datamodule.model_kwargs()["image_size"] == 12


def test_a_target_that_is_also_an_input_is_refused(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: x\ntarget: usage\ntext: usage\n")
    with pytest.raises(DataError, match="the target 'usage' is also an input column"):
        MultimodalSchema.load(path)


# one case in the quick suite, the others (a CLI process each, 20-30 s here) in the full one
# every damage through the data code (quick) and through the command line (slow: a stage's start-up)
@pytest.mark.parametrize("via", ["api", pytest.param("cli", marks=pytest.mark.slow)])
@pytest.mark.parametrize("damage, expected", [
    ("missing", r"data\.csv:5: image .*images/3\.png not found"),
    ("corrupt", r"data\.csv:8: image .*images/6\.png is unreadable"),
    ("number", r"data\.csv:3: column 'year': 'soon' is not a number"),
    ("unlabelled", r"data\.csv:4: target column 'usage' is empty"),
])
def test_bad_rows_and_images_are_one_line_exit_2_and_nothing_is_written(tmp_path, damage, expected, via):
    products = write_products(tmp_path / "products")
    out = tmp_path / "prepared" / "multimodal"
    prepare("local", str(out), schema=str(products / "schema.yaml"), local_path=str(products / "data.csv"),
            image_size=12, vocab_size=100)  # the earlier, good output
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    lines = (products / "data.csv").read_text().splitlines()
    if damage == "missing":
        (products / "images" / "3.png").unlink()
    elif damage == "corrupt":
        (products / "images" / "6.png").write_bytes(b"not a png")
    elif damage == "number":
        lines[2] = lines[2].replace(",2011,", ",soon,")
        (products / "data.csv").write_text("\n".join(lines) + "\n")
    else:
        lines[3] = re.sub(r"^(\d+),\w+,", r"\1,,", lines[3])
        (products / "data.csv").write_text("\n".join(lines) + "\n")
    if via == "cli":
        result = run([PYTHON, ROOT / "pipelines" / "prepare.py", "data=multimodal", "data.source=local",
                      f"data.local_path={products / 'data.csv'}", f"data.schema={products / 'schema.yaml'}",
                      "data.image_size=12", "data.vocab_size=100", f"data.prepared_dir={out}",
                      f"hydra.run.dir={tmp_path / 'hydra'}"])
        assert result.returncode == 2, result.stderr
        [line] = result.stderr.strip().splitlines()
    else:
        with pytest.raises(TransformerLabError) as refused:
            prepare("local", str(out), schema=str(products / "schema.yaml"), local_path=str(products / "data.csv"),
                    image_size=12, vocab_size=100)
        [line] = [f"error: {refused.value}"]
    assert line.startswith("error: ") and re.search(expected, line), line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not list(out.parent.glob(".multimodal.*"))


def prepare_products(products: Path, out: Path, **options) -> dict:
    return prepare("local", str(out), schema=str(products / "schema.yaml"), local_path=str(products / "data.csv"),
                   image_size=12, vocab_size=100, **options)


def edit_csv(products: Path, edit) -> None:
    lines = (products / "data.csv").read_text().splitlines()
    (products / "data.csv").write_text("\n".join(edit(lines)) + "\n")


def test_a_duplicated_column_name_is_refused_naming_the_file_and_the_column(tmp_path):
    products = write_products(tmp_path / "products")
    edit_csv(products, lambda lines: [lines[0].replace(",name,", ",year,"), *lines[1:]])  # id,usage,year,gender,year,..
    with pytest.raises(DataError, match=r"data\.csv:1: column 'year' appears twice in the header \(columns 3 and 5\)"):
        prepare_products(products, tmp_path / "out")


@pytest.mark.parametrize("cell, reads_as", [("inf", "inf"), ("1e400", "inf"), ("NaN", "nan")])
def test_a_non_finite_number_is_refused_at_preparation_and_at_inference(tmp_path, cell, reads_as):
    products = write_products(tmp_path / "products")
    prepare_products(products, tmp_path / "out")
    state = MultimodalDataModule(str(tmp_path / "out")).preprocessor.to_state()
    preprocessor = MultimodalPreprocessor.from_state(state)  # as a checkpoint carries it
    rows = [{"name": "Cotton shirt", "gender": "Men", "year": "2012"}, {"name": "Nike", "gender": "Men", "year": cell}]
    with pytest.raises(DataError, match=rf"^row 1: column 'year': '{cell}' reads as {reads_as}, not a finite number"):
        preprocessor.batch(rows)
    with pytest.raises(DataError, match=r"^row 0: column 'year': 1e\+300 is out of range"):
        preprocessor.batch([{**rows[0], "year": 1e300}])  # finite, but inf once standardised as float32
    edit_csv(products, lambda lines: [*lines[:5], lines[5].replace(",2014,", f",{cell},"), *lines[6:]])
    with pytest.raises(DataError, match=rf"data\.csv:6: column 'year': '{cell}' reads as {reads_as}, not a finite"):
        prepare_products(products, tmp_path / "again")


def test_a_directory_given_for_a_file_and_a_one_class_target_say_what_is_wrong(tmp_path):
    products = write_products(tmp_path / "products")
    with pytest.raises(DataError, match=r"products: is a directory, expected a CSV file \(data\.local_path\)$"):
        prepare("local", str(tmp_path / "out"), schema=str(products / "schema.yaml"), local_path=str(products))
    (products / "images" / "folder.png").mkdir()
    edit_csv(products, lambda lines: [*lines[:4], lines[4].replace("images/3.png", "images/folder.png"), *lines[5:]])
    with pytest.raises(DataError, match=r"data\.csv:5: image .*folder\.png is a directory, expected an image file$"):
        prepare_products(products, tmp_path / "out")
    edit_csv(products, lambda lines: [lines[0], *(line.replace(",Sports,", ",Casual,") for line in lines[1:])])
    with pytest.raises(DataError, match=r"data\.csv: target column 'usage' has one class \('Casual'\): "
                                        r"a classifier needs at least 2$"):
        prepare_products(products, tmp_path / "out")


@pytest.mark.filterwarnings("error::pandas.errors.PerformanceWarning")
def test_a_wide_table_part_is_prepared_and_read_without_fragmenting_frames(tmp_path):
    """300 continuous columns: a frame built a column at a time warns (PerformanceWarning) for each past
    about the hundredth."""
    products = write_products(tmp_path / "products")
    extra = [f"measure_{i}" for i in range(300)]
    edit_csv(products, lambda lines: [lines[0] + "," + ",".join(extra),
                                      *(line + "," + ",".join(str((i * j) % 7) for j in range(300))
                                        for i, line in enumerate(lines[1:]))])
    schema = (products / "schema.yaml").read_text()
    (products / "schema.yaml").write_text(schema.replace("[year]", f"[year, {', '.join(extra)}]"))
    prepare_products(products, tmp_path / "out")
    datamodule = MultimodalDataModule(str(tmp_path / "out"))
    datamodule.setup()
    assert datamodule.model_kwargs()["n_continuous"] == 301


def test_unlabelled_rows_can_be_dropped_and_lines_still_point_into_the_file(tmp_path):
    products = write_products(tmp_path / "products")
    lines = (products / "data.csv").read_text().splitlines()
    lines[3] = re.sub(r"^(\d+),\w+,", r"\1,,", lines[3])
    lines[9] = lines[9].replace(",2013,", ",later,")
    (products / "data.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"data\.csv:10: column 'year'"):  # the line in the file, after the drop
        prepare("local", str(tmp_path / "out"), schema=str(products / "schema.yaml"),
                local_path=str(products / "data.csv"), drop_unlabelled=True, image_size=12)


def test_hub_source_offline_is_one_clear_line(offline_hub, tmp_path):
    schema = tmp_path / "s.yaml"
    schema.write_text("name: x\ntarget: usage\ntext: name\n")
    with pytest.raises(DataError, match=r"could not load 'ashraq/fashion-product-images-small' .*data\.local_path"):
        prepare("hub", str(tmp_path / "out"), schema=str(schema), hub_id="ashraq/fashion-product-images-small")


@pytest.mark.skipif(not FASHION.is_dir(), reason="../shared/data/fashion is not here")
def test_the_fashion_schema_reads_the_shared_catalogue(tmp_path):
    summary = prepare("local", str(tmp_path / "fashion"), schema=str(ROOT / "conf/schemas/fashion_usage.yaml"),
                      local_path=str(FASHION / "data.csv"), min_class_rows=50, drop_unlabelled=True, max_rows=300,
                      image_size=16)
    assert summary["dropped_unlabelled"] == 8 and set(summary["dropped_rare_classes"]) == {"Smart Casual", "Travel"}
    assert summary["rows"] == 300 and summary["image_shape"] == [3, 16, 16]


# --- training and evaluation ------------------------------------------------------------------

@pytest.mark.parametrize("fusion", ["joint", "late"])
def test_word_embeddings_can_start_from_minilm_with_its_tokenizer(tmp_path, fusion):
    """data.text_tokenizer=minilm encodes the texts with MiniLM's word pieces; task.pretrained=minilm
    copies MiniLM's word-embedding table into every text encoder, projected to the model width."""
    from transformer_lab.data import published
    from transformer_lab.tasks.multimodal import MultimodalClassificationTask

    products = write_products(tmp_path / "products")
    summary = prepare("local", str(tmp_path / "out"), schema=str(products / "schema.yaml"),
                      local_path=str(products / "data.csv"), image_size=8, text_tokenizer="minilm")
    minilm = published.resolve("minilm")
    assert summary["vocab_size"] == minilm.tokenizer().get_vocab_size() and summary["text_tokenizer"] == "minilm"
    datamodule = MultimodalDataModule(str(tmp_path / "out"))
    ids = datamodule.preprocessor.encode_texts(["Nike running shirt"])[0]
    expected = minilm.tokenizer().encode("Nike running shirt", add_special_tokens=False).ids
    assert ids[: len(expected)].tolist() == expected and not ids[len(expected):].any()

    config = {**datamodule.model_kwargs(), "patch_size": 4, "fusion": fusion, "text_embedding_dim": 384}
    task = MultimodalClassificationTask(config, datamodule.preprocessor.to_state(), pretrained="minilm")
    table = published_body(minilm)["embeddings.token.weight"]
    texts = [m for m in task.model.modules() if type(m).__name__ == "TextTokens"]
    assert len(texts) == 1 and torch.equal(texts[0].word_embeddings.weight, table)
    assert texts[0].word_projection.weight.shape == (task.model.config.d_model, 384)
    datamodule.setup()
    batch = next(iter(datamodule.train_dataloader()))
    loss = F.cross_entropy(task.classify(batch)[0].logits, batch["labels"])
    loss.backward()
    assert torch.isfinite(loss) and texts[0].word_embeddings.weight.grad.abs().sum() > 0

    with pytest.raises(TransformerLabError, match=r"do not fit.*text_embedding_dim"):
        MultimodalClassificationTask({**config, "text_embedding_dim": None}, datamodule.preprocessor.to_state(),
                                     pretrained="minilm")


def test_word_embeddings_can_start_from_a_pretrain_bert_checkpoint(tmp_path):
    """A checkpoint is read as data (weights_only); one that holds no BERT is one clear error."""
    from transformer_lab.tasks.multimodal import pretrained_word_embeddings

    config = {"modalities": ["text"], "vocab_size": 50, "n_classes": 2, "text_embedding_dim": 32}
    table = torch.randn(50, 32)
    torch.save({"state_dict": {"model.bert.embeddings.token.weight": table}, "hyper_parameters": {}},
               tmp_path / "bert.ckpt")
    model = MultimodalTransformer(MultimodalConfig(**config))
    model.load_word_embeddings(pretrained_word_embeddings(str(tmp_path / "bert.ckpt")))
    assert torch.equal(model.encoders["joint"].tokenizers["text"].word_embeddings.weight, table)
    torch.save({"state_dict": {"model.gpt.token.weight": table}, "hyper_parameters": {}}, tmp_path / "gpt.ckpt")
    with pytest.raises(TransformerLabError, match="not a BERT checkpoint"):
        pretrained_word_embeddings(str(tmp_path / "gpt.ckpt"))
    with pytest.raises(ValueError, match="no text modality"):
        MultimodalTransformer(MultimodalConfig(modalities=["table"], n_continuous=1)).load_word_embeddings(table)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Every variant trained briefly on the builtin task, then the evaluation stage."""
    from transformer_lab.data.prepare import prepare as prepare_stage
    from transformer_lab.evaluation.multimodal import evaluate
    from transformer_lab.training.train import train
    from transformer_lab.runtime.config import compose_config

    root = tmp_path_factory.mktemp("multimodal")
    data = [f"paths.data_dir={root / 'data'}"]
    prepare_stage(compose_config("prepare", ["data=multimodal", *data], root / "prep"))
    metrics = {}
    for variant in ("image", "text", "table", "joint", "late_fusion"):
        cfg = compose_config("train", [f"experiment=multimodal/{variant}", "logger=none", "trainer.max_epochs=12",
                                       "callbacks.rich_progress_bar=null", *data], root / variant)
        metrics[variant] = train(cfg)
    models = ",".join(f"{v}:{root / v}" for v in metrics)
    eval_cfg = compose_config("evaluate", ["evaluate=multimodal", "logger=none", f"models={{{models}}}", *data], root / "eval")
    return root, metrics, evaluate(eval_cfg)


@pytest.mark.slow  # trains a model first (a minute): the full suite's
def test_every_variant_trains_and_all_three_beat_any_one(trained):
    root, _, scores = trained
    assert set(scores) == {"image", "text", "table", "joint", "late_fusion"}
    singles = max(scores[v]["test/acc"] for v in ("image", "text", "table"))
    assert singles < 0.45  # one fact of three: about a quarter right at best
    # 12 epochs on 1,257 rows: the joint model is well on its way (0.43 against 0.24 when written), not done
    assert scores["joint"]["test/acc"] > singles + 0.1
    assert json.loads((root / "eval" / "comparison.json").read_text()) == scores
    assert (root / "eval" / "comparison.png").stat().st_size > 10_000
    assert (root / "eval" / "attention.png").stat().st_size > 10_000


@pytest.mark.slow  # trains a model first (a minute): the full suite's
def test_the_attention_picture_splits_cls_over_the_modalities(trained):
    from transformer_lab.evaluation.multimodal import cls_attention
    from transformer_lab.tasks.checkpoints import load_task
    from transformer_lab.tasks.multimodal import MultimodalClassificationTask

    root, _, _ = trained
    task = load_task(root / "joint" / "checkpoints" / "best.ckpt", MultimodalClassificationTask, "train_multimodal")
    rows, images = MultimodalDataModule(str(root / "data" / "prepared" / "multimodal")).split_rows("test")
    products = cls_attention(task, rows.iloc[:4], images[:4], torch.zeros(4, dtype=torch.long))
    for product in products:
        assert set(product["shares"]) == {"image", "text", "table"}
        assert 0.0 < sum(product["shares"].values()) <= 1.0 + 1e-5  # the rest is [CLS] on itself
        assert [name for name, _ in product["columns"]] == ["size", "shade", "weight"]


@pytest.mark.slow
def test_the_benchmark_writes_every_variant_over_seeds_and_refuses_bad_images(tmp_path):
    """benchmarks/multimodal.py on a small catalogue for one epoch: the JSON contract (every
    variant's acc and macro-F1 as mean/std/seeds, train seconds), the chart, and a missing
    picture as one line, exit 2, nothing written."""
    products = write_products(tmp_path / "fashion", n=40)
    (products / "schema.yaml").rename(tmp_path / "schema.yaml")
    out = tmp_path / "multimodal.json"
    command = [PYTHON, ROOT / "benchmarks" / "multimodal.py", "--data", products, "--target", "usage",
               "--schema", tmp_path / "schema.yaml", "--minutes", "0.5", "--epochs", "1", "--seeds", "0,1",
               "--image-size", "8", "--min-class-rows", "2", "--set", "model.patch_size=4", "--out", out]
    result = run(command, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    scores = json.loads(out.read_text())
    for variant in ("image", "text", "table", "joint", "late_fusion"):
        for metric in ("acc", "f1"):
            entry = scores[f"{variant}_{metric}"]
            assert len(entry["seeds"]) == 2 and all(0 <= s <= 1 for s in entry["seeds"])
            assert entry["mean"] == pytest.approx(np.mean(entry["seeds"]), abs=1e-4)
            assert entry["std"] == pytest.approx(np.std(entry["seeds"]), abs=1e-4)
        assert len(scores[f"{variant}_train_seconds"]) == 2
    assert scores["data"]["target"] == "usage" and scores["data"]["rows"] == 40
    assert out.with_suffix(".png").is_file()

    (products / "images" / "3.png").unlink()
    out.unlink()
    result = run(command)
    assert result.returncode == 2 and not out.exists()
    assert result.stderr.strip().startswith("error: ") and "3.png" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_data_orders_the_modalities_as_the_model_does():
    """The `present` mask's columns (data/multimodal.py) in the order of the model's type embeddings."""
    from transformer_lab.data import multimodal as data

    assert data.MODALITIES == MODALITIES
