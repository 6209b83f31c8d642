"""Rows with a picture, a text and table columns, for the multimodal transformer: preparation and
the LightningDataModule.

A schema (YAML, `conf/schemas/*.yaml`; the tabular schema's format plus `image` and `text`):

    name: fashion
    target: usage
    image: image_path            # a column of image paths, relative to the CSV's folder
    text: productDisplayName
    categorical: [gender, baseColour, season]
    continuous: [year]
    missing_values: ["NA"]

A target column is never also an input. An empty image or text cell is a modality missing from
that row (masked in the model, not zero-filled); an image path that does not exist or does not
decode is one error naming the file and the row. The table part is read by the tabular code, so a
repeated column name or a number that is not finite is refused there, at preparation and in rows
handed to a trained model.

Sources (`data.source`):
  builtin  a generated task over scikit-learn's shipped 8x8 digits (offline; see `builtin_rows`):
           the class is three facts, one seen only in the image, one only in the text and one only
           in the table, so no single modality can reach more than a third of the way
  local    a CSV + image folder + schema (e.g. ../shared/data/fashion/data.csv)
  hub      a Hugging Face data set with an image column (e.g. ashraq/fashion-product-images-small)

`prepare` writes into output_dir: `images.npz` (uint8 (rows, C, S, S), resized once), `table.parquet`
(the parsed rows: split, line, label, text, the table columns, which modalities each row has),
`tokenizer.json` (WordPiece, trained on the training texts), `encoder.json` (the table encoder,
fitted on the training rows), `stats.json` (per-channel image mean and std of the training
images), `schema.json`, `summary.json`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset

from transformer_lab.data.checks import require_file, require_two_classes
from transformer_lab.data.preprocessing import Preprocessor
from transformer_lab.data.tabular import (
    LABEL,
    LINE,
    SPLIT,
    TableSchema,
    TabularEncoder,
    missing_as_none,
    read_local_frame,
    read_schema_fields,
    read_table,
    split_rows,
)
from transformer_lab.data.tokenizers import train_tokenizer
from transformer_lab.errors import DataError
from transformer_lab.utils.io import atomic_directory, atomic_write_json

TEXT, HAS_IMAGE, HAS_TEXT = "_text", "_has_image", "_has_text"  # bookkeeping columns of the prepared table
SPLITS = ("train", "validation", "test")

# The columns of the `present` mask, in the order of models/multimodal.py's type embeddings
# (tests/test_multimodal.py checks the two agree).
MODALITIES = ("image", "text", "table")


@dataclass
class MultimodalSchema:
    name: str
    target: str
    image: str | None = None
    text: str | None = None
    categorical: list[str] = field(default_factory=list)
    continuous: list[str] = field(default_factory=list)
    missing_values: list[str] = field(default_factory=lambda: ["NA"])

    @classmethod
    def load(cls, path: str | Path) -> MultimodalSchema:
        path = Path(path)
        raw = read_schema_fields(path, cls, "name, target, image, text, categorical, continuous")
        schema = cls(**raw)
        inputs = [c for c in (schema.image, schema.text) if c] + schema.categorical + schema.continuous
        if schema.target in inputs:
            raise DataError(f"{path}: the target {schema.target!r} is also an input column; a model would read "
                            "its answer")
        repeated = sorted({c for c in inputs if inputs.count(c) > 1})
        if repeated:
            raise DataError(f"{path}: column {repeated[0]!r} is listed more than once")
        if not inputs:
            raise DataError(f"{path}: no input columns (image, text, categorical and continuous are all empty)")
        return schema

    def table(self) -> TableSchema:
        return TableSchema(self.name, self.target, list(self.categorical), list(self.continuous),
                           list(self.missing_values))


# --- builtin: a generated task over scikit-learn's digits -------------------------------------

COLOURS = {"red": ["red", "crimson", "scarlet", "ruby"], "blue": ["blue", "navy", "azure", "cobalt"]}
FILLERS = ["a", "soft", "plain", "classic", "small", "bright", "cotton", "new", "simple", "printed"]


def builtin_rows(seed: int = 0, missing_text: float = 0.05) -> tuple[pd.DataFrame, np.ndarray]:
    """1,797 rows, one per scikit-learn digit, and their 8x8 images (uint8 (rows, 1, 8, 8)).

    The class joins three facts: whether the digit in the image is 5 or more (`high`/`low`, only
    in the image), a colour named in the text by one of four words (`red`/`blue`, only in the
    text, among filler words), and the size (`small`/`large`, only in the table: the categorical
    `size` cell, wrong in 10 % of rows, and the continuous `weight`, centred on -1 or +1 with
    standard deviation 1). Eight classes; one modality alone tells at most one fact (about a
    quarter right), all three together nearly all. 5 % of the rows have no text."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)[:, None]
    n = len(images)
    colour = rng.choice(list(COLOURS), n)
    size = rng.choice(["small", "large"], n)
    texts = []
    for c in colour:
        words = list(rng.choice(FILLERS, 3)) + [rng.choice(COLOURS[c])]
        rng.shuffle(words)
        texts.append(" ".join(words) + " item")
    texts = np.where(rng.random(n) < missing_text, "", np.array(texts, dtype=object))
    flipped = rng.random(n) < 0.10
    size_cell = np.where(flipped, np.where(size == "small", "large", "small"), size)
    weight = np.where(size == "large", 1.0, -1.0) + rng.normal(0, 1, n)
    height = np.where(digits.target >= 5, "high", "low")
    frame = pd.DataFrame({
        "id": np.arange(n).astype(str), "image": [f"digit_{i}" for i in range(n)], "text": texts,
        "size": size_cell, "shade": rng.choice(["light", "dark", "mid"], n),  # shade: noise, no signal
        "weight": np.round(weight, 3).astype(str),
        "label": [f"{h}/{c}/{s}" for h, c, s in zip(height, colour, size)],
    })
    return frame, images


