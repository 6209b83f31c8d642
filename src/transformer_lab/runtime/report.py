"""One report of the whole lab, from whatever has been run (`make report`): reports/index.html and
reports/README.md, the same content as a static page (inline CSS, no script, no network) and as
Markdown.

    python -m transformer_lab.runtime.report [--root .] [--out reports]

What it shows, and where each number comes from (every number is read from a file, and the file is
linked beside it):

- per model family (README's table), its headline result beside its anchor, and the machine the
  result was measured on. HEADLINES below names, per family, the benchmark result file and key of
  the headline (what README's "one result each" quotes) and of its anchors: a same-run reference in
  the same file (`transformers`, gensim, XGBoost, the model without the thing under test), or a
  published figure as the family's docs page quotes it, shown only while the page still says it.
  Files are read with benchmarks/results_table.py's own reader (its machine record checked);
- per family, this checkout's pipeline: the metrics files dvc.yaml's stages declare, read and
  grouped per family as `make results` reads them (runtime/results.py), with a link to each
  training run's MLflow run (the `mlflow_run.json` the run leaves beside its metrics);
- per study (studies/NAME/summary.json and figure.png), its claim, figure, verdict and variants;
- what has not run yet, with the command that runs it.

The MLflow links point at `make ui` (http://127.0.0.1:5000); ids are read from the project's
mlflow.db, and without one the report has no links. The page depends on the files alone (no time
of its own): running it twice writes the same bytes. The folder is written whole and atomically
(utils/io.atomic_directory), the studies' figures copied into it, so it opens from disk anywhere;
a folder at --out that is not an earlier report is refused, untouched.

Nothing imports this module: changing it reruns no stage.
"""

from __future__ import annotations

import argparse
import html
import importlib.util
import json
import logging
import math
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformer_lab.errors import TransformerLabError
from transformer_lab.families import FAMILIES
from transformer_lab.runtime.results import family_of, rows_of
from transformer_lab.utils.io import atomic_directory

PROJECT = Path(__file__).resolve().parents[3]  # benchmarks/results_table.py's checkout
UI = "http://127.0.0.1:5000"
TRAINING_PAGES = "workflowType=machine_learning"  # tracking/runs.py's MODEL_TRAINING_PAGES (not imported: Lightning)
GENERATOR = '<meta name="generator" content="transformer_lab.runtime.report">'  # how an earlier report is known
RUN_REFERENCE = "mlflow_run.json"  # tracking/runs.py's RUN_REFERENCE
STUDIES = ("attention_qkv", "attention_scale", "heads_blocks", "norm_residual", "positions", "pooling", "experts",
           "vit_data")


# --- what each family's headline is --------------------------------------------------------------

@dataclass(frozen=True)
class Figure:
    """A number in benchmarks/results/: `key` (nested keys joined by dots, as results_table.py names
    them) of `file`; a glob matching several files shows their mean."""
    label: str
    file: str
    key: str


@dataclass(frozen=True)
class Quote:
    """A published figure as the family's docs page quotes it (whitespace aside)."""
    label: str
    text: str
    page: str


@dataclass(frozen=True)
class Headline:
    title: str
    families: tuple[str, ...]   # families.py's entries it covers: whose DVC stages are its pipeline
    page: str                   # its docs page
    figures: tuple[Figure, ...]  # the headline first, then what goes with it
    anchors: tuple[Figure | Quote, ...]
    command: str                # what writes the headline's file (shown while it is absent)


