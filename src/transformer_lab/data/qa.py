"""Extractive question answering (SQuAD v1.1 style): three sources, one schema, one DataModule.

Schema of an example: {"id", "question", "context", "answer_text", "answer_start" (a character
offset into context), "answers" (every gold answer text; SQuAD's dev set has several)}.

A feature is `[CLS] question [SEP] passage [SEP]` (segments 0 / 1) with the answer as start and
end token positions, and each passage token's character span in the context, so that a
predicted token span maps back to `context[start:end]` without detokenising.

Training and scoring cut long passages at the end to fit max_len. A training example whose
answer no longer fits is dropped (it cannot teach a span); a validation or test example is kept
with start = end = 0 ([CLS]) so its loss is defined, and it counts as a miss in EM/F1, as the
answer is not in what the model reads. Prediction reads a long passage whole, in overlapping
windows (passage_windows; doc_stride tokens shared), and answers with the best span of any window.
"""

from __future__ import annotations

import collections
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from tokenizers import Tokenizer
from torch.utils.data import DataLoader

from transformer_lab.data.bert import BertTokenizerPreprocessor, encode_pair, pad_batch
from transformer_lab.data.hub import load_hub_dataset
from transformer_lab.data.tokenizers import load_tokenizer
from transformer_lab.errors import DataError, TransformerLabError
from transformer_lab.utils.io import decode_utf8

SPLITS = ("train", "validation", "test")
NO_OFFSET = (-1, -1)  # question, special and padding positions: not part of the passage


def check_answer(context: str, text: str, start: int, where: str) -> None:
    """answer_start must point at the answer text; `where` names the record in the error."""
    if not text:
        raise DataError(f"{where}: empty answer text")
    if not isinstance(start, int) or context[start:start + len(text)] != text:
        found = context[start:start + len(text)] if isinstance(start, int) else start
        raise DataError(f"{where}: answer_start={start} points at {found!r}, not the answer {text!r}")


# --------------------------------------------------------------------------- builtin source
# Short biographies. Each person is born somewhere in some year, works as something somewhere,
# collects something and later moves: two cities and two years per person, so "born" vs
# "moved" decides which one answers a question. With several people per passage, the name in
# the question decides whom it is about. `facts` leaves sentences (and their questions) out.

# Common words that small WordPiece vocabularies keep whole (the pipeline's news-trained one,
# BERT's own): a name or city split into pieces is recognised only from its context, which a
# tiny BERT from scratch takes many times longer to learn (a pre-trained one knows it).
FIRST_NAMES = [  # (name, pronoun set)
    ("Sarah", "f"), ("Anne", "f"), ("Helen", "f"), ("Laura", "f"), ("Julia", "f"), ("Margaret", "f"),
    ("Elizabeth", "f"), ("Rose", "f"), ("John", "m"), ("Peter", "m"), ("David", "m"), ("Michael", "m"),
    ("Paul", "m"), ("Mark", "m"), ("Robert", "m"), ("Andrew", "m"), ("Simon", "m"), ("Tony", "m"),
    ("Kevin", "m"), ("Oscar", "m"), ("Daniel", "m"), ("Henry", "m"), ("Victor", "m"), ("Omar", "m"),
    ("Richard", "m"), ("George", "m"), ("Frank", "m"), ("Philip", "m"), ("Ian", "m"), ("Matthew", "m"),
]
LAST_NAMES = [
    "Garcia", "Jones", "Williams", "Taylor", "Howard", "Clark", "Lee", "King", "Hill", "Ward", "Murray",
    "Walker", "Scott", "Davis", "Anderson", "Jackson", "Harris", "Evans", "Baker", "Bell", "Reid", "Hunter",
]
CITIES = [
    "Sydney", "Melbourne", "Canberra", "London", "Paris", "Washington", "Jakarta", "Perth", "Brisbane",
    "Adelaide", "Hobart", "Rome", "Delhi", "Kabul", "Boston", "Singapore", "Auckland", "Jerusalem", "Miami",
    "Hong Kong", "New York",
]
JOBS = [  # (article, job)
    ("a", "doctor"), ("a", "lawyer"), ("a", "farmer"), ("a", "pilot"), ("a", "nurse"), ("a", "journalist"),
    ("a", "judge"), ("a", "scientist"), ("a", "coach"), ("a", "priest"), ("a", "manager"), ("a", "director"),
    ("a", "professor"), ("a", "police officer"), ("an", "actor"), ("an", "editor"), ("an", "economist"),
]
WORKPLACES = [
    "the private hospital", "a local newspaper", "the central bank", "the high court", "the airport",
    "a small church", "the hotel", "the university", "the police station", "a shop", "the power station", "the prison",
    "the state parliament", "the city council", "an old mine", "the national theatre",
]
COLLECTIONS = ["old cars", "model trains", "rare plants", "old cards", "shoes", "boats", "old pictures",
               "old computers", "model planes", "old weapons"]
