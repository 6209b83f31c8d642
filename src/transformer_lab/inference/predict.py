"""`pipelines/predict.py`: any trained model on one input given on the command line, or on a file
of inputs (txt, jsonl or csv) written to a jsonl file, the pipeline's output fields per line.

Each input file line (jsonl: an object or a string; csv: a row; txt: a line) becomes the
pipeline's input by the task's fields: text (and text_pair); question and context; image (a
path, relative to the input file); for tables the row itself. Output line N answers input line
(row) N. A line that lacks its field, or a blank line among the inputs, is one error naming the
file and line, and nothing is written.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from transformer_lab.errors import TransformerLabError
from transformer_lab.inference.options import OPTIONS, check_model_source, check_option, check_options
from transformer_lab.utils.io import atomic_write_text, decode_utf8

SINGLE = ("text", "question", "image", "row")  # the command-line inputs, one of them per call


def record_input(task: str, record, where: str, folder: Path):
    """The pipeline input of one input-file record (a string or a dict of fields)."""
    if task == "tabular-classification":
        row = record.get("row", record) if isinstance(record, dict) else None
        if not isinstance(row, dict):
            raise TransformerLabError(f"{where}: a table row is an object of its columns")
        return row
    if isinstance(record, str):
        record = {"image" if task == "image-classification" else "text": record}
    if not isinstance(record, dict):
        raise TransformerLabError(f"{where}: expected a string or an object, got {type(record).__name__}")
    fields = {"question-answering": ("question", "context"), "image-classification": ("image",)}.get(task, ("text",))
    missing = [f for f in fields if not isinstance(record.get(f), str) or not record[f].strip()]
    if missing:
        raise TransformerLabError(f"{where}: field {missing[0]!r} is missing or empty")
    if task == "question-answering":
        return {"question": record["question"], "context": record["context"]}
    if task == "image-classification":
        return str(folder / record["image"])
    if task == "text-classification" and record.get("text_pair"):
        return {"text": record["text"], "text_pair": record["text_pair"]}
    return record["text"]


def numbered_lines(path: Path, text: str) -> list[tuple[int, str]]:
    """(line number, line) of a text or jsonl input file. A blank line before the last input is
    an error naming it: skipped, it would shift every later answer one line up (output line N
    answers input line N); blank lines after the last input shift nothing and end the file."""
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            raise TransformerLabError(f"{path}:{number}: blank line; each line is one input, answered on "
                                      "the same line of output= (remove it, or put an input there)")
    return list(enumerate(lines, 1))


def csv_records(path: Path, text: str) -> list[tuple[int, dict]]:
    """(line number, row) of a csv input file with a header row, each row numbered by the line
    it starts on (a quoted cell may span lines). A blank line among the rows is an error, as in
    a text file; one after the last row ends the file."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    records, blank, number = [], None, reader.line_num + 1
    for cells in reader:
        if not cells:  # the csv module's reading of an empty line
            blank = blank or number
        else:
            if blank:
                raise TransformerLabError(f"{path}:{blank}: blank line; each row is one input, answered on "
                                          "the same line of output= (remove it, or put an input there)")
            if len(cells) != len(header):
                raise TransformerLabError(f"{path}:{number}: {len(cells)} cells for the header's {len(header)}")
            records.append((number, dict(zip(header, cells))))
        number = reader.line_num + 1
    return records


def read_inputs(path: str | Path, task: str) -> list:
    """Every input of an input file, by its suffix: .jsonl, .csv (a header row), else one text per
    line; one input per line (a row), so that the output's lines line up with them."""
    path = Path(path)
    if not path.is_file():
        raise TransformerLabError(f"input={path}: file not found")
    text = decode_utf8(path, path.read_bytes())
    if path.suffix == ".jsonl":
        records = []
        for number, line in numbered_lines(path, text):
            try:
                records.append((number, json.loads(line)))
            except json.JSONDecodeError as err:
                raise TransformerLabError(f"{path}:{number}: not JSON ({err.msg})") from None
    elif path.suffix == ".csv":
        records = csv_records(path, text)
    else:
        records = numbered_lines(path, text)
    if not records:
        raise TransformerLabError(f"{path}: no inputs")
    return [record_input(task, record, f"{path}:{number}", path.parent) for number, record in records]


def check_command_line(cfg: DictConfig) -> None:
    """One input on the command line, or an input file with an output file: before any model loads."""
    given = [name for name in SINGLE if cfg.get(name) is not None]
    if cfg.get("input") is not None:
        if not cfg.get("output"):
            raise TransformerLabError("input= needs output=FILE.jsonl")
    elif len(given) != 1:
        raise TransformerLabError("give one input: text=..., question=... context=..., image=PATH or row={...}, "
                                  "or a file of them: input=FILE output=FILE.jsonl"
                                  + (f" (got {', '.join(given)})" if given else ""))


def command_line_input(cfg: DictConfig, task: str):
    if cfg.get("row") is not None:
        row = cfg.row
        row = json.loads(row) if isinstance(row, str) else OmegaConf.to_container(row)
        return record_input(task, row, "row=", Path.cwd())
    record = {name: cfg.get(name) for name in ("text", "text_pair", "question", "context", "image")
              if cfg.get(name) is not None}
    return record_input(task, {k: str(v) for k, v in record.items()}, "the command line", Path.cwd())


def check_call(cfg: DictConfig) -> None:
    """What a call gives that is checked before torch loads: one input (or an input file with an
    output file), batch_size, the options (by the task's names when task= is given) and a model=
    path that exists."""
    check_command_line(cfg)
    check_option("batch_size", cfg.get("batch_size"), OPTIONS["batch_size"])
    check_options(cfg.pipeline_task, _options(cfg), prefix="options.")
    check_model_source(str(cfg.model_source))


def _options(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg.options) if cfg.get("options") else {}


def predict(cfg: DictConfig) -> list | dict:
    """What `pipelines/predict.py` prints (one input) or writes to cfg.output (an input file)."""
    check_call(cfg)  # before torch loads
    from tqdm.auto import tqdm

    from transformer_lab.inference.pipeline import pipeline

    options = _options(cfg)
    run = pipeline(cfg.pipeline_task, model=str(cfg.model_source), tracking_uri=cfg.get("tracking_uri"))
    check_options(run.task_name, options, prefix="options.")  # by name, now that the model's task is known
    if cfg.get("input") is None:
        return run(command_line_input(cfg, run.task_name), **options)
    inputs = read_inputs(cfg.input, run.task_name)  # every line checked before the model runs
    results = []
    chunk = cfg.batch_size
    for start in tqdm(range(0, len(inputs), chunk), desc=f"{run.task_name} ({len(inputs)} inputs)", unit="batch"):
        results += run(inputs[start:start + chunk], **options)
    atomic_write_text(cfg.output, "".join(json.dumps(result) + "\n" for result in results))
    return results