R = "docs/families/"
HEADLINES: dict[str, Headline] = {
    "atis": Headline(
        "Transformer encoder (ATIS)", ("joint_intent_slot",), R + "atis.md",
        (Figure("real ATIS test slot F1, from scratch", "atis.json", "slot_f1"),
         Figure("intent accuracy", "atis.json", "intent_acc"),
         Figure("train seconds", "atis.json", "train_seconds")),
        (Quote("best non-pretrained published system (slot F1 / intent acc)", "Stack-Propagation 95.9 / 96.9",
               R + "atis.md"),),
        "python benchmarks/atis.py --data ../shared/data/atis --out benchmarks/results/atis.json --minutes 10"),
    "word2vec": Headline(
        "word2vec", ("word2vec", "glove"), R + "word2vec.md",
        (Figure("CBOW words/s, ours ÷ gensim's", "word2vec_tinyshakespeare_cbow.json", "ours_to_gensim_speed"),
         Figure("agreement of our vectors with gensim's", "word2vec_tinyshakespeare_cbow.json",
                "ours_gensim_agreement")),
        (Figure("gensim's agreement with itself under another seed", "word2vec_tinyshakespeare_cbow.json",
                "gensim_seed_agreement"),
         Figure("gensim words/s", "word2vec_tinyshakespeare_cbow.json", "gensim_words_per_s")),
        "python benchmarks/word2vec_vs_gensim.py --corpus ../shared/data/tinyshakespeare/input.txt --repeat 5 "
        "--architecture cbow --out benchmarks/results/word2vec_tinyshakespeare_cbow.json"),
    "bert": Headline(
        "BERT", ("bert_pretraining", "sequence_classification", "bert_joint_intent_slot", "token_classification",
                 "question_answering"), R + "bert.md",
        (Figure("SST-2 dev accuracy, fine-tuned from MiniLM, one epoch", "transfer_sst2_all.json",
                "summary.minilm@67349.dev_acc.mean"),),
        (Figure("hidden states' largest difference from transformers' BertModel", "hf_parity.json",
                "parity.hidden"),
         Quote("published (GLUE test)", "BERT-Mini 85.9, BERT-Small 89.7", R + "bert.md")),
        "python benchmarks/transfer.py --task sst2 --data ../shared/data/sst2 --init minilm "
        "--out benchmarks/results/transfer_sst2_all.json"),
    "gpt": Headline(
        "GPT", ("gpt_pretraining", "gpt_classification"), R + "gpt.md",
        (Figure("Tiny Shakespeare validation loss", "gpt_shakespeare_seed[0-9].json", "val_loss"),),
        (Figure("transformers' GPT-2 on the same batches", "gpt_shakespeare_seed[0-9].json", "hf_val_loss"),
         Figure("time per iteration, ours ÷ transformers'", "gpt_shakespeare_seed[0-9].json",
                "ours_to_hf_time_per_iter"),
         Quote("target (nanoGPT's CPU recipe)", "≤ 1.89", R + "gpt.md")),
        "python benchmarks/gpt_shakespeare.py --data ../shared/data/tinyshakespeare/input.txt --hf-iters 2000 "
        "--seed 0 --out benchmarks/results/gpt_shakespeare_seed0.json"),
    "elmo": Headline(
        "ELMo", ("elmo_pretraining",), R + "elmo.md",
        (Figure("CoNLL-2003 dev entity F1 of a tagger with frozen ELMo features", "elmo_taggers_conll.json",
                "summary.elmo.slot_f1.mean"),),
        (Figure("the same tagger without ELMo", "elmo_taggers_conll.json", "summary.none.slot_f1.mean"),
         Quote("published (a 93.6 M-parameter biLM, test F1)", "ELMo 92.22 test F1", R + "elmo.md")),
        "python benchmarks/elmo_taggers.py --task conll --data ../shared/data/conll2003 --epochs 3 --seeds 0,1,2 "
        "--elmo artifacts/elmo/pretrain_wikitext2/checkpoints/best.ckpt "
        "--out benchmarks/results/elmo_taggers_conll.json"),
    "translation": Headline(
        "Encoder–decoder Transformer (translation)", ("translation",), R + "translation.md",
        (Figure("Multi30k en→de test BLEU after 30 CPU minutes", "translation_multi30k.json",
                "bleu_test_2016_flickr"),),
        (Figure("MarianMTModel trained on the same batches", "translation_multi30k.json",
                "hf_bleu_test_2016_flickr"),),
        "python benchmarks/translation.py --data ../shared/data/multi30k --src en --tgt de "
        "--out benchmarks/results/translation_multi30k.json"),
    "vit": Headline(
        "Vision Transformer", ("image_classification",), R + "vit.md",
        (Figure("digits test accuracy", "vit_digits.json", "test_acc"),
         Figure("train seconds", "vit_digits.json", "train_seconds")),
        (Figure("logistic regression", "vit_digits.json", "logreg_acc"),
         Figure("a small CNN", "vit_digits.json", "cnn_acc")),
        "python benchmarks/vit_digits.py --out benchmarks/results/vit_digits.json"),
    "tabular": Headline(
        "TabTransformer / FT-Transformer", ("tabular_classification",), R + "tabular.md",
        (Figure("bank-marketing 5-fold ROC-AUC, piecewise FT-Transformer", "tabular_bank.json",
                "ft_transformer_piecewise_auc.mean"),),
        (Figure("XGBoost", "tabular_bank.json", "xgboost_auc.mean"),
         Figure("logistic regression", "tabular_bank.json", "logreg_auc.mean")),
        "python benchmarks/tabular.py --csv ../shared/data/bank/bank-full.csv --out benchmarks/results/tabular_bank.json"),
    "multimodal": Headline(
        "Multimodal transformer", ("multimodal_classification",), R + "multimodal.md",
        (Figure("fashion season test accuracy, late fusion", "multimodal_fashion_season.json", "late_fusion_acc.mean"),
         Figure("one joint sequence", "multimodal_fashion_season.json", "joint_acc.mean")),
        (Figure("text alone", "multimodal_fashion_season.json", "text_acc.mean"),
         Figure("table alone", "multimodal_fashion_season.json", "table_acc.mean"),
         Figure("image alone", "multimodal_fashion_season.json", "image_acc.mean")),
        "python benchmarks/multimodal.py --data ../shared/data/fashion --target season "
        "--out benchmarks/results/multimodal_fashion_season.json"),
}


# --- what was read ---------------------------------------------------------------------------------

@dataclass
class Shown:
    """A number (or quote) as shown, with the files (relative to the root) it was read from."""
    label: str
    value: str
    files: list[str]
    spread: str = ""  # "± std" where the file has one
    machine: str = ""  # what its file's machine record says (a quote: none)


@dataclass
class StageRow:
    label: str                # the stage, `stage: model` for a comparison file's row
    metrics: dict[str, object]
    file: str
    run_url: str | None = None
    family: str = ""          # families.py's entry whose stage wrote it


