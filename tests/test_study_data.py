"""The data of the ablation studies: the synthetic order task in ATIS's format, MNIST's IDX files,
a training fraction of the images, and the image baselines on it."""

import gzip
import struct

import numpy as np
import pytest
import torch
from conftest import SHARED_DATA
from hydra.utils import instantiate

from transformer_lab.data.atis import AtisDataModule, load_atis
from transformer_lab.data.images import (
    ImageDataModule,
    mnist_idx_images,
    prepare,
    read_idx,
    read_split,
    read_training_split,
    stratified_subset,
)
from transformer_lab.data.synthetic_order import (
    FIRST_HIGHER,
    FIRST_NOT_HIGHER,
    generate_order_sample,
    order_example,
    order_tags,
)
from transformer_lab.errors import DataError
from transformer_lab.runtime.config import compose_config

SMALL = {"n_train": 40, "n_dev": 10, "n_test": 10, "min_length": 3, "max_length": 9, "test_length": 12}
MNIST = SHARED_DATA / "mnist"


# ------------------------------------------------------------------ the synthetic order task
def numbers(words: list[str]) -> list[int]:
    return [int(word.removeprefix("w")) for word in words]


def test_order_tags_and_intent_on_a_hand_example():
    example = order_example([3, 5, 5, 1, 9])
    assert example == {"words": ["w3", "w5", "w5", "w1", "w9"], "slots": ["O", "B-up", "B-same", "B-down", "B-up"],
                       "intent": FIRST_NOT_HIGHER}
    assert order_example([9, 2, 4])["intent"] == FIRST_HIGHER
    assert order_example([4, 7, 4])["intent"] == FIRST_NOT_HIGHER  # equal is not higher


def test_generator_is_deterministic_per_seed_and_its_splits_independent():
    first, again = generate_order_sample(seed=3, **SMALL), generate_order_sample(seed=3, **SMALL)
    assert first == again
    assert generate_order_sample(seed=4, **SMALL)["train"] != first["train"]
    more_train = generate_order_sample(seed=3, **{**SMALL, "n_train": 80})
    # a learning curve over n_train keeps the dev and test utterances
    assert more_train["dev"] == first["dev"] and more_train["test"] == first["test"]
    assert more_train["train"][:40] == first["train"]


def test_lengths_vocabulary_and_labels_of_generated_utterances():
    splits = generate_order_sample(seed=0, vocab_size=5, **SMALL)
    assert {split: len(examples) for split, examples in splits.items()} == {"train": 40, "dev": 10, "test": 10}
    for split in ("train", "dev"):
        lengths = [len(e["words"]) for e in splits[split]]
        assert min(lengths) >= 3 and max(lengths) <= 9
    assert {len(e["words"]) for e in splits["test"]} == {12}
    assert len({len(e["words"]) for e in splits["train"]}) > 3  # lengths vary over the range
    names = {"1": "B-up", "-1": "B-down", "0": "B-same"}
    for example in (e for examples in splits.values() for e in examples):
        values = numbers(example["words"])
        assert set(values) <= set(range(5))
        # the tags, recomputed here from the signs of successive differences
        assert example["slots"] == ["O"] + [names[str(int(s))] for s in np.sign(np.diff(values))]
        assert example["intent"] == (FIRST_HIGHER if values[0] > values[-1] else FIRST_NOT_HIGHER)
    assert {e["intent"] for e in splits["train"]} == {FIRST_HIGHER, FIRST_NOT_HIGHER}


def test_labels_are_not_a_function_of_the_bag_of_words():
    """What a position-free (permutation-equivariant) encoder would need and cannot have: reordering
    the same words must permute the tags with them, and leave the intent as it is. Here it does not."""
    values = [1, 2, 3]
    tags = order_tags(values)
    for permutation in ([2, 1, 0], [1, 0, 2], [0, 2, 1]):
        reordered = [values[i] for i in permutation]
        assert sorted(reordered) == sorted(values)
        assert order_tags(reordered) != [tags[i] for i in permutation]
    assert order_example([1, 2, 3])["intent"] != order_example([3, 2, 1])["intent"]
    # and within the generated data: one word, in one bag of words, tagged differently by position
    example = generate_order_sample(seed=0, **SMALL)["train"][0]
    reversed_example = order_example(numbers(example["words"])[::-1])
    assert reversed_example["slots"] != example["slots"][::-1]


def test_bad_generator_settings_are_one_clear_error():
    with pytest.raises(DataError, match=r"lengths \[9, 3\]"):
        generate_order_sample(min_length=9, max_length=3)
    with pytest.raises(DataError, match="not one of builtin, local, hub, synthetic_order"):
        load_atis("synthetic")