PRONOUNS = {"f": {"Pron": "She", "pron": "she", "poss": "her"}, "m": {"Pron": "He", "pron": "he", "poss": "his"}}

# fact: sentence templates. The birth sentence comes first and names the person; the others
# follow in a random order and use pronouns, so the name occurs once per person.
SENTENCES = {
    "birth": ["{name} was born in {city} in {year}.", "{name} was born in {year} in {city}.",
              "In {year}, {name} was born in {city}."],
    "work": ["{Pron} worked as {article} {job} at {workplace}.",
             "For many years {pron} was {article} {job} at {workplace}.",
             "At {workplace}, {pron} worked as {article} {job}."],
    "collection": ["{Pron} collected {collection}.", "In {poss} spare time {pron} collected {collection}."],
    "move": ["In {move_year}, {pron} moved to {new_city}.", "{Pron} moved to {new_city} in {move_year}."],
}
QUESTIONS = {  # fact: {answer field: question templates}
    "birth": {"city": ["Where was {name} born?", "In which city was {name} born?", "What is the birthplace of {name}?"],
              "year": ["When was {name} born?", "In what year was {name} born?", "What year was {name} born in?"],
              "name": ["Who was born in {city}?"]},
    "work": {"job": ["What did {name} work as?", "What was the job of {name}?", "What was {name}'s profession?"],
             "workplace": ["Where did {name} work?", "At which place did {name} work?"],
             "name": ["Who worked as {article} {job}?", "Who worked at {workplace}?"]},
    "collection": {"collection": ["What did {name} collect?", "What did {name} collect in {poss} spare time?"],
                   "name": ["Who collected {collection}?"]},
    "move": {"new_city": ["Where did {name} move to?", "To which city did {name} move?"],
             "move_year": ["When did {name} move to {new_city}?", "In which year did {name} move?"],
             "name": ["Who moved to {new_city}?"]},
}
_FIELD = re.compile(r"\{(\w+)\}")


def _fill(template: str, values: dict, offset: int) -> tuple[str, dict[str, int]]:
    """The template with values filled in, and the character offset of each field (plus `offset`)."""
    text, starts, last = "", {}, 0
    for match in _FIELD.finditer(template):
        text += template[last:match.start()]
        starts[match.group(1)] = offset + len(text)
        text += values[match.group(1)]
        last = match.end()
    return text + template[last:], starts


