"""The in-context mapping task: every sequence is consistent with its own mapping, only the
prompt can teach it (K = 0 is chance, also for a perfect reader), accuracy is measured without a
weight update, and a small GPT learns to read the demonstrations."""

import sys

import pytest
import torch
from conftest import ROOT
from test_inference import tokenizer_path  # noqa: F401  (the fixture)

sys.path.insert(0, str(ROOT / "benchmarks"))  # the task is research code beside the benchmark that uses it
from in_context_prompts import IGNORE_INDEX, MappingTask, accuracy_by_shots  # noqa: E402


class CopyLastLabel(torch.nn.Module):
    """A reader that knows the rule: the label that followed the query's last earlier occurrence,
    else the first label."""

    def __init__(self, task: MappingTask):
        super().__init__()
        self.task = task

    def forward(self, input_ids):
        logits = torch.zeros(*input_ids.shape, self.task.vocab_size)
        for row, ids in enumerate(input_ids.tolist()):
            query, demonstrations = ids[-1], list(zip(ids[:-1:2], ids[1::2]))
            shown = [label for symbol, label in demonstrations if symbol == query]
            logits[row, -1, shown[-1] if shown else self.task.n_symbols] = 1.0
        return type("Output", (), {"logits": logits})()


def test_sequences_follow_their_own_mapping():
    task = MappingTask(n_symbols=10, symbols_per_sequence=3, n_labels=2)
    batch = task.sample(50, 6, torch.Generator().manual_seed(0))
    assert batch["input_ids"].shape == batch["labels"].shape == (50, 13)
    for ids, labels, answer in zip(batch["input_ids"].tolist(), batch["labels"].tolist(), batch["answer"].tolist()):
        symbols, shown_labels = ids[0::2], ids[1::2]
        assert len(set(symbols)) <= 3 and all(s < 10 for s in symbols)
        assert all(10 <= label < 12 for label in shown_labels)
        assert labels[1::2] == [IGNORE_INDEX] * 6 and labels[0::2][:-1] == shown_labels and labels[-1] == answer
        mapping = {}
        for symbol, label in zip(symbols, labels[0::2]):
            assert mapping.setdefault(symbol, label) == label  # one label per symbol in a sequence


def test_a_perfect_reader_is_at_chance_without_demonstrations_and_at_the_bound_with_them():
    task = MappingTask()
    scores = accuracy_by_shots(CopyLastLabel(task), task, [0, 1, 8], n=4000, seed=3)
    assert scores[0] == pytest.approx(task.chance, abs=0.03)
    for k in (1, 8):
        assert scores[k] == pytest.approx(task.best_possible(k), abs=0.03)
    assert task.best_possible(8) > 0.9 > task.best_possible(4)


@pytest.mark.slow  # trains a model first: make test-all (CI) runs it, make test stays under 5 minutes
def test_a_small_gpt_learns_to_read_the_prompt_without_changing_its_weights():
    from transformer_lab.models.gpt import GPTConfig, GPTLMHeadModel

    torch.manual_seed(0)
    task = MappingTask(n_symbols=8, symbols_per_sequence=2, n_labels=2)
    model = GPTLMHeadModel(GPTConfig(vocab_size=task.vocab_size, n_layers=2, d_model=32, n_heads=2, max_len=17,
                                     dropout=0.0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        batch = task.sample(32, 8, generator)
        logits = model(batch["input_ids"]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    before = {name: p.clone() for name, p in model.state_dict().items()}
    scores = accuracy_by_shots(model, task, [0, 8], n=1000, seed=1)
    assert all(torch.equal(before[name], p) for name, p in model.state_dict().items())
    # above chance only by reading the demonstrations (a 300-step model copies the latest label: 0.75;
    # benchmarks/in_context.py trains long enough to find the matching symbol)
    assert scores[0] < 0.6 and scores[8] > 0.7


def test_few_shot_prompts_hold_k_demonstrations_never_the_query_and_move_no_weight(tokenizer_path):
    import random

    from test_inference import _cases

    from transformer_lab.inference.few_shot import ProjectLM, build_prompt, few_shot_accuracy, pick_demonstrations

    train = [{"text": f"review number {i}", "label": str(i % 2)} for i in range(30)]
    verbalisers = {"0": " negative", "1": " positive"}
    rng = random.Random(0)
    for k in (0, 1, 4, 16):
        for query in ("review number 3", "a new review"):
            shown = pick_demonstrations(train, k, query, rng)
            prompt = build_prompt(shown, query, verbalisers)
            assert len(shown) == k and query not in [d["text"] for d in shown]
            assert prompt.count("Review:") == k + 1 and prompt.endswith(f"Review: {query}\nSentiment:")
            assert prompt.count(" positive") + prompt.count(" negative") == k
    task, _ = _cases(tokenizer_path)["gpt_pretraining"]
    before = {name: p.clone() for name, p in task.state_dict().items()}
    scores = few_shot_accuracy(ProjectLM(task.eval()), train, train[:6], [0, 2], verbalisers)
    assert set(scores) == {0, 2} and all(0 <= v <= 1 for v in scores.values())
    assert all(torch.equal(before[name], p) for name, p in task.state_dict().items())


def test_a_hub_language_model_offline_is_one_clear_error(offline_hub):
    from transformer_lab.errors import TransformerLabError
    from transformer_lab.inference.few_shot import HuggingFaceLM

    with pytest.raises(TransformerLabError, match="model=gpt2: cannot load it .*offline\\? pass a local folder"):
        HuggingFaceLM.load("gpt2")


def write_sst2(folder, rows: dict[str, list[tuple[str, str]]]):
    folder.mkdir(parents=True, exist_ok=True)
    for name, examples in rows.items():
        (folder / name).write_text("sentence\tlabel\n" + "".join(f"{t}\t{label}\n" for t, label in examples))
    return folder


@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_the_few_shot_command_writes_accuracy_per_k_and_an_mlflow_run(tokenizer_path, tmp_path):
    import json
    import os

    from conftest import PYTHON, ROOT, run
    from mlflow import MlflowClient
    from test_inference import _cases
    from test_pipelines import save_checkpoint

    task, _ = _cases(tokenizer_path)["gpt_pretraining"]
    checkpoint = tmp_path / "gpt.ckpt"
    save_checkpoint(task, checkpoint)
    examples = [(f"show me flights {i}", str(i % 2)) for i in range(12)]
    data = write_sst2(tmp_path / "sst2", {"train.tsv": examples, "dev.tsv": examples[:5]})
    command = [PYTHON, ROOT / "pipelines/few_shot.py", f"model={checkpoint}", "task=sst2",
               f"few_shot_task.data_dir={data}", "shots=0,1,3", "examples=4", f"out={tmp_path / 'few.json'}",
               f"hydra.run.dir={tmp_path / 'run'}"]
    result = run(command)
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads((tmp_path / "few.json").read_text())
    assert list(written["accuracy_by_shots"]) == ["0", "1", "3"] and written["examples"] == 4
    assert written["majority"] == 0.5 and "3-shot accuracy" in result.stdout
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    [logged] = client.search_runs([client.get_experiment_by_name("few_shot").experiment_id])
    assert logged.data.params["task"] == "sst2" and logged.info.status == "FINISHED"
    assert logged.data.metrics["accuracy_3_shot"] == written["accuracy_by_shots"]["3"]

    (data / "dev.tsv").write_text("sentence\tlabel\na fine film\tmaybe\n")  # a label SST-2 does not have
    bad = run(command)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        f"error: {data / 'dev.tsv'}:2: expected 'sentence<TAB>0|1'"]
