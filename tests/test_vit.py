import json

import numpy as np
import pytest
import torch
from conftest import PYTHON, ROOT, run

from transformer_lab.data.images import ImageDataModule, prepare, read_split
from transformer_lab.errors import DataError
from transformer_lab.models.vit import PatchEmbedding, VisionTransformer, ViTConfig, shifted_window_mask
from transformer_lab.runtime.config import compose_config


def tiny_vit(**overrides) -> VisionTransformer:
    torch.manual_seed(0)
    settings = {"image_size": 8, "in_channels": 1, "n_classes": 10, "n_layers": 2, "d_model": 32, "n_heads": 4,
                "dropout": 0.0}
    return VisionTransformer(ViTConfig(**{**settings, **overrides})).eval()


# ------------------------------------------------------------------ model
@pytest.mark.parametrize("image, patch", [(8, 2), (8, 4), (32, 4), (224, 16)])
def test_patch_count_is_hw_over_p_squared(image, patch):
    embedding = PatchEmbedding(patch, 3, 16)
    tokens = embedding(torch.randn(2, 3, image, image))
    assert tokens.shape == (2, image * image // patch**2, 16)
    assert ViTConfig(image_size=image, patch_size=patch).n_patches == image * image // patch**2


def test_patch_embedding_equals_a_strided_convolution():
    embedding = PatchEmbedding(4, 3, 24)
    images = torch.randn(5, 3, 16, 16)
    conv = embedding.as_convolution()
    expected = conv(images).flatten(2).transpose(1, 2)  # (batch, patches in row-major order, d)
    torch.testing.assert_close(embedding(images), expected, atol=1e-5, rtol=0)
    # the first patch is the top-left P x P block, flattened channel by channel
    torch.testing.assert_close(embedding.patches(images)[:, 0], images[:, :, :4, :4].reshape(5, -1))


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_position_embeddings_are_what_tells_shuffled_patches_apart(pool):
    model = tiny_vit(pool=pool)
    images = torch.randn(2, 1, 8, 8)
    # swap two patches: rows 0-1/cols 0-1 with rows 6-7/cols 6-7
    shuffled = images.clone()
    shuffled[..., :2, :2], shuffled[..., 6:, 6:] = images[..., 6:, 6:], images[..., :2, :2]
    with torch.no_grad():
        assert not torch.allclose(model(images).logits, model(shuffled).logits, atol=1e-4)
        model.position.zero_()  # without positions the patches are a set
        torch.testing.assert_close(model(images).logits, model(shuffled).logits, atol=1e-5, rtol=0)


def test_cls_attention_weights_cover_the_patches():
    model = tiny_vit()
    out = model(torch.randn(3, 1, 8, 8), return_weights=True)
    logits, weights = out.logits, out.attentions
    assert logits.shape == (3, 10) and len(weights) == 2 and weights[-1].shape == (3, 4, 17, 17)
    torch.testing.assert_close(weights[-1].sum(-1), torch.ones(3, 4, 17))


def test_named_sizes():
    base = ViTConfig(size="vit-base/16", image_size=224, in_channels=3, n_classes=1000)
    assert (base.n_layers, base.d_model, base.n_heads, base.patch_size, base.n_patches) == (12, 768, 12, 16, 196)
    with pytest.raises(ValueError, match="multiple of patch_size"):
        ViTConfig(image_size=10, patch_size=4)


def _window_outputs(model: VisionTransformer, images: torch.Tensor, shifted: bool) -> torch.Tensor:
    """Token map after the first window block (shifted=False) or after the first two."""
    grid = model.config.image_size // model.config.patch_size
    x = (model.patch_embedding(images) + model.position).view(len(images), grid, grid, -1)
    blocks = model.blocks[0][:2] if shifted else model.blocks[0][:1]
    with torch.no_grad():
        for block in blocks:
            x, _ = block(x)
    return x


def test_window_attention_stays_inside_its_window():
    model = tiny_vit(image_size=16, attention="window", window_size=4, stage_depths=[2])
    images = torch.randn(1, 1, 16, 16)
    changed = images.clone()
    changed[..., 2:4, 2:4] += 3.0  # patch (1, 1): in the top-left 4x4 window of the 8x8 patch grid
    moved = (_window_outputs(model, images, False) - _window_outputs(model, changed, False)).abs().amax(-1)[0]
    inside = torch.zeros(8, 8, dtype=torch.bool)
    inside[:4, :4] = True
    assert (moved[inside] > 1e-4).all() and (moved[~inside] == 0).all()
    # after the shifted block the change reaches the shifted window around it, and no further
    moved = (_window_outputs(model, images, True) - _window_outputs(model, changed, True)).abs().amax(-1)[0]
    reached = moved > 0
    assert reached[:6, :6].any() and not reached[6:, :].any() and not reached[:, 6:].any()


def test_shifted_windows_keep_wrapped_regions_apart():
    mask = shifted_window_mask(grid=4, window=2, shift=1)
    assert mask.shape == (4, 4, 4) and mask[0].all()  # the first window holds one region
    assert mask[3].equal(torch.eye(4, dtype=torch.bool))  # the corner window: four regions, none may mix
    assert shifted_window_mask(4, 2, 0).all()


def test_swin_variant_merges_patches_and_trains():
    model = tiny_vit(attention="window", window_size=2, stage_depths=[2, 2]).train()
    logits = model(torch.randn(4, 1, 8, 8)).logits
    assert logits.shape == (4, 10)
    logits.sum().backward()
    assert model.merges[0].reduction.weight.grad is not None
    assert model.blocks[1][0].block.attn.n_heads == 8  # heads double with the width


# ------------------------------------------------------------------ data
@pytest.fixture(scope="module")
def prepared_digits(tmp_path_factory):
    out = tmp_path_factory.mktemp("images") / "digits"
    prepare("builtin", str(out), seed=0)
    return out


def test_builtin_digits_split_is_stratified_and_stats_come_from_train(prepared_digits):
    summary = json.loads((prepared_digits / "summary.json").read_text())
    assert summary["train_images"] + summary["validation_images"] + summary["test_images"] == 1797
    images, labels = read_split(prepared_digits, "test")
    assert images.shape[1:] == (1, 8, 8) and images.dtype == np.uint8
    assert set(np.bincount(labels, minlength=10)) <= {26, 27, 28}  # ~15% of each class's ~180
    train, _ = read_split(prepared_digits, "train")
    stats = json.loads((prepared_digits / "stats.json").read_text())
    assert stats["mean"][0] == pytest.approx(train.mean() / 255)
    again = prepare("builtin", str(prepared_digits.parent / "again"), seed=0)
    assert np.array_equal(read_split(prepared_digits.parent / "again", "test")[1], labels) and again == summary


def test_augmentation_only_on_training_images(prepared_digits):
    dm = ImageDataModule(str(prepared_digits), crop_padding=1)
    dm.setup()
    assert dm.model_kwargs() == {"image_size": 8, "in_channels": 1, "n_classes": 10}
    assert dm.sets["train"].crop_padding == 1 and dm.sets["test"].crop_padding == 0
    torch.manual_seed(0)
    crops = torch.stack([dm.sets["train"][0]["images"] for _ in range(20)])
    assert crops.shape == (20, 1, 8, 8) and len({c.sum().item() for c in crops}) > 1


def _png(path, size=(8, 8), value=0):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("L", size, color=value).save(path)


def test_local_image_folder_and_its_errors(tmp_path, capfd, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")  # listed afresh, not from a cache
    for label in ("cat", "dog"):
        for i in range(10):
            _png(tmp_path / "folder" / label / f"{i}.png", value=i * 20 + (label == "dog") * 5)
    summary = prepare("local", str(tmp_path / "out"), local_dir=str(tmp_path / "folder"))
    assert "examples/s" not in capfd.readouterr().err  # a local folder is listed, no progress bars of a download
    assert summary["classes"] == 2 and summary["image_shape"] == [1, 8, 8]
    assert json.loads((tmp_path / "out" / "classes.json").read_text()) == ["cat", "dog"]

    (tmp_path / "folder" / "dog" / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(DataError, match=r"broken\.png: unreadable image"):
        prepare("local", str(tmp_path / "out"), local_dir=str(tmp_path / "folder"))
    assert (tmp_path / "out" / "summary.json").is_file()  # the earlier output is untouched
    (tmp_path / "folder" / "dog" / "broken.png").unlink()
    _png(tmp_path / "folder" / "dog" / "big.png", size=(9, 9))
    with pytest.raises(DataError, match=r"big\.png: image of shape \(1, 9, 9\)"):
        prepare("local", str(tmp_path / "out"), local_dir=str(tmp_path / "folder"))


def test_hub_images_offline_is_a_clear_error(offline_hub, tmp_path):
    with pytest.raises(DataError, match="could not load 'uoft-cs/cifar10'"):
        prepare("hub", str(tmp_path / "out"), hub_id="uoft-cs/cifar10")


@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_bad_image_folder_is_one_line_and_exit_2(tmp_path):
    result = run([PYTHON, ROOT / "pipelines" / "prepare.py", "data=images", "data.source=local",
                  f"data.local_dir={tmp_path}/missing", f"data.prepared_dir={tmp_path}/out",
                  f"hydra.run.dir={tmp_path}/run"])
    assert result.returncode == 2, result.stderr
    # checked before torch loads, as every local input of prepare.py is
    assert result.stderr.strip().splitlines() == [f"error: {tmp_path}/missing: not found "
                                                  "(data.local_dir, read with data.source=local)"]


# ------------------------------------------------------------------ training and evaluation
@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_tiny_vit_trains_and_evaluates_with_figures(prepared_digits, tmp_path):
    from transformer_lab.evaluation.vit import evaluate as evaluate_vit
    from transformer_lab.training.train import train

    overrides = ["experiment=vit/digits", "logger=none", f"data.prepared_dir={prepared_digits}", "trainer.max_epochs=8",
                 "model.n_layers=1", "model.d_model=32", "callbacks.rich_progress_bar=null",
                 "data.datamodule.crop_padding=0"]
    metrics = train(compose_config("train", overrides, tmp_path / "train"))
    assert metrics["test/acc"] > 0.3  # three times the 0.1 of a guess, after eight short epochs
    cfg = compose_config("evaluate", ["evaluate=vit", "logger=none", f"train_dir={tmp_path}/train",
                                      f"data.prepared_dir={prepared_digits}"], tmp_path / "eval")
    scores = evaluate_vit(cfg)
    assert scores["test/acc"] == pytest.approx(metrics["test/acc"], abs=1e-6)
    for name in ("metrics.json", "confusion.csv", "confusion.png", "misclassified.png", "attention.png"):
        assert (tmp_path / "eval" / name).is_file(), name
    header = (tmp_path / "eval" / "confusion.csv").read_text().splitlines()[0]
    assert header == "actual,predicted"