def generate_passage(rng: random.Random, people_per_passage: int = 1,
                     facts: tuple[str, ...] = tuple(SENTENCES)) -> tuple[str, list[tuple[dict, dict]]]:
    """One passage and, per person, (their values, the character offset of each value in it)."""
    # Values are drawn without replacement, so every answer is unique within its passage.
    names, cities, jobs, places, hobbies = (rng.sample(pool, len(pool)) for pool in
                                            (FIRST_NAMES, CITIES, JOBS, WORKPLACES, COLLECTIONS))
    years = rng.sample(range(1900, 1960), people_per_passage)
    used_years = set(years)
    text, people = "", []
    for _ in range(people_per_passage):
        (first, gender), (article, job), year = names.pop(), jobs.pop(), years.pop()
        move_year = rng.choice([y for y in range(year + 18, year + 51) if y not in used_years])
        used_years.add(move_year)
        person = {"name": f"{first} {rng.choice(LAST_NAMES)}", **PRONOUNS[gender], "city": cities.pop(),
                  "year": str(year), "article": article, "job": job, "workplace": places.pop(),
                  "collection": hobbies.pop(), "new_city": cities.pop(), "move_year": str(move_year)}
        starts = {}
        others = rng.sample([fact for fact in facts if fact != "birth"], len(facts) - 1)
        for fact in ["birth", *others]:
            text += " " if text else ""
            sentence, sentence_starts = _fill(rng.choice(SENTENCES[fact]), person, len(text))
            text += sentence
            starts.update(sentence_starts)
        people.append((person, starts))
    return text, people


def generate_qa(seed: int = 0, n_train: int = 3000, n_validation: int = 300, n_test: int = 300,
                people_per_passage: int = 1, questions_per_passage: int = 4,
                facts: list[str] | tuple[str, ...] = tuple(SENTENCES)) -> dict[str, list[dict]]:
    """The builtin data set: generated biographies and questions about them, SQuAD-style records."""
    facts = tuple(dict.fromkeys(facts))
    if "birth" not in facts or not set(facts) <= set(SENTENCES):
        raise TransformerLabError(f"facts={list(facts)}: choose from {', '.join(SENTENCES)}; birth (the sentence "
                                  "that names the person) is required")
    if not 1 <= people_per_passage <= 8:
        raise TransformerLabError(f"people_per_passage={people_per_passage}: must be between 1 and 8")
    # Each answer field equally likely; "who" questions take a template of any fact present.
    questions = collections.defaultdict(list)
    for fact in facts:
        for field, templates in QUESTIONS[fact].items():
            questions[field] += templates
    if not 1 <= questions_per_passage <= people_per_passage * len(questions):
        raise TransformerLabError(f"questions_per_passage={questions_per_passage}: between 1 and "
                                  f"{people_per_passage * len(questions)} (people x answer fields)")
    splits = {}
    for split_index, (split, size) in enumerate(zip(SPLITS, (n_train, n_validation, n_test))):
        rng = random.Random(f"{seed}-{split_index}")  # each split its own stream: sizes do not shift the others
        examples = []
        while len(examples) < size:
            context, people = generate_passage(rng, people_per_passage, facts)
            asked = rng.sample([(p, field) for p in range(len(people)) for field in questions], questions_per_passage)
            for person_index, field in asked[: size - len(examples)]:
                person, starts = people[person_index]
                answer = person[field]
                example = {"id": f"{split}-{len(examples)}", "question": rng.choice(questions[field]).format(**person),
                           "context": context, "answer_text": answer, "answer_start": starts[field],
                           "answers": [answer]}
                check_answer(context, answer, example["answer_start"], f"builtin {example['id']}")
                examples.append(example)
        splits[split] = examples
    return splits


