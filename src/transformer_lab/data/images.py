"""Images for the Vision Transformer: preparation into arrays, and the LightningDataModule.

Sources (`data.source`):
  builtin  scikit-learn's shipped handwritten digits: 1,797 grey 8x8 images, 10 classes (offline)
  hub      MNIST (ylecun/mnist) or CIFAR-10 (uoft-cs/cifar10) through `datasets`
  local    an image-folder tree, one sub-folder per class (PNG/JPEG), through `datasets`' imagefolder
  mnist_idx  MNIST's test set in its original IDX files (t10k-images-idx3-ubyte.gz and
           t10k-labels-idx1-ubyte.gz, gzipped or not) in `local_dir`: 10,000 grey 28x28 digits

`prepare` writes `<output_dir>/{train,validation,test}.npz` (images uint8 (N, C, H, W), labels),
`classes.json`, `stats.json` (per-channel mean and std of the training split, in [0, 1] units)
and `summary.json`. The split is stratified and seeded; the statistics never see validation or
test images. The datamodule's `train_fraction` trains on a seeded, stratified subset of the
training split (a learning curve), scoring on the same validation and test images.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from transformer_lab.data.checks import require_two_classes
from transformer_lab.data.hub import load_hub_dataset
from transformer_lab.data.preprocessing import Preprocessor
from transformer_lab.errors import DataError
from transformer_lab.utils.io import atomic_directory

SPLITS = ("train", "validation", "test")
HUB_COLUMNS = {"ylecun/mnist": ("image", "label"), "uoft-cs/cifar10": ("img", "label")}
MNIST_IDX_FILES = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}  # IDX type byte -> dtype


def builtin_digits() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """scikit-learn's digits as uint8 (N, 1, 8, 8): its 0..16 intensities scaled to 0..255."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)[:, None]
    return images, digits.target.astype(np.int64), [str(c) for c in digits.target_names]


def _to_array(image) -> np.ndarray:
    """A PIL image -> uint8 (C, H, W); grey stays one channel, anything else becomes RGB."""
    mode = "L" if image.mode in ("L", "1", "I;16", "I") else "RGB"
    array = np.asarray(image.convert(mode), dtype=np.uint8)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def _stack(arrays: list[np.ndarray], names: list[str]) -> np.ndarray:
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        first = arrays[0].shape
        odd = next(i for i, a in enumerate(arrays) if a.shape != first)
        raise DataError(f"{names[odd]}: image of shape {arrays[odd].shape} (C, H, W), but {names[0]} is {first}; "
                        "all images must have one size")
    return np.stack(arrays)


