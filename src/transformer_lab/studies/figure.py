"""A study's figure: the score of every variant over its seeds, and, where the study declares them
(`study.figure`), validation curves against steps and seconds, the probes, and an analytic panel."""

from __future__ import annotations

import statistics
from pathlib import Path

from hydra.utils import get_method
from omegaconf import DictConfig

from transformer_lab.utils.plots import _save, plt

CLAIMED, OTHER = "#1f77b4", "#9a9a9a"


def study_figure(summary: dict, jobs: list[dict], study: DictConfig, out_png: str | Path) -> Path:
    spec = study.get("figure") or {}
    panels = [scores_panel]
    # curves and per-block probes of the variants the claim compares (every variant's would not read)
    focus = list(spec.get("focus") or ([study.claimed, *study.against] if study.get("against") else summary["variants"]))
    curves = spec.get("curves")
    if curves and any(job["curve"] for job in jobs):
        panels += [lambda ax, s, j, _: curve_panel(ax, s, j, curves, "step", focus),
                   lambda ax, s, j, _: curve_panel(ax, s, j, curves, "seconds", focus)]
    for probe in spec.get("probes") or []:
        panels.append(lambda ax, s, j, _, probe=probe: probe_panel(ax, s, probe, focus))
    for x_key in spec.get("scatter") or []:  # the score against each variant's parameters or seconds
        panels.append(lambda ax, s, j, _, x_key=x_key: scatter_panel(ax, s, x_key))
    for metric in spec.get("metrics") or []:  # another metric the runs logged, per variant
        panels.append(lambda ax, s, j, _, metric=metric: metric_panel(ax, s, metric))
    if spec.get("extra"):
        panels.append(lambda ax, s, j, _: get_method(spec.extra)(ax))
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.9 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        panel(ax, summary, jobs, study)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(f"{study.name}: {summary['verdict']}\n{wrapped(summary['claim'])}", fontsize=10)
    fig.tight_layout()
    return _save(fig, out_png)


def wrapped(text: str, width: int = 110) -> str:
    words, lines, line = text.split(), [], ""
    for word in words:
        if len(line) + len(word) + 1 > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\n".join([*lines, line])


def scores_panel(ax, summary: dict, jobs: list[dict], study: DictConfig) -> None:
    """Lines per group against x where the variants declare them (heads x blocks, depth, data size),
    else a bar per variant; every seed a dot."""
    variants = summary["variants"]
    if all("group" in v and "x" in v for v in variants.values()):
        groups: dict[str, list[tuple]] = {}
        for name, v in variants.items():
            groups.setdefault(str(v["group"]), []).append((v["x"], v))
        for group, points in groups.items():
            points.sort(key=lambda p: p[0])
            xs = [p[0] for p in points]
            means = [p[1]["mean"] if p[1]["mean"] is not None else float("nan") for p in points]
            stds = [p[1]["std"] for p in points]
            line, = ax.plot(xs, means, marker="o", label=group)
            ax.fill_between(xs, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)],
                            color=line.get_color(), alpha=0.2)
            for x, v in points:
                ax.scatter([x] * len(v["seeds"]), [s if s is not None else float("nan") for s in v["seeds"]],
                           color=line.get_color(), s=8, alpha=0.6)
        ax.set_xlabel(study.get("figure", {}).get("x_label") or "x")
        ax.legend(fontsize=7)
    else:
        names = list(variants)
        for i, name in enumerate(names):
            v = variants[name]
            colour = CLAIMED if name == summary.get("claimed") else OTHER
            if v["mean"] is not None:
                ax.bar(i, v["mean"], yerr=v["std"], color=colour, alpha=0.8, capsize=3)
            seeds = [s for s in v["seeds"] if s is not None]
            ax.scatter([i] * len(seeds), seeds, color="black", s=10, zorder=3)
            if v["diverged"]:
                ax.annotate(f"{v['diverged']} diverged", (i, 0), ha="center", fontsize=7, color="red")
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        finite = [s for v in variants.values() for s in v["seeds"] if s is not None]
        if finite:
            low, high = min(finite), max(finite)
            pad = (high - low) * 0.3 or abs(high) * 0.05 or 0.05
            ax.set_ylim(low - pad, high + pad)
    ax.set_ylabel(summary["metric"])
    ax.set_title("score over seeds (mean ± std, each seed a dot)", fontsize=9)
    ax.grid(alpha=0.3)