BUILTIN_SCHEMA = MultimodalSchema("digits_products", "label", image="image", text="text",
                                  categorical=["size", "shade"], continuous=["weight"])


# --- reading a local or hub table with its images ---------------------------------------------

def _clean(values: pd.Series, missing: set[str]) -> pd.Series:
    text = values.astype(object).map(lambda v: "" if v is None or v != v else str(v).strip())
    return text.where(~text.isin(missing), "")


def fit_image(image, image_size: int, channels: int) -> np.ndarray:
    """A PIL image -> uint8 (C, S, S): grey or RGB, centre-cropped to a square, resized once."""
    from PIL import Image, ImageOps

    image = ImageOps.fit(image.convert("L" if channels == 1 else "RGB"), (image_size, image_size),
                         Image.Resampling.BILINEAR)
    array = np.asarray(image, dtype=np.uint8)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def load_image(path: Path, image_size: int, channels: int, where: str) -> np.ndarray:
    """One image file -> fit_image's array; a missing or undecodable file is one DataError at `where`."""
    from PIL import Image, UnidentifiedImageError

    if path.is_dir():
        raise DataError(f"{where}: image {path} is a directory, expected an image file")
    if not path.is_file():
        raise DataError(f"{where}: image {path} not found")
    try:
        with Image.open(path) as image:
            return fit_image(image, image_size, channels)
    except (UnidentifiedImageError, OSError, SyntaxError) as err:
        raise DataError(f"{where}: image {path} is unreadable ({err})") from None


