"""benchmarks/results_table.py: docs/results.md is what the results say now; a result without its
machine record is refused by name; and every relative link in README.md and docs/ resolves.
No torch: the generator reads JSON only."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("results_table", ROOT / "benchmarks" / "results_table.py")
results_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(results_table)

MACHINE = {"cpu": "AMD EPYC", "cpu_count": 2, "torch": "2.13.0+cpu", "date": "2026-12-06",
           "command": "python benchmarks/vit_digits.py --seed 1 --out benchmarks/results/vit_digits_seed1.json"}


def write(folder: Path, name: str, result: dict) -> Path:
    path = folder / name
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def test_docs_results_md_is_what_the_results_say_now():
    written = (ROOT / "docs" / "results.md").read_text()
    assert written == results_table.render(ROOT / "benchmarks" / "results", ROOT / "docs"), (
        "docs/results.md is stale: run `make results-table` (python benchmarks/results_table.py) and commit it")


def test_every_committed_result_carries_its_machine_record():
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        record = results_table.load(path)["machine"]
        assert set(results_table.REQUIRED) <= set(record), path.name


def test_one_table_per_benchmark_sorted_with_the_machine_and_command(tmp_path):
    results, docs = tmp_path / "results", tmp_path / "docs"
    results.mkdir()
    write(results, "vit_digits_seed1.json", {"test_acc": 0.9926, "cnn_acc": 0.9926, "settings": {"seed": 1},
                                             "machine": MACHINE})
    write(results, "vit_digits.json", {"test_acc": 0.9814, "logreg_acc": 0.9814,
                                       "machine": {**MACHINE, "cpu": None, "command": "python benchmarks/vit_digits.py"}})
    # a benchmark HEADLINE does not know: every scalar top-level key, grouped by the script its command ran
    write(results, "zeta.json", {"speedup": 1.25, "curve": [1, 2], "nested": {"x": 1}, "name": "a|b",
                                 "machine": {**MACHINE, "command": "X=1 python benchmarks/zeta.py --fast"}})
    page = results_table.render(results, docs)

    assert page == results_table.render(results, docs)  # deterministic: no time of its own
    assert page.index("## vit_digits (`benchmarks/vit_digits.py`)") < page.index("## zeta (`benchmarks/zeta.py`)")
    vit = page[page.index("## vit_digits"):page.index("## zeta")]
    assert vit.count("\n| [") == 2 and vit.index("[vit_digits.json]") < vit.index("[vit_digits_seed1.json]")
    assert "| file | test_acc | logreg_acc | cnn_acc | cpu | cores | torch | date | command |" in vit
    assert ("| [vit_digits.json](../results/vit_digits.json) | 0.9814 | 0.9814 | – | unknown | 2 | 2.13.0+cpu "
            "| 2026-12-06 | `python benchmarks/vit_digits.py` |") in vit
    assert "| 0.9926 | – | 0.9926 | AMD EPYC | 2 |" in vit
    zeta = page[page.index("## zeta"):]
    assert "| file | name | speedup | cpu |" in zeta and "| a\\|b | 1.25 |" in zeta and "curve" not in zeta


def test_a_result_without_a_machine_record_is_one_line_naming_it_and_nothing_is_written(tmp_path):
    results, out = tmp_path / "results", tmp_path / "docs" / "results.md"
    results.mkdir()
    write(results, "vit_digits.json", {"test_acc": 0.98, "machine": MACHINE})
    bare = write(results, "throughput_cpu.json", {"bert_tiny_ours_to_hf_speed": 1.6})
    command = [sys.executable, ROOT / "benchmarks" / "results_table.py", "--results", results, "--out", out]

    done = subprocess.run([str(a) for a in command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and not out.exists()
    assert done.stderr.count("\n") == 1 and str(bare) in done.stderr and "no machine record" in done.stderr

    write(results, "throughput_cpu.json", {"bert_tiny_ours_to_hf_speed": 1.6,
                                           "machine": {k: v for k, v in MACHINE.items() if k != "date"}})
    done = subprocess.run([str(a) for a in command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "throughput_cpu.json: the machine record lacks date" in done.stderr

    write(results, "throughput_cpu.json", {"bert_tiny_ours_to_hf_speed": 1.6, "machine": MACHINE})
    done = subprocess.run([str(a) for a in command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "[throughput_cpu.json](../results/throughput_cpu.json)" in out.read_text()
    check = subprocess.run([str(a) for a in [*command, "--check"]], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    out.write_text(out.read_text() + "edited by hand\n")
    check = subprocess.run([str(a) for a in [*command, "--check"]], capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and "stale" in check.stderr


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    return [target for target in LINK.findall(text)
            if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")]


@pytest.mark.parametrize("page", ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))])
def test_every_relative_link_resolves(page):
    path = ROOT / page
    broken = [target for target in relative_links(path)
              if not (path.parent / target.split("#", 1)[0]).exists()]
    assert not broken, f"{page}: links to missing files: {broken}"


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300