def curve_panel(ax, summary: dict, jobs: list[dict], metric: str, x_key: str, focus: list[str]) -> None:
    """The validation metric against steps or seconds, the mean over seeds of each variant in focus."""
    for name in (n for n in summary["variants"] if n in focus):
        curves = [job["curve"] for job in jobs if job["variant"] == name and job["curve"]]
        if not curves:
            continue
        length = min(len(c) for c in curves)
        xs = [statistics.fmean(c[i][x_key] for c in curves) for i in range(length)]
        ys = []
        for i in range(length):
            values = [c[i].get(metric) for c in curves if c[i].get(metric) is not None]
            ys.append(statistics.fmean(values) if values else float("nan"))
        ax.plot(xs, ys, marker=".", label=name, linewidth=1.8 if name == summary.get("claimed") else 1.1)
    ax.set_xlabel(x_key)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} against {x_key} (mean over seeds)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def probe_panel(ax, summary: dict, probe: str, focus: list[str]) -> None:
    """One probe per variant; `init/grad_norm_block_*` as a line over the blocks, per variant in focus."""
    variants = summary["variants"]
    if probe.endswith("*"):
        prefix = probe[:-1]
        for name, v in ((n, v) for n, v in variants.items() if n in focus):
            values = [(int(k[len(prefix):]), value) for k, value in (v.get("probes") or {}).items()
                      if k.startswith(prefix)]
            if values:
                values.sort()
                ax.plot([b for b, _ in values], [value for _, value in values], marker="o", label=name)
        ax.set_yscale("log")
        ax.set_xlabel("block")
        ax.legend(fontsize=7)
    else:
        names = [name for name, v in variants.items() if probe in (v.get("probes") or {})]
        values = [variants[n]["probes"][probe] for n in names]
        if values and isinstance(values[0], list):  # a share per expert, largest first: grouped bars
            width = 0.8 / len(names)
            for i, (name, shares) in enumerate(zip(names, values)):
                ax.bar([rank + i * width for rank in range(len(shares))], shares, width, label=name)
            ax.set_xticks([rank + 0.4 - width / 2 for rank in range(len(values[0]))],
                          [f"#{rank + 1}" for rank in range(len(values[0]))])
            ax.set_xlabel("experts, busiest first")
            ax.legend(fontsize=7)
        else:
            ax.bar(range(len(names)), values, color=[CLAIMED if n == summary.get("claimed") else OTHER for n in names])
            ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    titles = {"init/grad_norm_block_*": "gradient norm of each block at initialisation",
              "expert_load": "share of the tokens each expert took (last validation batch)"}
    ax.set_title(titles.get(probe, probe), fontsize=9)
    ax.grid(alpha=0.3)


def scatter_panel(ax, summary: dict, x_key: str) -> None:
    """Each variant's mean score against its parameters, its seconds a run or another of its metrics
    (pretrain/seconds: its pre-training's), labelled."""
    for name, v in summary["variants"].items():
        x = v.get(x_key, (v.get("metrics") or {}).get(x_key))
        if v["mean"] is None or not x:
            continue
        colour = CLAIMED if name == summary.get("claimed") else OTHER
        ax.errorbar(x, v["mean"], yerr=v["std"], fmt="o", color=colour, capsize=2)
        ax.annotate(name, (x, v["mean"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel({"params": "parameters", "seconds": "seconds a run",
                   "pretrain/seconds": "seconds of pre-training"}.get(x_key, x_key))
    if x_key == "params":
        ax.xaxis.set_major_formatter(lambda value, _: f"{value / 1e3:.0f}k")
    ax.set_ylabel(summary["metric"])
    ax.set_title(f"score against {x_key}", fontsize=9)
    ax.grid(alpha=0.3)


def metric_panel(ax, summary: dict, metric: str) -> None:
    """Another metric of the same runs, a bar per variant (e.g. token accuracy beside slot F1)."""
    names = [n for n, v in summary["variants"].items() if (v.get("metrics") or {}).get(metric) is not None]
    ax.bar(range(len(names)), [summary["variants"][n]["metrics"][metric] for n in names],
           color=[CLAIMED if n == summary.get("claimed") else OTHER for n in names])
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
    ax.set_title(f"{metric} (mean over seeds)", fontsize=9)
    ax.grid(alpha=0.3)