# --------------------------------------------------------------------------- local and hub sources
def _get(record, key: str, kind: type, where: str):
    value = record.get(key) if isinstance(record, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        got = "missing" if value is None else f"a {type(value).__name__}"
        raise DataError(f"{where}: field {key!r} is {got}, expected {kind.__name__}")
    return value


def read_squad(path: str | Path) -> list[dict]:
    """One SQuAD v1.1 JSON file (data -> paragraphs -> context, qas -> id, question, answers)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found (expected SQuAD v1.1 JSON)")
    try:
        data = json.loads(decode_utf8(path, path.read_bytes()))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    examples = []
    for a, article in enumerate(_get(data, "data", list, str(path))):
        for p, paragraph in enumerate(_get(article, "paragraphs", list, f"{path}: data[{a}]")):
            where = f"{path}: data[{a}].paragraphs[{p}]"
            context = _get(paragraph, "context", str, where)
            for q, qa in enumerate(_get(paragraph, "qas", list, where)):
                qa_where = f"{where}.qas[{q}]"
                qa_id, question = _get(qa, "id", str, qa_where), _get(qa, "question", str, qa_where)
                answers = _get(qa, "answers", list, qa_where)
                if not answers:
                    raise DataError(f"{path}: qa {qa_id!r}: no answers "
                                    "(SQuAD v2 unanswerable questions are not supported)")
                for n, answer in enumerate(answers):
                    text = _get(answer, "text", str, f"{path}: qa {qa_id!r} answers[{n}]")
                    start = _get(answer, "answer_start", int, f"{path}: qa {qa_id!r} answers[{n}]")
                    check_answer(context, text, start, f"{path}: qa {qa_id!r}")
                examples.append({"id": qa_id, "question": question, "context": context,
                                 "answer_text": answers[0]["text"], "answer_start": answers[0]["answer_start"],
                                 "answers": [answer["text"] for answer in answers]})
    if not examples:
        raise DataError(f"{path}: no questions found")
    return examples


def split_articles(path: str | Path, n_train: int, output_dir: str | Path, seed: int = 0) -> dict[str, Path]:
    """A SQuAD v1.1 file split by article (never by question: the questions of one paragraph share its
    answers' context): n_train articles drawn with `seed` to train.json, the rest to heldout.json,
    each a SQuAD v1.1 file of its own. Returns the two paths."""
    read_squad(path)  # the whole file checked first: a bad record names itself here, not halfway through
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    articles = list(data["data"])
    if not 0 < n_train < len(articles):
        raise DataError(f"{path}: {len(articles)} articles; cannot keep {n_train} for training and the rest held out")
    order = list(range(len(articles)))
    random.Random(seed).shuffle(order)
    chosen = set(order[:n_train])
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {"train": output_dir / "train.json", "heldout": output_dir / "heldout.json"}
    for name, keep in (("train", True), ("heldout", False)):
        part = [article for i, article in enumerate(articles) if (i in chosen) == keep]
        paths[name].write_text(json.dumps({"version": data.get("version", "1.1"), "data": part}), encoding="utf-8")
    return paths


def examples_from_hub_rows(rows, where: str) -> list[dict]:
    """Rows of the hub's SQuAD (id, title, context, question, answers{text, answer_start})."""
    examples = []
    for row in rows:
        texts, starts = row["answers"]["text"], row["answers"]["answer_start"]
        if not texts:
            raise DataError(f"{where}: qa {row['id']!r}: no answers")
        for text, start in zip(texts, starts):
            check_answer(row["context"], text, start, f"{where}: qa {row['id']!r}")
        examples.append({"id": row["id"], "question": row["question"], "context": row["context"],
                         "answer_text": texts[0], "answer_start": starts[0], "answers": list(texts)})
    return examples


def load_qa(source: str, local_files: dict | None = None, hub_id: str = "rajpurkar/squad",
            builtin: dict | None = None) -> dict[str, list[dict]]:
    """train / validation / test examples from one source. SQuAD's test set is not public, so
    for local and hub sources test is the validation (dev) set unless local_files names one."""
    if source == "builtin":
        return generate_qa(**(builtin or {}))
    if source == "local":
        files = dict(local_files or {})
        missing = [split for split in ("train", "validation") if not files.get(split)]
        if missing:
            raise DataError(f"data.source=local needs data.local_files.{missing[0]}=FILE (SQuAD v1.1 JSON)")
        splits = {split: read_squad(files[split]) for split in ("train", "validation")}
        splits["test"] = read_squad(files["test"]) if files.get("test") else splits["validation"]
        return splits
    if source == "hub":
        dataset = load_hub_dataset(hub_id, local_hint="data.local_files.train=FILE data.local_files.validation=FILE")
        splits = {split: examples_from_hub_rows(dataset[split], f"{hub_id} {split}")
                  for split in ("train", "validation")}
        return {**splits, "test": splits["validation"]}
    raise DataError(f"data.source={source!r} is not one of builtin, local, hub")


# --------------------------------------------------------------------------- features
def char_to_token_span(offsets: list[tuple[int, int]], start_char: int, end_char: int) -> tuple[int, int] | None:
    """The first and last token that overlap the characters [start_char, end_char), or None."""
    tokens = [i for i, (start, end) in enumerate(offsets) if start < end_char and end > start_char]
    return (tokens[0], tokens[-1]) if tokens else None


def passage_windows(n_tokens: int, room: int, doc_stride: int | None) -> list[tuple[int, int]]:
    """[start, end) token spans of a passage of n_tokens, each at most `room` tokens, each next one
    starting doc_stride tokens before the end of the one before (BERT's reading of a document
    longer than it reads: every token is read, and read with context on both sides in some window).
    doc_stride=None: the first window only (the passage cut, as training reads it)."""
    windows = [(0, min(room, n_tokens))]
    while doc_stride is not None and windows[-1][1] < n_tokens:
        start = windows[-1][1] - doc_stride
        windows.append((start, min(start + room, n_tokens)))
    return windows


def encode_examples(examples: list[dict], tokenizer: Tokenizer, specials: dict[str, int], max_len: int,
                    max_question_tokens: int, doc_stride: int | None = None) -> list[dict]:
    """The features of examples (see the module docstring), each with "example", the index of its
    example: one per example with doc_stride=None (a long passage cut at max_len), else one per
    window of its passage (passage_windows), consecutive windows sharing doc_stride tokens.
    Examples without "answer_start" (questions to predict) get start = end = 0."""
    smallest_room = max_len - max_question_tokens - 3  # [CLS] q [SEP] p [SEP] with the longest question
    if doc_stride is not None and not 0 <= doc_stride < smallest_room:
        raise TransformerLabError(f"doc_stride={doc_stride}: must be below the {smallest_room} passage tokens a "
                                  f"window holds (max_len={max_len} less max_question_tokens={max_question_tokens} "
                                  "and 3 special tokens), and at least 0")
    # SQuAD asks ~5 questions per paragraph: tokenise each distinct context once.
    contexts = list(dict.fromkeys(e["context"] for e in examples))
    passages = dict(zip(contexts, tokenizer.encode_batch(contexts, add_special_tokens=False)))
    questions = tokenizer.encode_batch([e["question"] for e in examples], add_special_tokens=False)
    features = []
    for index, (example, question) in enumerate(zip(examples, questions)):
        q_ids = question.ids[:max_question_tokens]
        passage = passages[example["context"]]
        span = None
        if "answer_start" in example:
            span = char_to_token_span(passage.offsets, example["answer_start"],
                                      example["answer_start"] + len(example["answer_text"]))
        first = len(q_ids) + 2  # the passage's first position
        for start, end in passage_windows(len(passage.ids), max_len - len(q_ids) - 3, doc_stride):
            input_ids, segment_ids = encode_pair(q_ids, passage.ids[start:end], specials)
            offsets = [NO_OFFSET] * first + [tuple(o) for o in passage.offsets[start:end]] + [NO_OFFSET]
            in_passage = span is not None and start <= span[0] and span[1] < end
            answer = (first + span[0] - start, first + span[1] - start) if in_passage else (0, 0)
            features.append({"input_ids": input_ids, "segment_ids": segment_ids, "offsets": offsets,
                             "start_position": answer[0], "end_position": answer[1],
                             "answer_in_passage": in_passage, "example": index, "context": example["context"],
                             "answers": example.get("answers", [])})
    return features


def collate_qa(features: list[dict], pad_id: int) -> dict:
    """Padded tensors plus, for decoding and scoring, each position's character span in the
    context ((-1, -1) outside the passage), the contexts and the gold answers."""
    batch = pad_batch(features, pad_id)
    length = batch["input_ids"].shape[1]
    batch["offsets"] = torch.tensor([f["offsets"] + [NO_OFFSET] * (length - len(f["offsets"])) for f in features])
    batch["start_positions"] = torch.tensor([f["start_position"] for f in features])
    batch["end_positions"] = torch.tensor([f["end_position"] for f in features])
    batch["context"] = [f["context"] for f in features]
    batch["answers"] = [f["answers"] for f in features]
    return batch


@dataclass(eq=False)
class QAPreprocessor(BertTokenizerPreprocessor):
    """(question, context) -> `[CLS] question [SEP] passage [SEP]` features with each passage
    token's character span.

    State: tokenizer (its JSON, the one BERT was pre-trained with), max_len, max_question_tokens."""

    tokenizer: Tokenizer
    max_len: int = 384
    max_question_tokens: int = 64

    def __post_init__(self):
        if self.max_question_tokens > self.max_len - 4:
            raise TransformerLabError(f"max_question_tokens={self.max_question_tokens} leaves no passage in "
                                      f"max_len={self.max_len} tokens; lower it or raise max_len")
        super().__post_init__()

    def encode(self, examples: list[dict], doc_stride: int | None = None) -> list[dict]:
        """Features of examples {"question", "context"} (and, to train or score, the answer fields);
        with doc_stride, one per window of a long passage (encode_examples)."""
        return encode_examples(examples, self.tokenizer, self.specials, self.max_len, self.max_question_tokens,
                               doc_stride)

    @property
    def default_doc_stride(self) -> int:
        """Half the passage tokens a window holds with the longest question: a token at the end of
        one window sits near the middle of the next."""
        return (self.max_len - self.max_question_tokens - 3) // 2

    def collate(self, features: list[dict]) -> dict:
        return collate_qa(features, self.specials["pad"])


class QADataModule(L.LightningDataModule):
    """SQuAD-style examples tokenised with the WordPiece tokenizer BERT was pre-trained with."""

    preprocessor: QAPreprocessor

    def __init__(self, tokenizer_path: str, source: str = "builtin", local_files: dict | None = None,
                 hub_id: str = "rajpurkar/squad", builtin: dict | None = None, max_len: int = 384,
                 max_question_tokens: int = 64, batch_size: int = 32, eval_batch_size: int = 128,
                 max_examples: int | None = None, num_workers: int = 0):
        super().__init__()
        self.source, self.local_files, self.hub_id = source, dict(local_files or {}), hub_id
        self.builtin = dict(builtin or {})
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.max_examples, self.num_workers = max_examples, num_workers
        # The task keeps this preprocessor's state, so that predict() encodes text the way training did.
        self.preprocessor = QAPreprocessor(load_tokenizer(tokenizer_path), max_len, max_question_tokens)
        self.features: dict[str, list[dict]] = {}

    def model_kwargs(self) -> dict:
        p = self.preprocessor
        return {"vocab_size": p.tokenizer.get_vocab_size(), "pad_id": p.specials["pad"]}

    def setup(self, stage: str | None = None) -> None:
        if self.features:
            return
        splits = load_qa(self.source, self.local_files, self.hub_id, self.builtin)
        for split, examples in splits.items():
            features = self.preprocessor.encode(examples[: self.max_examples])
            outside = sum(not f["answer_in_passage"] for f in features)
            if split == "train":
                features = [f for f in features if f["answer_in_passage"]]
            if outside:
                what = "dropped" if split == "train" else "kept as misses"
                rank_zero_info(f"{split}: {outside} of {len(examples[: self.max_examples])} answers lie beyond "
                               f"max_len={self.preprocessor.max_len} tokens ({what})")
            if not features:
                raise DataError(f"{split}: no examples left (answers beyond max_len={self.preprocessor.max_len}?)")
            self.features[split] = features

    def _loader(self, split: str, batch_size: int, shuffle: bool = False) -> DataLoader:
        return DataLoader(self.features[split], batch_size, shuffle=shuffle, collate_fn=self.preprocessor.collate,
                          num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation", self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.eval_batch_size)