@dataclass
class Section:
    key: str
    headline: Headline | None
    figures: list[Shown] = field(default_factory=list)
    anchors: list[Shown] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # what could not be shown, and why
    rows: list[StageRow] = field(default_factory=list)

    def tables(self) -> list[tuple[str, list[StageRow], list[str]]]:
        """A table per families.py entry, as `make results` prints them: (its name, its rows, the
        columns: the two metrics it is first selected on and their test/ twins, then params)."""
        found = []
        for family in dict.fromkeys(row.family for row in self.rows):
            rows = [row for row in self.rows if row.family == family]
            names = [m.name for m in FAMILIES[family].metrics[:2]] if family in FAMILIES else []
            found.append((family, rows, columns_of(rows, names)))
        return found
    not_run: list[str] = field(default_factory=list)  # stages without metrics yet
    experiments: dict[str, str] = field(default_factory=dict)  # MLflow experiment id -> name


@dataclass
class Study:
    name: str
    summary: dict | None = None
    problem: str | None = None
    figure: str | None = None  # its copy, relative to the report
    experiment_url: str | None = None
    run_url: str | None = None


def results_table():
    """benchmarks/results_table.py (not a package): its reader, flattening and machine record."""
    path = PROJECT / "benchmarks" / "results_table.py"
    spec = importlib.util.spec_from_file_location("results_table", path)
    if spec is None or not path.is_file():
        raise TransformerLabError(f"{path}: not found; the report reads benchmark results with it")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def number(value: object, digits: int = 4) -> str:
    """A value to `digits` significant digits (no exponent from 10,000 up), integers in full."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0:
            return "0"
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.{digits}g}"
    return "–" if value is None else str(value)


def machine_text(record: dict) -> str:
    """`AMD EPYC, 2 cores, torch 2.13.0+cpu, 2026-11-30` from a result file's machine record."""
    parts = [record.get("cpu") or "CPU model not recorded"]
    accelerator = record.get("gpu") or record.get("device")
    if accelerator and accelerator != "x86_64":
        parts.append(str(accelerator))
    if record.get("cpu_count") is not None:
        parts.append(f"{record['cpu_count']} cores")
    parts += [f"torch {record['torch']}" if record.get("torch") else "", record.get("date") or ""]
    return ", ".join(p for p in parts if p)


def read_figure(root: Path, figure: Figure, table) -> Shown | str:
    """The figure as shown, or why it is not (a line). A file's own figures are shown as it records them
    (6 significant digits at most); a mean over files to 5, their SD to 2."""
    results = root / "benchmarks" / "results"
    paths = sorted(results.glob(figure.file))
    if not paths:
        return f"benchmarks/results/{figure.file} not written yet"
    values, spreads, machines = [], [], []
    for path in paths:
        try:
            result = table.load(path)
        except table.Refused as err:
            return f"{figure.label}: {err}"
        flat = table.flatten({key: value for key, value in result.items() if key != "machine"})
        if figure.key not in flat or not isinstance(flat[figure.key], (int, float)):
            return f"{figure.label}: no number `{figure.key}` in {path.relative_to(root).as_posix()}"
        values.append(flat[figure.key])
        std = flat.get(figure.key[: -len(".mean")] + ".std") if figure.key.endswith(".mean") else None
        spreads.append(std)
        text = machine_text(result["machine"])
        if text not in machines:
            machines.append(text)
    files = [path.relative_to(root).as_posix() for path in paths]
    if len(values) == 1:
        spread = f"± {number(spreads[0], 6)}" if isinstance(spreads[0], (int, float)) else ""
        return Shown(figure.label, number(values[0], 6), files, spread, machines[0])
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return Shown(f"{figure.label} (mean of {len(values)} files)", number(mean, 5), files,
                 f"± {number(std, 2)} (SD)", "; ".join(machines))


def read_quote(root: Path, quote: Quote) -> Shown | str:
    page = root / quote.page
    words = " ".join(page.read_text(encoding="utf-8").split()) if page.is_file() else ""
    if " ".join(quote.text.split()) not in words:
        return f"{quote.label}: {quote.page} no longer quotes “{quote.text}”"
    return Shown(quote.label, quote.text, [quote.page])


def read_metrics(root: Path) -> tuple[dict[str, str], dict[str, dict], str | None]:
    """(metrics file -> its stage, the workspace's metrics by file, why none could be read)."""
    from transformer_lab.runtime.results import read

    if not (root / "dvc.yaml").is_file():
        return {}, {}, "no dvc.yaml here"
    try:
        stage_of, new, _ = read(str(root), None)
    except TransformerLabError as err:
        return {}, {}, f"the DVC metrics could not be read: {err}"
    return stage_of, new, None


class Tracking:
    """MLflow's experiments and runs in the project's mlflow.db; without one, nothing (no links)."""

    def __init__(self, root: Path):
        self.client, self.problem, self.names, self.errors = None, None, {}, ()
        db = root / "mlflow.db"
        if not db.is_file():
            self.problem = "no mlflow.db here yet: the runs are linked once `make run` has tracked some"
            return
        logging.getLogger("alembic").setLevel(logging.WARNING)  # its schema check's INFO lines
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException
        from sqlalchemy.exc import SQLAlchemyError

        self.errors = (MlflowException, SQLAlchemyError, OSError)
        try:
            self.client = MlflowClient(f"sqlite:///{db.resolve()}")
            self.names = {e.experiment_id: e.name for e in self.client.search_experiments()}
        except self.errors as err:  # a store of another MLflow version, a locked or damaged file: no links
            self.client, self.problem = None, f"mlflow.db could not be read ({type(err).__name__}: {err})"

    def run(self, folder: Path) -> tuple[str, str, str] | None:
        """(experiment id, its name, the run's URL) of the run whose reference file is in `folder`."""
        reference = folder / RUN_REFERENCE
        if self.client is None or not reference.is_file():
            return None
        try:
            ids = json.loads(reference.read_text())
            run = self.client.get_run(ids["run_id"])
        except (*self.errors, ValueError, KeyError):  # a reference to a run this store does not hold: no link
            return None
        experiment = run.info.experiment_id
        return experiment, self.names.get(experiment, experiment), run_url(experiment, run.info.run_id)

    def experiment(self, name: str) -> str | None:
        ids = [i for i, n in self.names.items() if n == name]
        return ids[0] if ids else None


