"""The views of the pipeline's results that DVC gives: `make results` (a table per family that fits a
screen, old→new against a revision) and `dvc plots show` / `dvc plots diff` pages that render with
no network (the vega libraries inline in .dvc/plots/offline.html)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, run

from transformer_lab.runtime.results import OTHER, family_of, main, report
from transformer_lab.runtime.stage_deps import stages

DVC = str(Path(PYTHON).parent / "dvc")
TEMPLATE = ROOT / ".dvc" / "plots" / "offline.html"
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "-c", "commit.gpgsign=false"]


def test_every_stage_that_writes_metrics_has_a_family_table():
    """A new stage that families.py does not list would land in the `other` table: list it there."""
    unlisted = [name for name, stage in stages().items() if stage.get("metrics") and family_of(name) == OTHER]
    assert unlisted == []
    assert family_of("train_tabular@ft_transformer") == "tabular_classification"


SENTIMENT = {"val/acc": 0.56666, "val/loss": 0.69291, "val/macro_f1": 0.5623, "test/acc": 0.36667,
             "test/n_examples": 30, "epochs": 5, "params": 1503362}


def test_a_table_per_family_with_its_selection_metrics_first_and_every_line_within_the_width():
    stage_of = {"a/sentiment.json": "finetune_sentiment", "a/scratch.json": "finetune_sentiment_scratch",
                "a/comparison.json": "compare_sentiment", "a/gpt.json": "pretrain_gpt"}
    new = {"a/sentiment.json": SENTIMENT, "a/scratch.json": {**SENTIMENT, "val/acc": 0.5},
           "a/comparison.json": {"own": {"val/acc": 0.5667}, "scratch": {"val/acc": 0.5}},
           "a/gpt.json": {"val/loss": 5.547041, "val/perplexity": 256.4777}}
    text = report(stage_of, new, width=60)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 60
    assert lines[0] == "sequence_classification  (↑ acc, macro_f1  ↓ loss)"
    header = lines[1].split()
    assert header[:4] == ["stage", "val/acc", "val/macro_f1", "val/loss"]  # families.py's order, then test/
    assert lines[2].split() == ["finetune_sentiment", "0.5667", "0.5623", "0.6929"]  # 4 significant digits
    assert lines[4].split() == ["compare_sentiment:", "own", "0.5667", "-", "-"]  # a row per model
    # the rest in further column groups, each with the rows that have a value there
    assert lines[6:9] == ["stage                       test/acc", "finetune_sentiment            0.3667",
                          "finetune_sentiment_scratch    0.3667"]
    assert lines[9].split() == ["stage", "epochs", "params", "test/n_examples"]  # counts last
    assert lines[10].split() == ["finetune_sentiment", "5", "1503362", "30"]
    assert lines[12:] == ["", "gpt_pretraining  (↓ loss, perplexity)", "stage         val/loss  val/perplexity",
                          "pretrain_gpt     5.547           256.5"]


def test_against_a_revision_each_change_reads_old_to_new():
    stage_of = {"m.json": "finetune_qa", "gone.json": "finetune_pairs"}
    text = report(stage_of, {"m.json": {"val/f1": 0.75, "val/loss": 0.61234}},
                  {"m.json": {"val/f1": 0.5, "val/loss": 0.612341}, "gone.json": {"val/acc": 0.5}}, rev="HEAD~1")
    assert "finetune_qa  0.5→0.75    0.6123\n" in text  # unchanged at 4 significant digits: one value
    assert "finetune_pairs    0.5→-\n" in text
    assert "2 value(s) differ from HEAD~1" in text
    assert "no metrics in the workspace yet: finetune_pairs" in text


def git_dvc_project(folder: Path) -> Path:
    folder.mkdir()
    for command in (["git", "init", "-q"], [DVC, "init", "-q"]):
        subprocess.run(command, cwd=folder, check=True)
    return folder


def commit(folder: Path, message: str) -> None:
    subprocess.run(GIT + ["add", "-A"], cwd=folder, check=True)
    subprocess.run(GIT + ["commit", "-q", "-m", message], cwd=folder, check=True)


def test_results_reads_dvc_yaml_and_a_git_revision_through_dvc(tmp_path, capsys):
    project = git_dvc_project(tmp_path / "project")
    (project / "dvc.yaml").write_text(
        "stages:\n"
        "  finetune_qa:\n    cmd: 'true'\n    metrics:\n      - qa.json:\n          cache: false\n"
        "  train_tabular:\n    matrix:\n      model: [tab_mlp]\n    cmd: 'true'\n"
        "    metrics:\n      - ${item.model}.json:\n          cache: false\n")
    (project / "qa.json").write_text('{"val/f1": 0.5, "epochs": 2}')
    (project / "tab_mlp.json").write_text('{"val/auroc": 0.9}')
    commit(project, "first")
    (project / "qa.json").write_text('{"val/f1": 0.75, "epochs": 2}')

    assert main(["--repo", str(project)]) == 0
    out = capsys.readouterr().out
    assert "question_answering" in out and re.search(r"finetune_qa +0\.75 +2", out)
    assert "tabular_classification" in out and re.search(r"train_tabular@tab_mlp +0\.9", out)

    assert main(["--repo", str(project), "--rev", "HEAD"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"finetune_qa +0\.5→0\.75 +2", out) and "1 value(s) differ from HEAD" in out

    assert main(["--repo", str(project), "--rev", "no-such-rev"]) == 2
    assert capsys.readouterr().err.strip() == "results: unknown Git revision 'no-such-rev'"


def test_the_offline_template_carries_vega_inline_and_dvc_uses_it():
    page = TEMPLATE.read_text(encoding="utf-8")
    assert page.count("{plot_divs}") == 1  # where DVC puts the plots
    assert "{scripts}" not in page  # where DVC would put its CDN <script src=...> tags
    assert not re.search(r"<script[^>]*\ssrc=", page)
    for name in ("vega", "vega-lite", "vega-embed"):
        assert re.search(rf"/\* {name} \d+\.\d+\.\d+ \(BSD-3-Clause\)", page)
    assert "Redistributions in binary form must reproduce the above copyright notice" in page
    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        assert Path(repo.dvc_dir, repo.config["plots"]["html_template"]) == TEMPLATE


def rendered_marks(page: Path) -> int:
    """How many vega views a headless chromium drew in the page, with every network request failing
    (a proxy nothing listens on): what the page draws from what it carries."""
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--proxy-server=127.0.0.1:9",
                          "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    return len(re.findall(r'<(?:canvas|svg)[^>]*class="marks"', dom))


@pytest.mark.slow
def test_dvc_plots_show_and_diff_write_pages_that_render_without_a_network(tmp_path):
    project = git_dvc_project(tmp_path / "project")
    (project / "history.csv").write_text("epoch,val/acc\n1,0.5\n2,0.6\n3,0.7\n")
    (project / "dvc.yaml").write_text("plots:\n  - history.csv:\n      x: epoch\n      y: val/acc\n")
    commit(project, "first")
    (project / "history.csv").write_text("epoch,val/acc\n1,0.55\n2,0.7\n3,0.8\n")

    assert run([DVC, "plots", "show", "-o", "cdn"], cwd=project).returncode == 0  # DVC's own page
    assert run([DVC, "config", "plots.html_template", str(TEMPLATE)], cwd=project).returncode == 0
    for command in (["show", "-o", "show"], ["diff", "HEAD", "-o", "diff"]):
        done = run([DVC, "plots", *command], cwd=project)
        assert done.returncode == 0, done.stderr
    diff = (project / "diff" / "index.html").read_text(encoding="utf-8")
    assert '"rev": "HEAD"' in diff and '"rev": "workspace"' in diff  # both revisions' points
    for folder in ("show", "diff"):
        page = (project / folder / "index.html").read_text(encoding="utf-8")
        assert not re.search(r"<script[^>]*\ssrc=", page) and "vegaEmbed(" in page
    assert re.search(r'<script src="https://cdn\.jsdelivr\.net/npm/vega@', (project / "cdn" / "index.html").read_text())

    if shutil.which("chromium") is None:
        pytest.skip("no chromium on PATH (apt-get install chromium): the pages are not rendered")
    assert rendered_marks(project / "cdn" / "index.html") == 0  # no network here: the CDN's page draws nothing
    assert rendered_marks(project / "show" / "index.html") == 1
    assert rendered_marks(project / "diff" / "index.html") == 1

