"""Figures people would rather look at than read: training curves, confusion, per-slot F1."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return path


def training_curves(history_csv: str | Path, out_png: str | Path) -> Path | None:
    path = Path(history_csv)
    if not path.is_file():
        return None
    rows = list(csv.DictReader(path.open()))
    if not rows:
        return None
    epochs = [int(r["epoch"]) for r in rows]
    series = {name: [float(r[name]) if r.get(name) not in (None, "", "nan") else float("nan") for r in rows]
              for name in rows[0]}
    losses = [name for name in series if name.endswith("loss")]
    scores = [name for name in series if name.startswith("val/") and not name.endswith("loss")]
    # A second panel only for validation scores (ATIS has them; word2vec has a held-out loss only).
    fig, axes = plt.subplots(1, 2 if scores else 1, figsize=(10 if scores else 5.5, 3.8), squeeze=False)
    for ax, names, title, ylabel in zip(axes[0], (losses, scores), ("loss", "validation"), ("loss", "score")):
        for name in names:
            ax.plot(epochs, series[name], marker="o", label=name)
        ax.set(xlabel="epoch", ylabel=ylabel, title=title)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, out_png)


def confusion_matrix(rows: list[dict], out_png: str | Path, title: str = "intent confusion") -> Path:
    labels = sorted({r["actual"] for r in rows} | {r["predicted"] for r in rows})
    index = {label: i for i, label in enumerate(labels)}
    counts = [[0] * len(labels) for _ in labels]
    for r in rows:
        counts[index[r["actual"]]][index[r["predicted"]]] += 1
    size = max(4, 0.35 * len(labels) + 2)
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow([[min(c, 50) for c in row] for row in counts], cmap="Blues")  # clip so rare confusions show
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    for i, row in enumerate(counts):
        for j, c in enumerate(row):
            if c:
                ax.text(j, i, str(c), ha="center", va="center", fontsize=6, color="black" if c < 30 else "white")
    ax.set(xlabel="predicted", ylabel="actual", title=title)
    return _save(fig, out_png)


def per_label_bars(rows: list[dict], key: str, value: str, out_png: str | Path, title: str) -> Path:
    rows = sorted(rows, key=lambda r: r[value])
    fig, ax = plt.subplots(figsize=(7, max(3, 0.18 * len(rows) + 1)))
    ax.barh([r[key] for r in rows], [r[value] for r in rows], color="tab:blue")
    ax.set(xlabel=value, xlim=(0, 1), title=title)
    ax.tick_params(axis="y", labelsize=6)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, out_png)


def word_map(rows: list[dict], out_png: str | Path, labelled: int = 80, title: str = "word vectors, PCA") -> Path:
    """2-D projection of word vectors; the most frequent `labelled` words are named."""
    fig, ax = plt.subplots(figsize=(9, 7))
    ax.scatter([r["x"] for r in rows], [r["y"] for r in rows], s=6, alpha=0.4, color="tab:blue")
    for r in rows[:labelled]:
        ax.annotate(r["word"], (r["x"], r["y"]), fontsize=7, alpha=0.8)
    ax.set(title=title, xlabel="PC 1", ylabel="PC 2")
    return _save(fig, out_png)


def image_grid(images, captions: list[str], out_png: str | Path, title: str, columns: int = 8) -> Path:
    """Images (N, C, H, W) uint8 in a grid, each with its caption (e.g. "7 → 1")."""
    rows = max(1, -(-len(images) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(1.3 * columns, 1.5 * rows + 0.4), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, image, caption in zip(axes.flat, images, captions):
        ax.imshow(image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0), cmap="gray_r" if image.shape[0] == 1
                  else None, interpolation="nearest")
        ax.set_title(caption, fontsize=8)
    if not len(images):
        axes.flat[0].text(0.5, 0.5, "none", ha="center", va="center")
    fig.suptitle(title)
    return _save(fig, out_png)


def attention_maps(images, maps, captions: list[str], out_png: str | Path, title: str) -> Path:
    """Each image beside its attention map (a (grid, grid) array per image, shown at image size)."""
    fig, axes = plt.subplots(2, len(images), figsize=(1.6 * len(images), 3.4), squeeze=False)
    for column, (image, weights, caption) in enumerate(zip(images, maps, captions)):
        shown = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)
        axes[0, column].imshow(shown, cmap="gray_r" if image.shape[0] == 1 else None, interpolation="nearest")
        axes[0, column].set_title(caption, fontsize=8)
        height, width = shown.shape[:2]
        axes[1, column].imshow(weights, cmap="magma", extent=(0, width, height, 0), interpolation="nearest")
        for ax in axes[:, column]:
            ax.axis("off")
    fig.suptitle(title, fontsize=9)
    return _save(fig, out_png)


def cross_attention_heads(weights, source_tokens: list[str], target_tokens: list[str], out_png: str | Path,
                          title: str) -> Path:
    """One panel per head: a (target, source) attention matrix, target tokens down, source across."""
    heads = len(weights)
    columns = min(heads, 4)
    rows = -(-heads // columns)
    width = max(2.2, 0.28 * len(source_tokens) + 1.0)
    height = max(2.0, 0.26 * len(target_tokens) + 0.8)
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False)
    for index, ax in enumerate(axes.flat):
        if index >= heads:
            ax.axis("off")
            continue
        ax.imshow(weights[index], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        ax.set_xticks(range(len(source_tokens)), source_tokens, rotation=90, fontsize=6)
        ax.set_yticks(range(len(target_tokens)), target_tokens if index % columns == 0 else [], fontsize=6)
        ax.set_title(f"head {index}", fontsize=8)
    fig.suptitle(title, fontsize=9, y=1.02)
    return _save(fig, out_png)


def model_comparison(rows: list[dict], metrics: list[str], out_png: str | Path, title: str,
                     name_key: str = "model") -> Path:
    """Grouped bars: one group per model (row[name_key]), one bar per metric, each labelled with its value."""
    fig, ax = plt.subplots(figsize=(1.8 * len(rows) + 2, 3.8))
    width = 0.8 / len(metrics)
    for m, metric in enumerate(metrics):
        positions = [i + (m - (len(metrics) - 1) / 2) * width for i in range(len(rows))]
        bars = ax.bar(positions, [r[metric] for r in rows], width, label=metric)
        ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=1)
    ax.set_xticks(range(len(rows)), [r[name_key] for r in rows])
    lowest = min(r[metric] for r in rows for metric in metrics)
    ax.set(ylim=(max(0.0, lowest - 0.1), 1.02), ylabel="score", title=title)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, out_png)


def modality_attention(products: list[dict], out_png: str | Path, title: str) -> Path:
    """One row per product: its picture under the [CLS] attention over its patches, then the
    attention on each word piece and on each table column, with each modality's share of the
    whole. products: {"caption", "image" (C, H, W) uint8 or None, "patches" (grid, grid) or None,
    "words" [(piece, weight)], "columns" [(name, weight)], "shares" {modality: weight}}."""
    fig, axes = plt.subplots(len(products), 3, figsize=(11, 2.3 * len(products) + 0.4), squeeze=False,
                             gridspec_kw={"width_ratios": [1, 2.2, 1.6]})
    top = max([w for p in products for _, w in p["words"] + p["columns"]] +
              [float(p["patches"].max()) for p in products if p["patches"] is not None] + [1e-9])
    for row, product in enumerate(products):
        image_ax, word_ax, column_ax = axes[row]
        shares = ", ".join(f"{m} {s:.0%}" for m, s in product["shares"].items())
        image_ax.set_title(f"{product['caption']}\n{shares}", fontsize=7, loc="left")
        image_ax.axis("off")
        if product["image"] is not None:
            image = product["image"]
            shown = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)
            height, width = shown.shape[:2]
            image_ax.imshow(shown, cmap="gray_r" if image.shape[0] == 1 else None, interpolation="nearest")
            if product["patches"] is not None:
                image_ax.imshow(product["patches"], cmap="magma", alpha=0.55, vmin=0, vmax=top,
                                extent=(0, width, height, 0), interpolation="nearest")
        for ax, pairs, what in ((word_ax, product["words"], "word pieces"), (column_ax, product["columns"], "columns")):
            if pairs:
                ax.bar(range(len(pairs)), [w for _, w in pairs], color="tab:purple" if what == "columns" else "tab:blue")
                ax.set_xticks(range(len(pairs)), [name for name, _ in pairs], rotation=60, ha="right", fontsize=7)
                ax.set_ylim(0, top * 1.05)
            else:
                ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", fontsize=8)
                ax.set_xticks([])
            ax.tick_params(axis="y", labelsize=6)
            if row == 0:
                ax.set_title(f"[CLS] attention on {what}", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, out_png)


def sweep_trials(rows: list[dict], swept: list[str], metric: str, out_png: str | Path, best: dict | None = None) -> Path:
    """A sweep at a glance: the metric against each swept setting, one panel per setting, a point per
    trial, the best trial ringed. Numbers on a numeric axis (logarithmic when they span over 20x,
    as learning rates do); anything else as categories in the order first seen."""
    panels = swept or ["trial"]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels) + 0.6, 3.2), squeeze=False, sharey=True)
    for ax, setting in zip(axes[0], panels):
        scored = [r for r in rows if r.get(metric) is not None]
        values = [r.get(setting, str(i)) if setting != "trial" else str(i) for i, r in enumerate(scored)]
        numbers = [_number(v) for v in values]
        if all(n is not None for n in numbers):
            xs = numbers
            if min(numbers) > 0 and max(numbers) / min(numbers) > 20:
                ax.set_xscale("log")
        else:
            categories = list(dict.fromkeys(values))
            xs = [categories.index(v) for v in values]
            ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right", fontsize=8)
        ax.scatter(xs, [r[metric] for r in scored], s=28, alpha=0.8)
        if best is not None and best in scored:
            i = scored.index(best)
            ax.scatter([xs[i]], [best[metric]], s=160, facecolors="none", edgecolors="crimson", linewidths=1.6,
                       label="best")
            ax.legend(fontsize=8)
        ax.set_xlabel(setting)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(metric)
    fig.suptitle(f"{len(rows)} trials", fontsize=10)
    return _save(fig, out_png)


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