def read_rows(source: str, schema: MultimodalSchema, frame: pd.DataFrame,
              drop_unlabelled: bool = False) -> tuple[pd.DataFrame, int]:
    """A table's cells (`frame`, all strings; `source` names it in errors), the table part parsed by
    the tabular code (line numbers, missing cells, numbers checked),
    with the target (LABEL), the text (TEXT) and the image cell beside it; and how many rows
    without a target were dropped (drop_unlabelled; else such a row is an error)."""
    wanted = [schema.target, *(c for c in (schema.image, schema.text) if c)]
    absent = [c for c in wanted if c not in frame.columns]
    if absent:
        raise DataError(f"{source}: column {absent[0]!r} named in the schema is not in the file "
                        f"(columns: {', '.join(map(str, frame.columns))})")
    rows = read_table(source, schema.table(), frame, labelled=False)
    missing = set(schema.missing_values) | {""}
    target = _clean(frame[schema.target], missing)
    unlabelled = (target == "").to_numpy()
    if unlabelled.any() and not drop_unlabelled:
        line = int(rows[LINE].to_numpy()[np.flatnonzero(unlabelled)[0]])
        raise DataError(f"{source}:{line}: target column {schema.target!r} is empty "
                        "(drop unlabelled rows, or prepare with data.drop_unlabelled=true)")
    rows[LABEL] = target.to_numpy()
    rows[TEXT] = _clean(frame[schema.text], missing).to_numpy() if schema.text else ""
    rows["_image"] = _clean(frame[schema.image], missing).to_numpy() if schema.image else ""
    return rows[~unlabelled].reset_index(drop=True), int(unlabelled.sum())