def local_images(directory: str | Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """An image-folder tree (`<dir>/<class>/<image>`), listed by `datasets`' imagefolder builder
    and decoded here, so that an unreadable file is reported by its path."""
    import datasets
    from PIL import Image, UnidentifiedImageError

    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: image folder not found (expected <dir>/<class>/<image>)")
    bars_were_on = datasets.utils.logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # a local folder is listed, not downloaded: no "Downloading data" bars
    try:
        listing = datasets.load_dataset("imagefolder", data_dir=str(directory), split="train")
    except Exception as err:  # noqa: BLE001 (datasets raises many unrelated types for one bad folder)
        raise DataError(f"{directory}: not an image folder ({str(err).splitlines()[0]})") from None
    finally:
        if bars_were_on:
            datasets.enable_progress_bars()
    if "label" not in listing.features:  # imagefolder labels the images only under two or more class folders
        folders = [p.name for p in directory.iterdir() if p.is_dir()]
        require_two_classes(str(directory), "the image folder", folders)
        raise DataError(f"{directory}: images without class folders (expected <dir>/<class>/<image>)")
    listing = listing.cast_column("image", datasets.Image(decode=False))
    classes = listing.features["label"].names
    arrays, labels, names = [], [], []
    for row in listing:
        path = row["image"]["path"]
        try:
            with Image.open(path) as image:
                image.load()
                arrays.append(_to_array(image))
        except (UnidentifiedImageError, OSError, SyntaxError) as err:
            raise DataError(f"{path}: unreadable image ({err})") from None
        labels.append(row["label"])
        names.append(path)
    if not arrays:
        raise DataError(f"{directory}: no images found")
    return _stack(arrays, names), np.array(labels, dtype=np.int64), classes


def hub_images(hub_id: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """MNIST or CIFAR-10 from the hub: all of its splits pooled (the split here is our own)."""
    data = load_hub_dataset(hub_id, local_hint="data.local_dir=DIR (an image folder)")
    image_key, label_key = HUB_COLUMNS.get(hub_id, ("image", "label"))
    arrays, labels = [], []
    for split in data:
        for row in data[split]:
            arrays.append(_to_array(row[image_key]))
            labels.append(row[label_key])
    first = data[next(iter(data))]
    classes = list(first.features[label_key].names)
    return _stack(arrays, [f"{hub_id}[{i}]" for i in range(len(arrays))]), np.array(labels, dtype=np.int64), classes


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX file (LeCun's MNIST format), gzipped or not: two zero bytes, a type byte, the number
    of dimensions, each dimension as a big-endian uint32, then the values in row-major order."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: IDX file not found")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":  # gzip's magic number, whatever the file is called
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise DataError(f"{path}: not a readable gzip file ({err})") from None
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] not in IDX_TYPES or raw[3] == 0:
        raise DataError(f"{path}: not an IDX file (its first 4 bytes are {raw[:4].hex() or 'missing'}, "
                        "expected 00 00 <type> <dimensions>)")
    n_dims, dtype = raw[3], np.dtype(IDX_TYPES[raw[2]])
    header = 4 + 4 * n_dims
    if len(raw) < header:
        raise DataError(f"{path}: IDX header cut short ({len(raw)} bytes for {n_dims} dimensions)")
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", n_dims, offset=4))
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if len(raw) != expected:
        raise DataError(f"{path}: {len(raw)} bytes, but an IDX file of shape {shape} ({dtype}) has {expected}")
    return np.frombuffer(raw, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _idx_file(directory: Path, name: str) -> Path:
    """`name.gz` in the directory, else `name` uncompressed."""
    gzipped = directory / f"{name}.gz"
    return gzipped if gzipped.is_file() or not (directory / name).is_file() else directory / name


def mnist_idx_images(directory: str | Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """MNIST's test set from its IDX files in `directory`: uint8 (N, 1, 28, 28), labels 0..9."""
    directory = Path(directory)
    images_path, labels_path = (_idx_file(directory, name) for name in MNIST_IDX_FILES)
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise DataError(f"{images_path}: {images.dtype} values of shape {images.shape}; "
                        "expected uint8 (N, height, width)")
    if labels.ndim != 1 or labels.dtype != np.uint8 or (len(labels) and labels.max() > 9):
        raise DataError(f"{labels_path}: expected one uint8 digit 0..9 per image, found {labels.dtype} "
                        f"of shape {labels.shape}")
    if len(images) != len(labels):
        raise DataError(f"{labels_path}: {len(labels)} labels for the {len(images)} images of {images_path}")
    return images[:, None], labels.astype(np.int64), [str(digit) for digit in range(10)]


def stratified_split(labels: np.ndarray, fractions: tuple[float, float], seed: int) -> dict[str, np.ndarray]:
    """Indices per split: within every class, shuffled with the seed, then cut by the fractions."""
    rng = np.random.default_rng(seed)
    parts = {split: [] for split in SPLITS}
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        n_val, n_test = round(fractions[0] * len(members)), round(fractions[1] * len(members))
        parts["validation"].append(members[:n_val])
        parts["test"].append(members[n_val:n_val + n_test])
        parts["train"].append(members[n_val + n_test:])
    return {split: np.sort(np.concatenate(p)) for split, p in parts.items()}


def stratified_subset(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Sorted indices of a seeded `fraction` of the examples, taken within every class (round(fraction
    * class size), at least one). Each class is shuffled by the seed alone, so a smaller fraction is a
    subset of a larger one: the points of a learning curve differ only by the images added."""
    if not 0 < fraction <= 1:
        raise DataError(f"train_fraction={fraction}: must be in (0, 1]")
    rng = np.random.default_rng(seed)
    kept = []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        kept.append(members[:max(1, round(fraction * len(members)))])
    return np.sort(np.concatenate(kept)) if kept else np.zeros(0, dtype=np.int64)


def prepare(source: str, output_dir: str, local_dir: str | None = None, hub_id: str = "ylecun/mnist",
            validation_fraction: float = 0.15, test_fraction: float = 0.15, seed: int = 0,
            max_images: int | None = None) -> dict:
    """The `prepare_images` stage (see the module docstring)."""
    if source == "builtin":
        images, labels, classes = builtin_digits()
    elif source == "local":
        images, labels, classes = local_images(local_dir or "")
    elif source == "hub":
        images, labels, classes = hub_images(hub_id)
    elif source == "mnist_idx":
        if not local_dir:
            raise DataError("data.local_dir must be set when data.source=mnist_idx (the folder of the IDX files)")
        images, labels, classes = mnist_idx_images(local_dir)
    else:
        raise DataError(f"data.source={source!r} is not one of builtin, local, hub, mnist_idx")
    if max_images:
        keep = np.sort(np.random.default_rng(seed).permutation(len(labels))[:max_images])
        images, labels = images[keep], labels[keep]
    splits = stratified_split(labels, (validation_fraction, test_fraction), seed)
    train = images[splits["train"]].astype(np.float64) / 255
    stats = {"mean": train.mean(axis=(0, 2, 3)).tolist(), "std": train.std(axis=(0, 2, 3)).tolist()}
    summary = {"source": source, "classes": len(classes), "image_shape": list(images.shape[1:]),
               **{f"{split}_images": len(index) for split, index in splits.items()}}
    with atomic_directory(output_dir) as tmp:
        for split, index in splits.items():
            np.savez_compressed(tmp / f"{split}.npz", images=images[index], labels=labels[index])
        (tmp / "classes.json").write_text(json.dumps(classes) + "\n")
        (tmp / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def read_split(prepared_dir: str | Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    path = Path(prepared_dir) / f"{split}.npz"
    if not path.is_file():
        raise DataError(f"{path}: prepared images not found; run `dvc repro prepare_images`")
    with np.load(path) as data:
        return data["images"], data["labels"]


def read_training_split(prepared_dir: str | Path, train_fraction: float = 1.0,
                        subset_seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The training split, or its seeded stratified `train_fraction` (stratified_subset)."""
    images, labels = read_split(prepared_dir, "train")
    if train_fraction == 1:
        return images, labels
    keep = stratified_subset(labels, train_fraction, subset_seed)
    return images[keep], labels[keep]


@dataclass(eq=False)
class ImagePreprocessor(Preprocessor):
    """uint8 images (N, C, H, W), 0..255 -> floats normalised by the training split's per-channel
    statistics. State: classes, mean, std (per channel, in [0, 1] units)."""

    classes: list[str]
    mean: list[float]
    std: list[float]

    @classmethod
    def from_prepared(cls, prepared_dir: str | Path) -> ImagePreprocessor:
        prepared_dir = Path(prepared_dir)
        for name in ("classes.json", "stats.json"):
            if not (prepared_dir / name).is_file():
                raise DataError(f"{prepared_dir / name}: not found; run `dvc repro prepare_images`")
        stats = json.loads((prepared_dir / "stats.json").read_text())
        return cls(json.loads((prepared_dir / "classes.json").read_text()), stats["mean"], stats["std"])

    @property
    def labels(self) -> list[str]:
        return self.classes

    def encode(self, images: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Model inputs (N, C, H, W) float of raw uint8 images (N, C, H, W) or one (C, H, W)."""
        images = torch.as_tensor(images)
        if images.dtype != torch.uint8:
            raise DataError(f"images are {images.dtype}; predict takes raw uint8 images (0..255), "
                            "as the prepared splits store them")
        images = images[None] if images.dim() == 3 else images
        if images.dim() != 4 or images.shape[1] != len(self.mean):
            raise DataError(f"images of shape {tuple(images.shape)}; expected (N, {len(self.mean)}, H, W)")
        images = images.float().div_(255)
        return (images - torch.tensor(self.mean)[:, None, None]) / torch.tensor(self.std)[:, None, None]


class ImageSet(Dataset):
    """Normalised float images (C, H, W) with optional augmentation: a random crop of the image
    padded by `crop_padding` pixels (zeros) on each side, and a random horizontal flip."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, preprocessor: ImagePreprocessor,
                 crop_padding: int = 0, horizontal_flip: bool = False):
        self.images = preprocessor.encode(images)
        self.labels = torch.from_numpy(labels)
        self.crop_padding, self.horizontal_flip = crop_padding, horizontal_flip

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        image = self.images[index]
        if self.crop_padding:
            pad = self.crop_padding
            padded = torch.nn.functional.pad(image, (pad, pad, pad, pad))
            top, left = torch.randint(0, 2 * pad + 1, (2,)).tolist()
            image = padded[:, top:top + image.shape[1], left:left + image.shape[2]]
        if self.horizontal_flip and torch.rand(()) < 0.5:
            image = image.flip(-1)
        return {"images": image, "labels": self.labels[index]}


class ImageDataModule(L.LightningDataModule):
    preprocessor: ImagePreprocessor

    def __init__(self, prepared_dir: str, batch_size: int = 64, eval_batch_size: int = 256, crop_padding: int = 0,
                 horizontal_flip: bool = False, num_workers: int = 0, max_examples: int | None = None,
                 train_fraction: float = 1.0, train_subset_seed: int = 0):
        """crop_padding: random-crop augmentation (pixels of padding, 0 = off); horizontal_flip:
        for natural images such as CIFAR-10 only (a flipped digit is another glyph). max_examples:
        images kept per split (None = all; debug=smoke). train_fraction: train on this seeded
        (train_subset_seed), stratified fraction of the training split; validation and test stay whole."""
        super().__init__()
        self.prepared_dir = Path(prepared_dir)
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.crop_padding, self.horizontal_flip, self.max_examples = crop_padding, horizontal_flip, max_examples
        if not 0 < train_fraction <= 1:
            raise DataError(f"data.datamodule.train_fraction={train_fraction}: must be in (0, 1]")
        self.train_fraction, self.train_subset_seed = train_fraction, train_subset_seed
        self.preprocessor = ImagePreprocessor.from_prepared(self.prepared_dir)
        self.sets: dict[str, ImageSet] = {}

    def image_shape(self) -> tuple[int, int, int]:
        images, _ = read_split(self.prepared_dir, "test")
        return tuple(images.shape[1:])

    def model_kwargs(self) -> dict:
        channels, height, width = self.image_shape()
        if height != width:
            raise DataError(f"{self.prepared_dir}: images are {height}x{width}; the ViT here takes square images")
        return {"image_size": height, "in_channels": channels, "n_classes": len(self.preprocessor.classes)}

    def setup(self, stage: str | None = None) -> None:
        for split in SPLITS:
            if split not in self.sets:
                images, labels = read_training_split(self.prepared_dir, self.train_fraction, self.train_subset_seed) \
                    if split == "train" else read_split(self.prepared_dir, split)
                images, labels = images[: self.max_examples], labels[: self.max_examples]
                augment = split == "train"
                self.sets[split] = ImageSet(images, labels, self.preprocessor,
                                            self.crop_padding if augment else 0, self.horizontal_flip and augment)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.sets["train"], self.batch_size, shuffle=True, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.sets["validation"], self.eval_batch_size, num_workers=self.num_workers)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.sets["test"], self.eval_batch_size, num_workers=self.num_workers)