def experiment_url(experiment_id: str) -> str:
    return f"{UI}/#/experiments/{experiment_id}?{TRAINING_PAGES}"


def run_url(experiment_id: str, run_id: str) -> str:
    return f"{UI}/#/experiments/{experiment_id}/runs/{run_id}?{TRAINING_PAGES}"


def columns_of(rows: list[StageRow], names: list[str]) -> list[str]:
    """The families' selection metrics (families.py) and their test/ twins that any row has, then params."""
    wanted = []
    for name in names:
        wanted += [name, "test/" + name.rpartition("/")[2]]
    wanted.append("params")
    present = {key for row in rows for key in row.metrics}
    return [name for name in dict.fromkeys(wanted) if name in present]


def more(row: StageRow, columns: list[str], most: int = 4) -> str:
    """A row's other numbers (counts aside), the first `most` of them: what an evaluator alone writes."""
    rest = [(k, v) for k, v in row.metrics.items() if k not in columns and isinstance(v, float)]
    text = ", ".join(f"{k} {number(v)}" for k, v in rest[:most])
    return text + (" …" if len(rest) > most else "") if text else "–"


def sections(root: Path, tracking: Tracking) -> list[Section]:
    table = results_table()
    stage_of, metrics, problem = read_metrics(root)
    section_of = {name: key for key, headline in HEADLINES.items() for name in headline.families}
    found = [Section(key, headline) for key, headline in HEADLINES.items()]
    by_key = {section.key: section for section in found}
    for path, stage in stage_of.items():  # families.py's entries without a headline get a section each
        family = family_of(stage)
        key = section_of.get(family, family)
        if key not in by_key:
            by_key[key] = Section(key, None)
            found.append(by_key[key])
        section = by_key[key]
        if path not in metrics:
            section.not_run.append(stage)
            continue
        run = tracking.run((root / path).parent)
        for label, values in rows_of(stage, metrics[path]).items():
            section.rows.append(StageRow(label, values, path, run[2] if run else None, family))
        if run:
            section.experiments[run[0]] = run[1]
    for section in found:
        headline = section.headline
        if problem:
            section.notes.append(problem)
        if headline is None:
            section.notes.append("no headline declared for it in runtime/report.py's HEADLINES")
            continue
        for spec, into in [*((f, section.figures) for f in headline.figures),
                           *((a, section.anchors) for a in headline.anchors)]:
            shown = read_figure(root, spec, table) if isinstance(spec, Figure) \
                else read_quote(root, spec)
            (into.append if isinstance(shown, Shown) else section.notes.append)(shown)
        headline_file = f"benchmarks/results/{headline.figures[0].file} not written yet"  # the box says so
        section.notes = [n for n in dict.fromkeys(section.notes) if section.figures or n != headline_file]
    return found


def study_names(root: Path) -> list[str]:
    """The declared studies, then any other folder of studies/ with a summary, then conf/study/'s."""
    found = [p.parent.name for p in (root / "studies").glob("*/summary.json")]
    declared = [p.stem for p in (root / "conf" / "study").glob("*.yaml")]
    return list(dict.fromkeys([*STUDIES, *sorted(found), *sorted(declared)]))


def read_study(root: Path, name: str, tracking: Tracking, out: Path) -> Study:
    study, folder = Study(name), root / "studies" / name
    summary = folder / "summary.json"
    if not summary.is_file():
        return study
    try:
        data = json.loads(summary.read_text(encoding="utf-8"))
        missing = [key for key in ("claim", "metric", "variants", "verdict") if key not in data]
        if missing or not isinstance(data["variants"], dict):
            raise ValueError(f"it lacks {', '.join(missing) or 'variants as an object'}")
    except (OSError, UnicodeDecodeError, ValueError) as err:
        study.problem = f"studies/{name}/summary.json could not be read: {err}"
        return study
    study.summary = data
    if (folder / "figure.png").is_file():
        study.figure = f"studies/{name}.png"
        (out / "studies").mkdir(exist_ok=True)
        shutil.copyfile(folder / "figure.png", out / study.figure)
    mlflow = data.get("mlflow") or {}
    experiment = tracking.experiment(mlflow.get("experiment") or f"study/{name}")
    if experiment is not None:
        study.experiment_url = experiment_url(experiment)
        if mlflow.get("parent_run_id"):
            study.run_url = run_url(experiment, mlflow["parent_run_id"])
    return study


def verdict_class(verdict: str) -> str:
    word = " ".join(str(verdict).lower().split())
    return {"holds": "holds", "not shown": "not-shown", "contradicted": "contradicted"}.get(word, "unknown")


# --- the two renderings ----------------------------------------------------------------------------

CSS = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328; margin: 0;
       background: #f6f8fa; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 32px 64px; background: #fff; }