def prepare(source: str, output_dir: str, schema: str | None = None, local_path: str | None = None,
            image_root: str | None = None, hub_id: str | None = None, hub_split: str = "train",
            image_size: int = 32, channels: int = 3, vocab_size: int = 2000, max_text_len: int = 16,
            min_class_rows: int = 2, drop_unlabelled: bool = False, max_rows: int | None = None,
            validation_fraction: float = 0.15, test_fraction: float = 0.15, seed: int = 0,
            text_tokenizer: str | None = None) -> dict:
    """The `prepare_multimodal` stage (see the module docstring). min_class_rows: classes with fewer
    rows are dropped (and counted in the summary); drop_unlabelled: rows with an empty target are
    dropped instead of being an error; max_rows: a seeded subset; text_tokenizer: None (a WordPiece
    vocabulary of vocab_size trained on the training texts) or a pre-trained model's, for word
    embeddings started from it (task.pretrained): minilm, a Hugging Face folder, hf:NAME, or a
    tokenizer.json (e.g. the one `pretrain_bert` was trained with)."""
    from tqdm.auto import tqdm

    dropped_unlabelled = 0
    if source == "builtin":
        frame, builtin_images = builtin_rows(seed)
        table_schema, origin = BUILTIN_SCHEMA, "builtin (generated over scikit-learn's digits)"
        rows, _ = read_rows(origin, table_schema, frame)
        image_of = {name: builtin_images[i] for i, name in enumerate(frame["image"])}
        channels, image_size = 1, 8
    elif source in ("local", "hub"):
        if not schema:
            raise DataError(f"data.source={source} needs data.schema=FILE.yaml")
        table_schema = MultimodalSchema.load(schema)
        if source == "local":
            if not local_path:
                raise DataError("data.source=local needs data.local_path=FILE.csv (and data.schema=FILE.yaml)")
            require_file(local_path, "a CSV file", setting="data.local_path")
            origin = str(local_path)
            frame = read_local_frame(local_path)
            root = Path(image_root) if image_root else Path(local_path).parent
            image_of = None
        else:
            from transformer_lab.data.hub import load_hub_dataset

            dataset = load_hub_dataset(hub_id, local_hint="data.local_path=FILE.csv data.schema=FILE.yaml")[hub_split]
            origin = f"hf:{hub_id}"
            image_column = table_schema.image
            hub_images = dataset[image_column] if image_column else []
            frame = dataset.remove_columns([image_column] if image_column else []).to_pandas().astype(str)
            if image_column:
                frame[image_column] = [f"{origin}[{i}]" for i in range(len(frame))]
            image_of = {f"{origin}[{i}]": image for i, image in enumerate(hub_images)}
            root = None
        rows, dropped_unlabelled = read_rows(origin, table_schema, frame, drop_unlabelled)
    else:
        raise DataError(f"data.source={source!r}; expected builtin, local or hub")

    counts = rows[LABEL].value_counts()
    require_two_classes(origin, f"target column {table_schema.target!r}", counts.index)
    rare = sorted(counts[counts < max(min_class_rows, 2)].index)
    rows = rows[~rows[LABEL].isin(rare)].reset_index(drop=True)
    if max_rows and len(rows) > max_rows:
        rows = rows.iloc[np.sort(np.random.default_rng(seed).permutation(len(rows))[:max_rows])].reset_index(drop=True)
    classes = sorted(set(rows[LABEL]))
    if len(classes) < 2:
        raise DataError(f"{origin}: fewer than two classes with {max(min_class_rows, 2)}+ rows each "
                        f"(counts: {counts.to_dict()})")

    images = np.zeros((len(rows), channels, image_size, image_size), dtype=np.uint8)
    has_image = (rows["_image"] != "").to_numpy()
    for i in tqdm(np.flatnonzero(has_image), desc="images", unit="img", disable=len(rows) < 2000):
        cell, where = rows["_image"].iat[i], f"{origin}:{rows[LINE].iat[i]}"
        if source == "builtin":
            images[i] = image_of[cell]
        elif source == "hub":
            images[i] = fit_image(image_of[cell], image_size, channels)
        else:
            images[i] = load_image(root / cell, image_size, channels, where)
    rows[HAS_IMAGE] = has_image
    rows[HAS_TEXT] = (rows[TEXT] != "").to_numpy()
    rows = rows.drop(columns="_image")

    rows[SPLIT], _ = split_rows(rows[LABEL].to_numpy(), validation_fraction, test_fraction, seed)
    train = rows[rows[SPLIT] == "train"]
    encoder = TabularEncoder.fit(train, table_schema.table(), classes)
    encoder.features(rows, origin)  # a value the training rows' statistics cannot encode names its line
    texts = [t for t in train[TEXT] if t]
    tokenizer = pretrained_tokenizer(text_tokenizer) if text_tokenizer else \
        train_tokenizer("wordpiece", texts or ["[UNK]"], vocab_size, lowercase=True)
    train_images = images[(rows[SPLIT] == "train").to_numpy() & has_image].astype(np.float64) / 255
    stats = {"mean": train_images.mean(axis=(0, 2, 3)).tolist() if len(train_images) else [0.0] * channels,
             "std": (train_images.std(axis=(0, 2, 3)) + 1e-6).tolist() if len(train_images) else [1.0] * channels}
    summary = {
        "source": origin, "rows": len(rows), "classes": classes,
        "class_counts": {name: int((rows[LABEL] == name).sum()) for name in classes},
        "splits": {name: int((rows[SPLIT] == name).sum()) for name in SPLITS},
        "dropped_rare_classes": {str(name): int(counts[name]) for name in rare},
        "dropped_unlabelled": dropped_unlabelled,
        "rows_without_image": int((~rows[HAS_IMAGE]).sum()), "rows_without_text": int((~rows[HAS_TEXT]).sum()),
        "image_shape": [channels, image_size, image_size], "vocab_size": tokenizer.get_vocab_size(),
        "text_tokenizer": text_tokenizer or "wordpiece (trained on the training texts)",
        "text": table_schema.text, "image": table_schema.image,
        "categorical": table_schema.categorical, "continuous": table_schema.continuous,
    }
    with atomic_directory(output_dir) as tmp:
        np.savez_compressed(tmp / "images.npz", images=images)
        rows.to_parquet(tmp / "table.parquet", index=False)
        (tmp / "tokenizer.json").write_text(tokenizer.to_str())
        atomic_write_json(tmp / "encoder.json", encoder.to_dict())
        atomic_write_json(tmp / "stats.json", stats)
        atomic_write_json(tmp / "schema.json", asdict(table_schema))
        atomic_write_json(tmp / "summary.json", summary)
        (tmp / "settings.json").write_text(json.dumps({"max_text_len": max_text_len}) + "\n")
    return summary


