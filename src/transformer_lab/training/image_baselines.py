"""Two non-transformer baselines for the prepared images, on the Vision Transformer's split.

    logistic_regression  scikit-learn's LogisticRegression on the standardised pixels
    small_cnn            two 3x3 conv layers (32, 64) + max-pool + a 128-unit layer, Adam 1e-3,
                         its best-validation epoch scored on test

Both train on the same images as ImageDataModule with the same train_fraction and subset seed
(data.images.read_training_split), so a learning curve puts them beside the ViT point by point;
validation and test are always the whole splits. Each returns {test_acc, val_acc, params, seconds}.
"""

from __future__ import annotations

import time
from pathlib import Path

from transformer_lab.data.images import ImageDataModule, read_split, read_training_split


def logistic_regression(prepared_dir: str | Path, seed: int = 0, train_fraction: float = 1.0,
                        subset_seed: int = 0) -> dict:
    """subset_seed: the training subset's seed (ImageDataModule's train_subset_seed, data.seed by default);
    seed goes to the solver, whose default (lbfgs) is deterministic anyway."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    x_train, y_train = read_training_split(prepared_dir, train_fraction, subset_seed)
    (x_val, y_val), (x_test, y_test) = (read_split(prepared_dir, split) for split in ("validation", "test"))

    def flat(images):
        return images.reshape(len(images), -1)

    start = time.perf_counter()
    scaler = StandardScaler().fit(flat(x_train))
    model = LogisticRegression(max_iter=2000, random_state=seed).fit(scaler.transform(flat(x_train)), y_train)
    seconds = time.perf_counter() - start
    return {"test_acc": float(model.score(scaler.transform(flat(x_test)), y_test)),
            "val_acc": float(model.score(scaler.transform(flat(x_val)), y_val)),
            "params": int(model.coef_.size + model.intercept_.size), "seconds": seconds}


def small_cnn(prepared_dir: str | Path, seed: int = 0, train_fraction: float = 1.0, subset_seed: int = 0,
              epochs: int = 30, batch_size: int = 64, evaluations: int = 30) -> dict:
    """seed: the weights' initialisation and the batch order; subset_seed: as in logistic_regression.
    evaluations: how many times, evenly spread, the validation images pick the best epoch (every
    epoch of a long run on a small subset would cost more than its training)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(seed)
    datamodule = ImageDataModule(str(prepared_dir), batch_size=batch_size, train_fraction=train_fraction,
                                 train_subset_seed=subset_seed)
    datamodule.setup()
    shape = datamodule.model_kwargs()
    channels, size = shape["in_channels"], shape["image_size"]
    model = nn.Sequential(nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * (size // 2) ** 2, 128), nn.ReLU(),
                          nn.Linear(128, len(datamodule.preprocessor.classes)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def accuracy(split: str) -> float:
        model.eval()
        with torch.no_grad():
            data = datamodule.sets[split]
            return (model(data.images).argmax(-1) == data.labels).float().mean().item()

    start = time.perf_counter()
    best_val, best_test = -1.0, 0.0
    every = max(1, -(-epochs // evaluations))
    for epoch in range(epochs):
        model.train()
        for batch in datamodule.train_dataloader():
            loss = F.cross_entropy(model(batch["images"]), batch["labels"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if (epoch + 1) % every and epoch + 1 < epochs:
            continue
        val = accuracy("validation")
        if val > best_val:
            best_val, best_test = val, accuracy("test")
    return {"test_acc": best_test, "val_acc": best_val, "params": sum(p.numel() for p in model.parameters()),
            "seconds": time.perf_counter() - start}
