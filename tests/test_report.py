"""`make report` (runtime/report.py) on a tiny lab: a DVC project whose dvc.yaml declares one run and one
unrun stage's metrics, a benchmark result with its machine record, a family page quoting a published
figure, two studies (summary.json and a figure drawn by matplotlib) and an MLflow store. What is checked
is what a reader gets: the numbers with the files they come from, what is not run yet with its command,
the links to MLflow, a page that needs nothing but its folder. Last, headless chromium opens the page from
disk with the network cut and every image must load."""

import ast
import json
import logging
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

from transformer_lab.families import FAMILIES
from transformer_lab.runtime import report

MACHINE = {"cpu": "AMD EPYC", "cpu_count": 2, "torch": "2.13.0+cpu", "date": "2026-11-30",
           "command": "python benchmarks/atis.py --out benchmarks/results/atis.json"}
DVC_YAML = """\
stages:
  train_atis:
    cmd: python -c "print()"
    metrics:
      - artifacts/atis/train/metrics.json:
          cache: false
  train_vit:
    cmd: python -c "print()"
    metrics:
      - artifacts/vit/train/metrics.json:
          cache: false
"""
HOLDS = {"claim": "Scaling the scores by 1/sqrt(d) trains better than not scaling them.", "metric": "val/slot_f1",
         "higher_is_better": True, "claimed": "scaled", "verdict": "holds",
         "also": [{"claim": "Unscaled scores saturate the softmax.", "metric": "val/loss", "verdict": "not shown",
                   "verdict_line": "scaled vs unscaled: -0.01 (spread 0.02) not shown"}], "command": "python pipelines/study.py study=positions",
         "variants": {"scaled": {"mean": 0.9123, "std": 0.0041, "seeds": [0.91, 0.916, 0.9109], "params": 485710,
                                 "seconds": 61.5},
                      "unscaled": {"mean": 0.8712, "std": 0.0103, "seeds": [0.86, 0.88, 0.8736], "params": 485710,
                                   "seconds": 60.2}},
         "comparisons": [{"variant": "unscaled", "difference": -0.0411, "spread": 0.0112, "verdict": "holds"}],
         "mlflow": None}
CONTRADICTED = {**HOLDS, "claim": "Eight heads beat one.", "verdict": "contradicted", "command": "",
                "variants": {"one": {"mean": 0.5, "std": 0.01, "seeds": [0.49, 0.51], "params": 10, "seconds": 1.0}},
                "comparisons": [], "mlflow": None}


def figure(path: Path, values: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.bar(range(len(values)), values)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=50)
    plt.close(fig)


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


@pytest.fixture(scope="session")
def store(tmp_path_factory) -> tuple[Path, dict]:
    """An MLflow store with a training run and a study's parent run (made once: MLflow takes seconds
    to make its tables); the ids."""
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    client = MlflowClient(f"sqlite:///{db}")
    atis = client.create_experiment("atis")
    study = client.create_experiment("study/positions")
    return db, {"atis": atis, "run": client.create_run(atis, run_name="train_atis").info.run_id, "study": study,
                "parent": client.create_run(study, run_name="study positions").info.run_id}


@pytest.fixture
def lab(tmp_path, store, monkeypatch) -> Path:
    from dvc.repo import Repo

    # An earlier test in this worker may have run DVC's CLI in-process, which points the "dvc" logger at
    # the stdout pytest captured then and has closed since; the report's DVC calls log through the root.
    monkeypatch.setattr(logging.getLogger("dvc"), "handlers", [])
    db, ids = store
    root = tmp_path / "lab"
    root.mkdir()
    Repo.init(str(root), no_scm=True).close()
    (root / "dvc.yaml").write_text(DVC_YAML)
    write_json(root / "artifacts/atis/train/metrics.json", {"val/slot_f1": 0.7169811, "val/intent_acc": 0.98,
                                                            "params": 485710, "epochs": 4})
    write_json(root / "benchmarks/results/atis.json", {"slot_f1": 0.9418, "intent_acc": 0.9619,
                                                       "train_seconds": 296.8, "machine": MACHINE})
    (root / "docs/families").mkdir(parents=True)
    (root / "docs/families/atis.md").write_text("short of the best non-pretrained systems (Stack-Propagation\n"
                                                "95.9 / 96.9); intent accuracy is above ...\n")
    figure(root / "studies/positions/figure.png", [0.9123, 0.8712])
    write_json(root / "studies/x/summary.json", CONTRADICTED)
    figure(root / "studies/x/figure.png", [0.5])

    shutil.copyfile(db, root / "mlflow.db")
    write_json(root / "artifacts/atis/train/mlflow_run.json", {"experiment_id": ids["atis"], "run_id": ids["run"]})
    write_json(root / "studies/positions/summary.json",
               {**HOLDS, "mlflow": {"experiment": "study/positions", "parent_run_id": ids["parent"]}})
    return root