def pretrained_tokenizer(source: str) -> Tokenizer:
    """A pre-trained model's tokenizer (published.py's sources) or a tokenizer.json file."""
    from transformer_lab.data import published

    if source.endswith(".json"):
        require_file(source, "a tokenizer.json", "tokenizer file not found", setting="data.text_tokenizer")
        return Tokenizer.from_file(source)
    if not published.is_published(source):
        raise DataError(f"data.text_tokenizer={source}: expected minilm, a Hugging Face folder, hf:NAME or a "
                        "tokenizer.json")
    return published.resolve(source).tokenizer()


# --- encoding ------------------------------------------------------------------------------------

@dataclass(eq=False)
class MultimodalPreprocessor(Preprocessor):
    """Raw rows (a picture, a text, table cells) -> the model's inputs. State: the schema, the
    table encoder, the tokenizer (JSON), the image statistics and sizes, the text length."""

    schema: dict
    encoder: dict
    tokenizer: Tokenizer
    mean: list[float]
    std: list[float]
    image_size: int
    max_text_len: int

    @classmethod
    def from_prepared(cls, prepared_dir: str | Path) -> MultimodalPreprocessor:
        directory = Path(prepared_dir)
        for name in ("schema.json", "encoder.json", "tokenizer.json", "stats.json", "settings.json", "summary.json"):
            if not (directory / name).is_file():
                raise DataError(f"{directory / name}: not found; run `dvc repro prepare_multimodal`")
        stats = json.loads((directory / "stats.json").read_text())
        summary = json.loads((directory / "summary.json").read_text())
        return cls(json.loads((directory / "schema.json").read_text()),
                   json.loads((directory / "encoder.json").read_text()),
                   Tokenizer.from_file(str(directory / "tokenizer.json")), stats["mean"], stats["std"],
                   summary["image_shape"][1], json.loads((directory / "settings.json").read_text())["max_text_len"])

    @property
    def labels(self) -> list[str]:
        return self.encoder["classes"]

    @property
    def table_encoder(self) -> TabularEncoder:
        return TabularEncoder.from_dict(self.encoder)

    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        """(rows, max_text_len) word-piece ids, 0-padded, truncated."""
        ids = torch.zeros(len(texts), self.max_text_len, dtype=torch.long)
        for row, encoding in enumerate(self.tokenizer.encode_batch([t or "" for t in texts],
                                                                   add_special_tokens=False)):
            piece = encoding.ids[: self.max_text_len]
            ids[row, : len(piece)] = torch.tensor(piece, dtype=torch.long)
        return ids

    def encode_images(self, images: np.ndarray) -> torch.Tensor:
        images = torch.as_tensor(images)
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != len(self.mean):
            raise DataError(f"images of {images.dtype} {tuple(images.shape)}; expected uint8 (rows, "
                            f"{len(self.mean)}, {self.image_size}, {self.image_size})")
        images = images.float().div_(255)
        return (images - torch.tensor(self.mean)[:, None, None]) / torch.tensor(self.std)[:, None, None]

    def encode_rows(self, rows: pd.DataFrame, images: np.ndarray) -> dict[str, torch.Tensor]:
        """Parsed rows (read_rows' columns, HAS_IMAGE and HAS_TEXT) and their uint8 images -> inputs."""
        categorical, continuous = self.table_encoder.features(rows)
        present = torch.ones(len(rows), len(MODALITIES), dtype=torch.bool)
        present[:, MODALITIES.index("image")] = torch.tensor(rows[HAS_IMAGE].to_numpy(dtype=bool))
        present[:, MODALITIES.index("text")] = torch.tensor(rows[HAS_TEXT].to_numpy(dtype=bool))
        return {"images": self.encode_images(images), "input_ids": self.encode_texts(list(rows[TEXT])),
                "categorical": torch.from_numpy(categorical), "continuous": torch.from_numpy(continuous),
                "present": present}

    def batch(self, rows: list[dict], images: np.ndarray | None = None) -> dict[str, torch.Tensor]:
        """Raw rows (dicts with the schema's text and table columns, cells as in the CSV) and their
        images (uint8 (rows, C, S, S), or None: no pictures) -> model inputs."""
        schema = MultimodalSchema(**self.schema)
        frame = pd.DataFrame(list(rows))
        parsed = read_table("rows", schema.table(), frame, labelled=False, in_file=False)
        missing = set(schema.missing_values) | {""}
        parsed[TEXT] = _clean(frame[schema.text], missing).to_numpy() \
            if schema.text and schema.text in frame else ""
        parsed[HAS_TEXT] = (parsed[TEXT] != "").to_numpy()
        parsed[HAS_IMAGE] = images is not None
        if images is None:
            images = np.zeros((len(frame), len(self.mean), self.image_size, self.image_size), dtype=np.uint8)
        return self.encode_rows(parsed, images)