def test_order_synthetic_config_prepares_into_its_own_folder_and_the_atis_datamodule_reads_it(tmp_path):
    sizes = [f"data.synthetic_order.{key}={value}" for key, value in SMALL.items()]
    cfg = compose_config("prepare", ["data=order_synthetic", f"data.prepared_dir={tmp_path / 'order'}", *sizes],
                         tmp_path)
    default = compose_config("prepare", ["data=order_synthetic"], tmp_path)
    assert default.data.prepared_dir.endswith("data/prepared/order-synthetic")
    assert default.data.source == "synthetic_order"
    assert (default.data.synthetic_order.min_length, default.data.synthetic_order.max_length,
            default.data.synthetic_order.test_length) == (8, 64, 128)
    summary = instantiate(cfg.data.prepare, _convert_="all")
    assert summary["train"]["utterances"] == 40 and summary["test"]["words"] == 10 * 12
    assert summary["n_slots"] == 5  # UNK, O, B-down, B-same, B-up
    datamodule = instantiate(cfg.data.datamodule)
    datamodule.setup()
    assert isinstance(datamodule, AtisDataModule) and datamodule.word_dropout == 0
    batch = next(iter(datamodule.test_dataloader()))
    assert batch["input_ids"].shape[1] == 12 + 1  # [CLS] + test_length words: what model.max_len must cover
    labels = datamodule.preprocessor.slot_labels
    gold = generate_order_sample(seed=0, **SMALL)["test"][0]["slots"]
    assert [labels[i] for i in batch["slot_labels"][0].tolist()] == gold


# ------------------------------------------------------------------ MNIST's IDX files
def write_idx(path, array: np.ndarray, type_byte: int = 0x08, compress: bool = True) -> None:
    values = array.astype(array.dtype.newbyteorder(">")).tobytes()  # IDX values are big-endian
    raw = bytes([0, 0, type_byte, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + values
    path.write_bytes(gzip.compress(raw) if compress else raw)


def tiny_mnist(directory, n: int = 40, compress: bool = True):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 5, 4), dtype=np.uint8)
    labels = (np.arange(n) % 10).astype(np.uint8)
    suffix = ".gz" if compress else ""
    directory.mkdir(parents=True, exist_ok=True)
    write_idx(directory / f"t10k-images-idx3-ubyte{suffix}", images, compress=compress)
    write_idx(directory / f"t10k-labels-idx1-ubyte{suffix}", labels, compress=compress)
    return images, labels


@pytest.mark.parametrize("compress", [True, False])
def test_idx_reader_reads_a_file_written_here(tmp_path, compress):
    images, labels = tiny_mnist(tmp_path, compress=compress)
    read_images, read_labels, classes = mnist_idx_images(tmp_path)
    assert read_images.shape == (40, 1, 5, 4) and read_images.dtype == np.uint8
    assert np.array_equal(read_images[:, 0], images) and np.array_equal(read_labels, labels)
    assert classes == [str(d) for d in range(10)]
    wide = np.arange(6, dtype=np.int32).reshape(2, 3) * 1000
    write_idx(tmp_path / "ints.idx", wide, type_byte=0x0C, compress=False)
    assert np.array_equal(read_idx(tmp_path / "ints.idx"), wide) and read_idx(tmp_path / "ints.idx").dtype == np.int32


def test_idx_reader_names_the_file_it_cannot_read(tmp_path):
    tiny_mnist(tmp_path)
    labels = tmp_path / "t10k-labels-idx1-ubyte.gz"
    labels.write_bytes(gzip.compress(gzip.decompress(labels.read_bytes())[:-3]))  # three labels short
    with pytest.raises(DataError, match=rf"^{labels}: 45 bytes, but an IDX file of shape \(40,\)"):
        mnist_idx_images(tmp_path)
    labels.write_bytes(b"PK\x03\x04 not idx")
    with pytest.raises(DataError, match=rf"^{labels}: not an IDX file"):
        mnist_idx_images(tmp_path)
    labels.unlink()
    with pytest.raises(DataError, match=rf"^{labels}: IDX file not found$"):
        prepare("mnist_idx", str(tmp_path / "out"), local_dir=str(tmp_path))
    with pytest.raises(DataError, match="data.local_dir must be set"):
        prepare("mnist_idx", str(tmp_path / "out"))


def test_mnist_idx_source_splits_like_the_builtin_digits(tmp_path):
    tiny_mnist(tmp_path / "idx", n=200)
    summary = prepare("mnist_idx", str(tmp_path / "out"), local_dir=str(tmp_path / "idx"), seed=0)
    assert summary == {"source": "mnist_idx", "classes": 10, "image_shape": [1, 5, 4], "train_images": 140,
                       "validation_images": 30, "test_images": 30}
    for split in ("validation", "test"):
        assert set(np.bincount(read_split(tmp_path / "out", split)[1])) == {3}  # 15% of every class's 20