def build(root: Path) -> tuple[str, str]:
    assert report.main(["--root", str(root), "--out", str(root / "reports")]) == 0
    return (root / "reports/index.html").read_text(), (root / "reports/README.md").read_text()


def text_of(page: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", page).split())


@pytest.mark.slow  # the tiny lab's real MLflow store takes half a minute a worker
def test_the_report_shows_each_number_beside_its_file_and_what_is_not_run_with_its_command(lab, store):
    page, markdown = build(lab)
    text = text_of(page)
    # the family's headline beside its anchor (a published figure its page still quotes) and its machine
    assert "real ATIS test slot F1, from scratch: 0.9418" in text
    assert '<a href="../benchmarks/results/atis.json">atis.json</a>' in page
    assert "Stack-Propagation 95.9 / 96.9" in text and 'href="../docs/families/atis.md"' in page
    assert "AMD EPYC, 2 cores, torch 2.13.0+cpu, 2026-11-30" in text
    # the pipeline: the run stage's metrics (4 significant digits) from its file, the other not run yet
    assert re.search(r"train_atis 0\.717 .*0\.98 .*485,710", text)
    assert 'href="../artifacts/atis/train/metrics.json"' in page
    assert "dvc repro train_vit" in text
    # families with no result file at all: the command that writes their headline
    assert f"headline not run yet: {report.HEADLINES['vit'].command}" in text
    # the studies: claim, coloured verdict, figure copied beside the page, variants as mean ± std
    assert HOLDS["claim"] in text and CONTRADICTED["claim"] in text
    assert '<span class="verdict holds">holds</span>' in page
    assert '<span class="verdict contradicted">contradicted</span>' in page
    assert '<img class="figure" src="studies/positions.png"' in page
    assert (lab / "reports/studies/positions.png").read_bytes() == (lab / "studies/positions/figure.png").read_bytes()
    assert re.search(r"scaled \(claimed\) 0\.9123 ± 0\.0041 3 485,710 61\.5", text)
    assert "Unscaled scores saturate the softmax." in text and '<span class="verdict not-shown">not shown' in page
    assert "unscaled 0.8712 ± 0.0103 3 485,710 60.2 -0.0411 ± 0.0112: holds" in text
    for name in set(report.STUDIES) - {"positions"}:  # declared, not run: the command that runs it
        assert f"{name} python pipelines/study.py study={name}" in text
    # MLflow: the ids in the store, the run beside the metrics, what serves them
    ids = store[1]
    atis, study, run_id = ids["atis"], ids["study"], ids["run"]
    assert f'href="http://127.0.0.1:5000/#/experiments/{atis}/runs/{run_id}?workflowType=machine_learning"' in page
    assert f'href="http://127.0.0.1:5000/#/experiments/{study}?workflowType=machine_learning"' in page
    assert f'href="http://127.0.0.1:5000/#/experiments/{study}/runs/{ids["parent"]}?workflowType=' in page
    assert "make ui" in text
    # self-contained: no script, no stylesheet or image from elsewhere; links only to the files and the UI
    assert "<script" not in page and "<link" not in page
    assert all(not src.startswith(("http:", "https:", "/")) for src in re.findall(r'src="([^"]+)"', page))
    assert {href.split("/#")[0] for href in re.findall(r'href="(http[^"]+)"', page)} == {"http://127.0.0.1:5000"}

    # the Markdown says the same
    for expected in ("**0.9418**", "[atis.json](../benchmarks/results/atis.json)", "Stack-Propagation 95.9 / 96.9",
                     "`dvc repro train_vit`", HOLDS["claim"], "**holds**",
                     "![positions: val/slot_f1 per variant](studies/positions.png)", "| scaled (claimed) | 0.9123 ± 0.0041 | 3 | 485,710 | 61.5 |",
                     "`python pipelines/study.py study=pooling`", f"/#/experiments/{atis}/runs/{run_id}?"):
        assert expected in markdown, expected

    # the same files, the same bytes (no time of its own)
    assert build(lab) == (page, markdown)


@pytest.mark.slow  # the tiny lab's real MLflow store takes half a minute a worker
def test_what_the_files_no_longer_say_is_not_shown(lab):
    (lab / "docs/families/atis.md").write_text("the published figures moved elsewhere\n")
    write_json(lab / "benchmarks/results/atis.json", {"intent_acc": 0.9619, "machine": MACHINE})
    (lab / "mlflow.db").unlink()
    text = text_of(build(lab)[0])
    assert "published system (slot F1 / intent acc): Stack-Propagation" not in text
    assert "docs/families/atis.md no longer quotes “Stack-Propagation 95.9 / 96.9”" in text
    assert "real ATIS test slot F1, from scratch: no number `slot_f1` in benchmarks/results/atis.json" in text
    assert "intent accuracy: 0.9619" in text  # what the file still has
    assert "127.0.0.1:5000/#" not in text and "no mlflow.db here yet" in text
    write_json(lab / "benchmarks/results/atis.json", {"slot_f1": 0.9, "machine": {"cpu": "x"}})
    assert "the machine record lacks cpu_count, torch, date, command" in text_of(build(lab)[0])


@pytest.mark.slow  # the tiny lab's real MLflow store takes half a minute a worker
def test_an_out_folder_that_is_not_a_report_is_left_alone(lab, capsys):
    keep = lab / "docs"
    assert report.main(["--root", str(lab), "--out", str(keep)]) == 2
    assert "not an earlier report" in capsys.readouterr().err
    assert (keep / "families/atis.md").is_file()
    build(lab)
    (lab / "reports/stale.png").write_bytes(b"")
    build(lab)  # an earlier report is replaced whole
    assert not (lab / "reports/stale.png").exists()


def test_each_family_has_one_headline_and_every_figure_is_in_the_projects_files():
    """A renamed result file or key, a page that stops quoting a figure, or a family that no
    headline covers shows here, not as a gap in the report."""
    covered = [name for headline in report.HEADLINES.values() for name in headline.families]
    assert sorted(covered) == sorted(FAMILIES), "each families.py entry under exactly one headline"
    table = report.results_table()
    for key, headline in report.HEADLINES.items():
        for spec in (*headline.figures, *headline.anchors):
            shown = report.read_figure(ROOT, spec, table) if isinstance(spec, report.Figure) \
                else report.read_quote(ROOT, spec)
            assert isinstance(shown, report.Shown), f"{key}: {shown}"
        assert (ROOT / headline.page).is_file()


def test_the_links_open_the_pages_make_ui_serves():
    """The names report.py keeps rather than import tracking/runs.py (and Lightning with it) are its."""
    tree = ast.parse((ROOT / "src/transformer_lab/tracking/runs.py").read_text())
    names = {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
             and isinstance(node.value, ast.Constant) for target in node.targets if isinstance(target, ast.Name)}
    assert report.TRAINING_PAGES == names["MODEL_TRAINING_PAGES"] and report.RUN_REFERENCE == names["RUN_REFERENCE"]
    assert "--host 127.0.0.1 --port 5000" in (ROOT / "Makefile").read_text()


# Written into a copy of the page beside it (the report itself carries no script): once the page has
# loaded, what the browser laid out and whether each image decoded, as attributes dump-dom shows.
CHECK = """<script>addEventListener('load', () => {
  for (const img of document.images) img.setAttribute('data-loaded', img.complete && img.naturalWidth > 0);
  document.body.setAttribute('data-images', document.images.length);
  document.body.setAttribute('data-text', document.body.innerText);
});</script>"""


@pytest.mark.slow  # the tiny lab's real MLflow store takes half a minute a worker
def test_headless_chromium_renders_the_page_from_disk_with_its_images(lab):
    if shutil.which("chromium") is None:
        pytest.skip("no chromium on PATH (apt-get install chromium): the page is not rendered")
    build(lab)
    page = (lab / "reports/index.html").read_text()
    probe = lab / "reports/.probe.html"
    probe.write_text(page.replace("</body>", CHECK + "</body>"))
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--proxy-server=127.0.0.1:9",
                          "--allow-file-access-from-files", "--virtual-time-budget=5000", "--dump-dom",
                          probe.as_uri()], check=False, capture_output=True, text=True, timeout=120).stdout
    images = re.findall(r"<img [^>]*>", dom)
    assert re.search(r'<body[^>]* data-images="2"', dom), dom[-2000:]
    assert len(images) == 2 and all('data-loaded="true"' in img for img in images), images
    [shown] = re.findall(r'data-text="([^"]*)"', dom)
    shown = " ".join(shown.split())
    assert "real ATIS test slot F1, from scratch: 0.9418" in shown
    assert "study not run yet" in shown and "python pipelines/study.py study=attention_qkv" in shown
    assert "holds" in shown and "contradicted" in shown