def read_prepared(prepared_dir: str | Path) -> tuple[pd.DataFrame, np.ndarray]:
    directory = Path(prepared_dir)
    if not (directory / "table.parquet").is_file():
        raise DataError(f"{directory}: no prepared rows; run `dvc repro prepare_multimodal` "
                        "or `python pipelines/prepare.py data=multimodal`")
    rows = missing_as_none(pd.read_parquet(directory / "table.parquet"),
                           json.loads((directory / "schema.json").read_text())["categorical"])
    with np.load(directory / "images.npz") as data:
        return rows, data["images"]


class MultimodalRows(Dataset):
    def __init__(self, inputs: dict[str, torch.Tensor], labels: torch.Tensor):
        self.inputs, self.labels = inputs, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {**{name: tensor[i] for name, tensor in self.inputs.items()}, "labels": self.labels[i]}


class MultimodalDataModule(L.LightningDataModule):
    preprocessor: MultimodalPreprocessor

    def __init__(self, prepared_dir: str, batch_size: int = 64, eval_batch_size: int = 256, num_workers: int = 0,
                 max_examples: int | None = None):
        """max_examples: rows kept per split (None = all; debug=smoke)."""
        super().__init__()
        self.prepared_dir = Path(prepared_dir)
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.max_examples = max_examples
        self.preprocessor = MultimodalPreprocessor.from_prepared(self.prepared_dir)
        self.sets: dict[str, MultimodalRows] = {}

    def model_kwargs(self) -> dict:
        encoder = self.preprocessor.table_encoder
        return {"image_size": self.preprocessor.image_size, "in_channels": len(self.preprocessor.mean),
                "vocab_size": self.preprocessor.tokenizer.get_vocab_size(), "pad_id": 0,
                "max_text_len": self.preprocessor.max_text_len, "cardinalities": encoder.cardinalities,
                "n_continuous": encoder.n_continuous, "n_classes": len(encoder.classes)}

    def split_rows(self, split: str, prepared: tuple[pd.DataFrame, np.ndarray] | None = None
                   ) -> tuple[pd.DataFrame, np.ndarray]:
        """The prepared rows of one split and their images (what the evaluation also reads);
        prepared: read_prepared's rows and images, if already read."""
        rows, images = prepared if prepared is not None else read_prepared(self.prepared_dir)
        keep = (rows[SPLIT] == split).to_numpy()
        rows, images = rows[keep].reset_index(drop=True), images[keep]
        return rows[: self.max_examples], images[: self.max_examples]

    def setup(self, stage: str | None = None) -> None:
        if self.sets:
            return
        lookup = {name: i for i, name in enumerate(self.preprocessor.labels)}
        prepared = read_prepared(self.prepared_dir)  # once for the three splits
        for split in SPLITS:
            rows, images = self.split_rows(split, prepared)
            labels = torch.tensor([lookup[v] for v in rows[LABEL]], dtype=torch.long)
            self.sets[split] = MultimodalRows(self.preprocessor.encode_rows(rows, images), labels)

    def _loader(self, split: str, training: bool) -> DataLoader:
        return DataLoader(self.sets[split], self.batch_size if training else self.eval_batch_size,
                          shuffle=training, num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation", False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", False)