@pytest.mark.skipif(not MNIST.is_dir(), reason="no ../shared/data/mnist")
def test_real_mnist_test_set(tmp_path):
    images, labels, _ = mnist_idx_images(MNIST)
    assert images.shape == (10_000, 1, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    cfg = compose_config("prepare", ["data=images_mnist", f"data.prepared_dir={tmp_path / 'mnist'}",
                                     "data.max_images=1000"], tmp_path)
    assert cfg.data.source == "mnist_idx"
    summary = instantiate(cfg.data.prepare, _convert_="all")
    assert summary["image_shape"] == [1, 28, 28] and sum(summary[f"{s}_images"] for s in
                                                         ("train", "validation", "test")) == 1000


# ------------------------------------------------------------------ a training fraction
@pytest.fixture(scope="module")
def prepared_digits(tmp_path_factory):
    out = tmp_path_factory.mktemp("images") / "digits"
    prepare("builtin", str(out), seed=0)
    return out


def test_stratified_subset_keeps_every_class_in_proportion_and_nests():
    labels = np.repeat(np.arange(4), [10, 20, 30, 40])
    tenth = stratified_subset(labels, 0.1, seed=0)
    assert np.bincount(labels[tenth]).tolist() == [1, 2, 3, 4]
    assert np.array_equal(tenth, stratified_subset(labels, 0.1, seed=0))
    assert not np.array_equal(tenth, stratified_subset(labels, 0.1, seed=1))
    half = stratified_subset(labels, 0.5, seed=0)
    assert set(tenth) <= set(half) and len(half) == 50  # a smaller fraction is part of a larger one
    assert len(stratified_subset(labels, 1.0, seed=0)) == 100
    assert np.bincount(labels[stratified_subset(labels, 0.01, seed=0)]).tolist() == [1, 1, 1, 1]  # at least one
    with pytest.raises(DataError, match="must be in"):
        stratified_subset(labels, 0.0, seed=0)


def test_train_fraction_subsets_only_the_training_split(prepared_digits):
    whole = ImageDataModule(str(prepared_digits))
    whole.setup()
    part = ImageDataModule(str(prepared_digits), train_fraction=0.2, train_subset_seed=5)
    part.setup()
    train_labels = whole.sets["train"].labels.numpy()
    assert len(part.sets["train"]) == sum(round(0.2 * n) for n in np.bincount(train_labels))
    expected = np.bincount(train_labels) * 0.2
    assert np.abs(np.bincount(part.sets["train"].labels.numpy()) - expected).max() <= 0.5  # stratified
    for split in ("validation", "test"):
        assert torch.equal(part.sets[split].images, whole.sets[split].images)
        assert torch.equal(part.sets[split].labels, whole.sets[split].labels)
    again = ImageDataModule(str(prepared_digits), train_fraction=0.2, train_subset_seed=5)
    again.setup()
    assert torch.equal(again.sets["train"].images, part.sets["train"].images)
    other = ImageDataModule(str(prepared_digits), train_fraction=0.2, train_subset_seed=6)
    other.setup()
    assert not torch.equal(other.sets["train"].labels, part.sets["train"].labels) or \
        not torch.equal(other.sets["train"].images, part.sets["train"].images)
    # the training images are rows of the whole training split
    images, _ = read_training_split(prepared_digits, 0.2, 5)
    full, _ = read_split(prepared_digits, "train")
    assert {row.tobytes() for row in images} <= {row.tobytes() for row in full}
    with pytest.raises(DataError, match="train_fraction=1.5"):
        ImageDataModule(str(prepared_digits), train_fraction=1.5)


def test_images_config_carries_train_fraction(tmp_path):
    cfg = compose_config("train", ["experiment=vit/digits", "data.datamodule.train_fraction=0.3"], tmp_path)
    assert cfg.data.datamodule.train_fraction == 0.3 and cfg.data.datamodule.train_subset_seed == cfg.data.seed


# ------------------------------------------------------------------ the image baselines
def test_baselines_train_on_the_datamodules_subset(prepared_digits):
    from transformer_lab.training.image_baselines import logistic_regression, small_cnn

    logreg = logistic_regression(prepared_digits, seed=0, train_fraction=0.3)
    assert set(logreg) == {"test_acc", "val_acc", "params", "seconds"}
    assert logreg["params"] == 64 * 10 + 10 and logreg["test_acc"] > 0.8  # 8x8 pixels, 10 classes
    cnn = small_cnn(prepared_digits, seed=0, train_fraction=0.1, epochs=2)
    assert set(cnn) == set(logreg) and 0 <= cnn["val_acc"] <= 1 and cnn["seconds"] > 0
    assert cnn["params"] == (1 * 32 * 9 + 32) + (32 * 64 * 9 + 64) + (64 * 16 * 128 + 128) + (128 * 10 + 10)
    assert small_cnn(prepared_digits, seed=0, train_fraction=0.1, epochs=2)["test_acc"] == cnn["test_acc"]
    # fewer training images, worse test accuracy: the fraction reaches the model
    assert logistic_regression(prepared_digits, seed=0, train_fraction=0.02)["test_acc"] < logreg["test_acc"]
