"""Few-shot prompting of a causal language model, GPT-3 style: K demonstrations from a task's
training split, then the query; the answer is the label whose verbaliser the model finds most
likely after the prompt. No gradient step: the weights are the same before and after.

    lm = load_language_model("artifacts/gpt/pretrain")  # a GPT of this project, a GPT-2 folder, hf:gpt2
    few_shot_accuracy(lm, train, dev, shots=[0, 1, 4], verbalisers={"0": " negative", "1": " positive"})

From the command line: `python pipelines/few_shot.py model=MODEL task=sst2 shots=0,1,4,16`.

A prompt longer than the model's context keeps its end (the query and the latest demonstrations).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer_lab.errors import TransformerLabError

TEMPLATE = "Review: {text}\nSentiment:{verbaliser}\n\n"  # the verbaliser brings its own leading space


def build_prompt(demonstrations: list[dict], query: str, verbalisers: dict[str, str],
                 template: str = TEMPLATE) -> str:
    """The demonstrations ({"text", "label"}) with their verbalisers, then the query's open line
    (the template filled with an empty verbaliser, its trailing line breaks cut)."""
    shown = "".join(template.format(text=d["text"], verbaliser=verbalisers[d["label"]]) for d in demonstrations)
    return shown + template.format(text=query, verbaliser="").rstrip("\n")


def pick_demonstrations(train: list[dict], k: int, query: str, rng: random.Random) -> list[dict]:
    """k training examples drawn for this query, never the query's own text."""
    pool = [e for e in rng.sample(train, min(len(train), k + 8)) if e["text"] != query]
    return pool[:k]


@dataclass
class ProjectLM:
    """A GPT checkpoint of this project (its BPE or char tokenizer travels inside)."""

    task: object

    @classmethod
    def load(cls, model: str) -> ProjectLM:
        from transformer_lab.inference.pipeline import load_model

        loaded = load_model(model)
        if "text-generation" not in loaded.tasks:  # a causal LM: what the registry says reads text-generation
            raise TransformerLabError(f"model={model} is a {loaded.family} model; few-shot prompting needs a GPT LM "
                                      "(a model that does text-generation)")
        return cls(loaded.task)

    @property
    def max_len(self) -> int:
        return self.task.model.config.max_len

    def encode(self, text: str) -> list[int]:
        return self.task.preprocessor.tokenizer.encode(text, add_special_tokens=False).ids

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.task.model(input_ids).logits


@dataclass
class HuggingFaceLM:
    """A `transformers` causal LM folder (GPT-2's zero-shot setting), or a hub name when online."""

    model: object
    tokenizer: object

    @classmethod
    def load(cls, name_or_folder: str) -> HuggingFaceLM:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            return cls(AutoModelForCausalLM.from_pretrained(name_or_folder).eval(),
                       AutoTokenizer.from_pretrained(name_or_folder))
        except OSError as err:
            raise TransformerLabError(f"model={name_or_folder}: cannot load it ({str(err).splitlines()[0][:160]}); "
                                      "offline? pass a local folder with config.json, weights and tokenizer") from None

    @property
    def max_len(self) -> int:
        return self.model.config.n_positions

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids).logits


def load_language_model(source: str) -> ProjectLM | HuggingFaceLM:
    """`hf:NAME` (the hub), a `transformers` model folder (config.json inside), else anything
    this project's models load from: a GPT checkpoint, its stage folder, an MLflow run or model."""
    if source.startswith("hf:"):
        return HuggingFaceLM.load(source[3:])
    if (Path(source) / "config.json").is_file():
        return HuggingFaceLM.load(source)
    return ProjectLM.load(source)


@torch.no_grad()
def label_log_likelihoods(lm, prompt: str, verbalisers: dict[str, str]) -> dict[str, float]:
    """log p(verbaliser | prompt) for every label, the prompt cut from the left to fit the context."""
    prompt_ids = lm.encode(prompt)
    scores = {}
    for label, verbaliser in verbalisers.items():
        answer = lm.encode(verbaliser)
        ids = (prompt_ids + answer)[-lm.max_len:]
        logits = lm.logits(torch.tensor([ids]))[0].log_softmax(-1)
        positions = range(len(ids) - len(answer) - 1, len(ids) - 1)  # each answer token from the one before
        scores[label] = sum(float(logits[p, t]) for p, t in zip(positions, answer))
    return scores


def few_shot_accuracy(lm, train: list[dict], evaluation: list[dict], shots: list[int],
                      verbalisers: dict[str, str], seed: int = 0, template: str = TEMPLATE,
                      progress: bool = False) -> dict[int, float]:
    """Accuracy on `evaluation` ({"text", "label"}) for each K; demonstrations drawn per query,
    seeded; a progress bar per K if asked."""
    from tqdm import tqdm

    results = {}
    for k in shots:
        rng, correct = random.Random(seed), 0
        for example in tqdm(evaluation, desc=f"{k}-shot", unit="query", disable=not progress, leave=False):
            shown = pick_demonstrations(train, k, example["text"], rng)
            prompt = build_prompt(shown, example["text"], verbalisers, template)
            scores = label_log_likelihoods(lm, prompt, verbalisers)
            correct += max(scores, key=scores.get) == example["label"]
        results[k] = correct / len(evaluation)
    return results


def majority_accuracy(evaluation: list[dict]) -> float:
    """What always answering the most frequent label scores: the floor a prompt must beat."""
    counts = Counter(e["label"] for e in evaluation)
    return max(counts.values()) / len(evaluation)


def read_sst2(path: str | Path) -> list[dict]:
    """GLUE SST-2 TSV (sentence<TAB>label, a header row) as {"text", "label"}."""
    path = Path(path)
    if not path.is_file():
        raise TransformerLabError(f"{path}: no such file (GLUE SST-2's train.tsv / dev.tsv)")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()[1:], 2):
        text, _, label = line.rpartition("\t")
        if label not in ("0", "1") or not text:
            raise TransformerLabError(f"{path}:{number}: expected 'sentence<TAB>0|1'")
        rows.append({"text": text.strip(), "label": label})
    return rows