h1 { font-size: 28px; margin: 0 0 4px; } h2 { border-bottom: 1px solid #d0d7de; padding-bottom: 4px;
margin-top: 40px; } h3 { margin: 28px 0 6px; }
p.lead { color: #57606a; margin-top: 0; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 14px; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
code { font: 13px ui-monospace, SFMono-Regular, Menlo, monospace; background: #f0f2f4; padding: 1px 4px;
       border-radius: 4px; }
.headline { font-size: 18px; } .value { font-weight: 700; }
.muted, .src { color: #57606a; } .src { font-size: 13px; }
.verdict { display: inline-block; padding: 1px 10px; border-radius: 12px; font-weight: 600; color: #fff; }
.holds { background: #1a7f37; } .not-shown { background: #9a6700; } .contradicted { background: #cf222e; }
.unknown { background: #6e7781; }
.notrun { background: #fff8c5; border: 1px solid #d4a72c; border-radius: 6px; padding: 6px 12px; }
div.wide { overflow-x: auto; } td.more { min-width: 16em; } img.figure { max-width: 100%; border: 1px solid #d0d7de; }
section.study, section.family { border-top: 1px solid #eaeef2; }
"""


class Links:
    """Paths to the root's files as the report links them: relative to the report's folder."""

    def __init__(self, root: Path, out: Path):
        self.prefix = Path(os.path.relpath(root.resolve(), out.resolve())).as_posix()

    def __call__(self, path: str) -> str:
        return f"{self.prefix}/{path}"


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def md(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def pipeline_text(s: Section) -> str:
    stages = len({r.label.split(": ")[0] for r in s.rows})
    if not stages and not s.not_run:
        return "no stage of its own"
    return f"{stages} stage(s) with metrics" + (f", {len(s.not_run)} not run yet" if s.not_run else "")


def study_command(name: str) -> str:
    return f"python pipelines/study.py study={name}"


STUDY_RUNS_ALL = "dvc repro studies/dvc.yaml"


def render_html(found: list[Section], studies: list[Study], tracking: Tracking, link: Links) -> str:
    h = ['<!DOCTYPE html>', '<html lang="en"><head><meta charset="utf-8">', GENERATOR,
         '<meta name="viewport" content="width=device-width, initial-scale=1">',
         '<title>transformer-lab report</title>', f'<style>{CSS}</style></head><body><main>',
         '<h1>transformer-lab report</h1>',
         ('<p class="lead">Every model family\'s headline result beside its anchor, this checkout\'s pipeline '
          'runs, and the studies, from the files named beside each number. Written by <code>make report</code> '
          '(<code>python -m transformer_lab.runtime.report</code>); run it again after <code>make run</code>, a '
          'benchmark or a study.</p>')]

    def file_links(files: list[str]) -> str:
        shown = [f'<a href="{esc(link(f))}">{esc(Path(f).name)}</a>' for f in files[:3]]
        return ", ".join(shown) + (f" … ({len(files)} files)" if len(files) > 3 else "")

    def figure_html(shown: Shown, strong: bool, files: bool = True, machine: str = "") -> str:
        value = f'<span class="value">{esc(shown.value)}</span>' if strong else esc(shown.value)
        spread = f" {esc(shown.spread)}" if shown.spread else ""
        where = f" on {esc(shown.machine)}" if shown.machine and shown.machine != machine else ""
        source = f' <span class="src">({file_links(shown.files)}{where})</span>' if files else ""
        return f'{esc(shown.label)}: {value}{spread}{source}'

    def cell_html(shown: list[Shown], strong: bool) -> str:
        """Figures one a line, then the files they come from, each once."""
        if not shown:
            return '<span class="muted">–</span>'
        lines = "<br>".join(figure_html(f, strong and i == 0, files=False) for i, f in enumerate(shown))
        files = list(dict.fromkeys(name for f in shown for name in f.files))
        return f'{lines} <span class="src">({file_links(files)})</span>'

    # the families at a glance
    h += ['<h2 id="families">The families at a glance</h2>',
          ('<table><tr><th>family</th><th>headline</th><th>anchor</th><th>measured on</th>'
           '<th>this checkout\'s pipeline</th></tr>')]
    for s in found:
        title = s.headline.title if s.headline else s.key
        headline = cell_html(s.figures[:1], True) if s.figures else '<span class="muted">not run yet</span>'
        machine = s.figures[0].machine if s.figures else "–"
        h.append(f'<tr><td><a href="#{esc(s.key)}">{esc(title)}</a></td><td>{headline}</td>'
                 f'<td>{cell_html(s.anchors, False)}</td><td>{esc(machine)}</td><td>{esc(pipeline_text(s))}</td></tr>')
    h.append('</table>')
    h.append('<p class="muted">The headline is the figure README\'s “one result each” quotes, from a benchmark '
             'run at a size worth measuring (<code>benchmarks/</code>); the anchor is what it is measured '
             'against: an independent implementation on the same batches, a baseline in the same run, or a '
             'published figure as the family\'s page quotes it. The machine is the one the headline\'s file '
             'records. The pipeline\'s own runs (<code>make run</code>) are CPU-sized: they show the pipeline '
             'end to end, not the headline.</p>')

    for s in found:
        title = s.headline.title if s.headline else s.key
        h.append(f'<section class="family"><h2 id="{esc(s.key)}">{esc(title)}</h2>')
        if s.headline:
            h.append(f'<p class="src">page: <a href="{esc(link(s.headline.page))}">{esc(s.headline.page)}</a></p>')
        if s.figures:
            machine = s.figures[0].machine
            h.append('<p class="headline">' + "<br>".join(figure_html(f, i == 0, machine=machine)
                                                           for i, f in enumerate(s.figures)) + "</p>")
            h.append(f"<p>measured on: {esc(machine)}</p>")
            if s.anchors:
                h.append("<p><b>Against</b><br>" + "<br>".join(figure_html(a, False, machine=machine)
                                                              for a in s.anchors) + "</p>")
        elif s.headline:
            h.append(f'<p class="notrun">headline not run yet: <code>{esc(s.headline.command)}</code></p>')
        for note in s.notes:
            h.append(f'<p class="muted">{esc(note)}</p>')
        h.append("<h3>This checkout's pipeline (<code>make run</code>)</h3>")
        tables = s.tables()
        for family, rows, columns in tables:
            if len(tables) > 1:
                h.append(f'<p class="src"><code>{esc(family)}</code> (families.py)</p>')
            h.append('<div class="wide"><table><tr><th>stage</th>' + "".join(f"<th>{esc(c)}</th>" for c in columns)
                     + '<th>more</th><th>file</th><th>MLflow</th></tr>')
            for r in rows:
                cells = "".join(f'<td class="num">{esc(number(r.metrics.get(c)))}</td>' for c in columns)
                mlflow = f'<a href="{esc(r.run_url)}">run</a>' if r.run_url else "–"
                h.append(f'<tr><td>{esc(r.label)}</td>{cells}<td class="src more">{esc(more(r, columns))}</td>'
                         f'<td><a href="{esc(link(r.file))}">{esc(r.file)}</a></td><td>{mlflow}</td></tr>')
            h.append("</table></div>")
        if s.rows:
            h.append('<p class="src">Machine: not recorded by the pipeline\'s metrics files.</p>')
        if s.not_run:
            h.append('<p class="notrun">not run yet: ' + ", ".join(
                f"<code>dvc repro {esc(stage)}</code>" for stage in s.not_run) + " (or <code>make run</code>)</p>")
        elif not s.rows:
            h.append('<p class="muted">no pipeline stage of its own.</p>')
        if s.experiments:
            h.append("<p>MLflow experiments: " + ", ".join(
                f'<a href="{esc(experiment_url(i))}">{esc(n)}</a>' for i, n in s.experiments.items()) + "</p>")
        h.append("</section>")

    h.append('<h2 id="studies">Studies</h2>')
    h.append(f'<p class="muted">Each study trains variants of one model over several seeds and says whether a '
             f'claim holds. <code>{esc(STUDY_RUNS_ALL)}</code> runs them all.</p>')
    waiting = [st for st in studies if st.summary is None]
    if waiting:
        h.append('<table class="notrun-table"><tr><th>study not run yet</th><th>the command that runs it</th></tr>')
        for st in waiting:
            problem = f'<br><span class="muted">{esc(st.problem)}</span>' if st.problem else ""
            h.append(f'<tr><td id="study-{esc(st.name)}">{esc(st.name)}{problem}</td>'
                     f'<td><code>{esc(study_command(st.name))}</code></td></tr>')
        h.append("</table>")
    for st in studies:
        if st.summary is None:
            continue
        h.append(f'<section class="study"><h3 id="study-{esc(st.name)}">{esc(st.name)}</h3>')
        data = st.summary
        h.append(f'<p><b>Claim:</b> {esc(data["claim"])}</p>')
        h.append(f'<p><b>Verdict:</b> <span class="verdict {verdict_class(data["verdict"])}">'
                 f'{esc(data["verdict"])}</span> <span class="src">(<a href="{esc(link(f"studies/{st.name}/summary.json"))}">'
                 f'summary.json</a>)</span></p>')
        for key in ("verdict_line", "finding", "data"):
            if data.get(key):
                h.append(f'<p class="src">{esc(key.replace("_", " "))}: {esc(data[key])}</p>')
        if st.figure:
            h.append(f'<img class="figure" src="{esc(st.figure)}" alt="{esc(st.name)}: {esc(data["metric"])} '
                     f'per variant">')
        h.append(study_table_html(data))
        for also in [a for a in data.get("also") or [] if isinstance(a, dict)]:
            h.append(f'<p>Also claimed, of the same runs ({esc(also.get("metric", ""))}): {esc(also.get("claim", ""))} '
                     f'<span class="verdict {verdict_class(also.get("verdict", ""))}">{esc(also.get("verdict", ""))}'
                     f'</span> <span class="src">{esc(also.get("verdict_line", ""))}</span></p>')
        links = []
        if st.experiment_url:
            links.append(f'<a href="{esc(st.experiment_url)}">experiment</a>')
        if st.run_url:
            links.append(f'<a href="{esc(st.run_url)}">parent run</a>')
        if links:
            h.append("<p>MLflow: " + ", ".join(links) + "</p>")
        if data.get("command"):
            h.append(f'<p class="src">ran: <code>{esc(data["command"])}</code></p>')
        h.append("</section>")

    h.append('<h2 id="mlflow">MLflow</h2>')
    if tracking.client is not None:
        h.append(f'<p>The MLflow links open <code>make ui</code>, which serves this project\'s <code>mlflow.db</code> '
                 f'on <a href="{UI}/#/experiments?{TRAINING_PAGES}">{UI}</a>; start it first. Experiments:</p><ul>')
        for i, n in sorted(tracking.names.items(), key=lambda item: item[1]):
            h.append(f'<li><a href="{esc(experiment_url(i))}">{esc(n)}</a></li>')
        h.append("</ul>")
    else:
        h.append(f'<p class="muted">{esc(tracking.problem)}. <code>make ui</code> serves the store on {UI}.</p>')
    h.append('<p class="muted">Every benchmark result with its machine and command: '
             f'<a href="{esc(link("docs/results.md"))}">docs/results.md</a>; the DVC metrics as tables: '
             '<code>make results</code>.</p>')
    h.append("</main></body></html>\n")
    return "\n".join(h)


def study_rows(data: dict) -> list[list[str]]:
    """The variants' table: variant, mean ± std, seeds, params, seconds, its comparison with the claimed one."""
    comparisons = {c.get("variant"): c for c in data.get("comparisons") or [] if isinstance(c, dict)}
    rows = []
    for name, v in data["variants"].items():
        v = v if isinstance(v, dict) else {}
        seeds = v.get("seeds") or []
        c = comparisons.get(name)
        versus = f"{number(c.get('difference'))} ± {number(c.get('spread'))}: {c.get('verdict', '')}" if c else "–"
        label = f"{name} (claimed)" if name == data.get("claimed") else name
        rows.append([label, f"{number(v.get('mean'))} ± {number(v.get('std'))}", str(len(seeds)),
                     number(v.get("params")), number(v.get("seconds")), versus])
    return rows


def study_header(data: dict) -> list[str]:
    better = "higher is better" if data.get("higher_is_better", True) else "lower is better"
    return ["variant", f"{data['metric']} (mean ± std over seeds; {better})", "seeds", "params", "seconds",
            "difference ± spread: verdict"]


def study_table_html(data: dict) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in study_header(data))
    body = "".join("<tr>" + f"<td>{esc(r[0])}</td>" + "".join(f'<td class="num">{esc(c)}</td>' for c in r[1:-1])
                   + f'<td>{esc(r[-1])}</td></tr>' for r in study_rows(data))
    return f"<table><tr>{head}</tr>{body}</table>"


def render_markdown(found: list[Section], studies: list[Study], tracking: Tracking, link: Links) -> str:
    m = ["# transformer-lab report", "",
         "Every model family's headline result beside its anchor, this checkout's pipeline runs, and the studies,",
         ("from the files named beside each number. Written by `make report` "
          "(`python -m transformer_lab.runtime.report`); the same as [index.html](index.html)."), ""]

    def files_md(files: list[str]) -> str:
        shown = [f"[{Path(f).name}]({link(f)})" for f in files[:3]]
        return ", ".join(shown) + (f" … ({len(files)} files)" if len(files) > 3 else "")

    def figure_md(shown: Shown, strong: bool, files: bool = True, machine: str = "") -> str:
        value = f"**{shown.value}**" if strong else shown.value
        where = f" on {md(shown.machine)}" if shown.machine and shown.machine != machine else ""
        source = f" ({files_md(shown.files)}{where})" if files else ""
        return f"{md(shown.label)}: {md(value)}{' ' + shown.spread if shown.spread else ''}{source}"

    def cell_md(shown: list[Shown], strong: bool) -> str:
        if not shown:
            return "–"
        lines = "<br>".join(figure_md(f, strong and i == 0, files=False) for i, f in enumerate(shown))
        return f"{lines} ({files_md(list(dict.fromkeys(name for f in shown for name in f.files)))})"

    m += ["## The families at a glance", "",
          "| family | headline | anchor | measured on | this checkout's pipeline |", "|---|---|---|---|---|"]
    for s in found:
        title = s.headline.title if s.headline else s.key
        headline = cell_md(s.figures[:1], True) if s.figures else "not run yet"
        machine = s.figures[0].machine if s.figures else "–"
        m.append(f"| [{md(title)}](#{s.key}) | {headline} | {cell_md(s.anchors, False)} | {md(machine)} | "
                 f"{pipeline_text(s)} |")
    m.append("")
    for s in found:
        title = s.headline.title if s.headline else s.key
        m += [f'<a id="{s.key}"></a>', "", f"## {title}", ""]
        if s.headline:
            m += [f"page: [{s.headline.page}]({link(s.headline.page)})", ""]
        if s.figures:
            machine = s.figures[0].machine
            m += [f"- {figure_md(f, i == 0, machine=machine)}" for i, f in enumerate(s.figures)]
            m += [f"- measured on: {md(machine)}", ""]
            m += ["Against:", "", *(f"- {figure_md(a, False, machine=machine)}" for a in s.anchors), ""] \
                if s.anchors else []
        elif s.headline:
            m += [f"Headline not run yet: `{s.headline.command}`", ""]
        m += [*(f"_{note}_  " for note in s.notes), ""] if s.notes else []
        m += ["### This checkout's pipeline (`make run`)", ""]
        tables = s.tables()
        for family, rows, columns in tables:
            m += [f"`{family}` (families.py)", ""] if len(tables) > 1 else []
            m += ["| stage | " + " | ".join(columns) + " | more | file | MLflow |",
                  "|---|" + "---:|" * len(columns) + "---|---|---|"]
            for r in rows:
                mlflow = f"[run]({r.run_url})" if r.run_url else "–"
                m.append(f"| {md(r.label)} | " + " | ".join(number(r.metrics.get(c)) for c in columns)
                         + f" | {md(more(r, columns))} | [{r.file}]({link(r.file)}) | {mlflow} |")
            m.append("")
        m += ["Machine: not recorded by the pipeline's metrics files.", ""] if s.rows else []
        if s.not_run:
            m += ["Not run yet: " + ", ".join(f"`dvc repro {stage}`" for stage in s.not_run) + " (or `make run`)", ""]
        elif not s.rows:
            m += ["No pipeline stage of its own.", ""]
        if s.experiments:
            m += ["MLflow experiments: " + ", ".join(f"[{n}]({experiment_url(i)})" for i, n in s.experiments.items()),
                  ""]
    m += ["## Studies", "", ("Each study trains variants of one model over several seeds and says whether a "
                             f"claim holds. `{STUDY_RUNS_ALL}` runs them all."), ""]
    waiting = [st for st in studies if st.summary is None]
    if waiting:
        m += ["| study not run yet | the command that runs it |", "|---|---|"]
        m += [f"| {st.name}{'<br>_' + md(st.problem) + '_' if st.problem else ''} | `{study_command(st.name)}` |"
              for st in waiting]
        m.append("")
    for st in studies:
        if st.summary is None:
            continue
        m += [f"### {st.name}", ""]
        data = st.summary
        m += [f"**Claim:** {md(data['claim'])}", "",
              f"**Verdict:** **{md(data['verdict'])}** ([summary.json]({link(f'studies/{st.name}/summary.json')}))",
              ""]
        m += [f"_{key.replace('_', ' ')}: {md(data[key])}_  " for key in ("verdict_line", "finding", "data")
              if data.get(key)]
        if st.figure:
            m += ["", f"![{st.name}: {data['metric']} per variant]({st.figure})", ""]
        m += ["", "| " + " | ".join(md(c) for c in study_header(data)) + " |", "|---|---:|---:|---:|---:|---|"]
        m += ["| " + " | ".join(md(c) for c in row) + " |" for row in study_rows(data)]
        m.append("")
        m += [f"Also claimed, of the same runs ({md(a.get('metric', ''))}): {md(a.get('claim', ''))} "
              f"**{md(a.get('verdict', ''))}** {md(a.get('verdict_line', ''))}"
              for a in data.get("also") or [] if isinstance(a, dict)]
        m += [""] if data.get("also") else []
        links = [f"[experiment]({st.experiment_url})"] if st.experiment_url else []
        links += [f"[parent run]({st.run_url})"] if st.run_url else []
        m += [f"MLflow: {', '.join(links)}", ""] if links else []
        m += [f"Ran: `{data['command']}`", ""] if data.get("command") else []
    m += ["## MLflow", ""]
    if tracking.client is not None:
        m += [f"The MLflow links open `make ui`, which serves this project's `mlflow.db` on {UI}; start it first.",
              "Experiments: " + ", ".join(f"[{n}]({experiment_url(i)})"
                                          for i, n in sorted(tracking.names.items(), key=lambda item: item[1])), ""]
    else:
        m += [f"_{tracking.problem}._ `make ui` serves the store on {UI}.", ""]
    m += [(f"Every benchmark result with its machine and command: [docs/results.md]({link('docs/results.md')}); "
           "the DVC metrics as tables: `make results`."), ""]
    return "\n".join(m)


# --- writing ---------------------------------------------------------------------------------------

def check_out(out: Path) -> None:
    """A folder at `out` that holds anything but an earlier report is not replaced."""
    if not out.exists():
        return
    if not out.is_dir():
        raise TransformerLabError(f"--out {out}: a file, not a folder")
    index = out / "index.html"
    earlier = index.is_file() and GENERATOR in index.read_text(encoding="utf-8", errors="replace")
    if any(out.iterdir()) and not earlier:
        raise TransformerLabError(f"--out {out}: a folder that is not an earlier report; the report replaces "
                                  "its folder whole, so name a new or an earlier report's folder")


def build(root: Path, out: Path) -> None:
    root = root.resolve()
    check_out(out)
    tracking = Tracking(root)
    found = sections(root, tracking)
    with atomic_directory(out) as tmp:
        studies = [read_study(root, name, tracking, tmp) for name in study_names(root)]
        link = Links(root, out)
        (tmp / "index.html").write_text(render_html(found, studies, tracking, link), encoding="utf-8")
        (tmp / "README.md").write_text(render_markdown(found, studies, tracking, link), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_lab.runtime.report", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="One report of the lab from whatever has been run: each model family's headline result\n"
                    "beside its anchor and the machine it was measured on (benchmarks/results/*.json), this\n"
                    "checkout's pipeline metrics (dvc.yaml's metrics files), the studies (studies/*/summary.json)\n"
                    "and links to their MLflow runs (make ui); what has not run yet, with its command.\n"
                    "Writes OUT/index.html (static, offline) and OUT/README.md (the same in Markdown).",
        epilog="examples:\n"
               "  make report                                   # reports/index.html, reports/README.md\n"
               "  python -m transformer_lab.runtime.report --out /tmp/report --root ../other-checkout")
    parser.add_argument("--root", type=Path, default=Path("."), help="the project whose results are read (.)")
    parser.add_argument("--out", type=Path, default=Path("reports"),
                        help="the folder written, replaced whole (reports); it must be new or an earlier report")
    args = parser.parse_args(argv)
    try:
        build(args.root, args.out)
    except TransformerLabError as err:
        print(f"report: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.out / 'index.html'} and {args.out / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
