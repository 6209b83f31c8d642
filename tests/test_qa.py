"""Extractive question answering: the generated set, SQuAD files, char <-> token spans, span
decoding against brute force, SQuAD's EM/F1, and a tiny training run through the real configs."""

import itertools
import json

import pytest
import torch
from tokenizers import Tokenizer

from transformer_lab.data.bert import special_ids
from transformer_lab.data.qa import QADataModule, char_to_token_span, encode_examples, generate_qa, load_qa, read_squad
from transformer_lab.data.tokenizers import train_tokenizer
from transformer_lab.errors import DataError, TransformerLabError
from transformer_lab.tasks.question_answering import (
    QuestionAnsweringTask,
    best_over_golds,
    best_spans,
    exact_match,
    f1_score,
    normalize_answer,
    spans_to_answers,
)

SMALL = {"n_train": 200, "n_validation": 40, "n_test": 40}


@pytest.fixture(scope="module")
def tokenizer():
    # enough passages that most names and places are whole tokens, as in a real vocabulary
    passages = sorted({e["context"] for e in generate_qa(seed=1, n_train=2000, n_validation=0, n_test=0)["train"]})
    return train_tokenizer("wordpiece", passages, 500, lowercase=True)


@pytest.fixture(scope="module")
def tokenizer_path(tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def squad_json(contexts_and_qas) -> dict:
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": [{"id": qa_id, "question": question,
                                      "answers": [{"text": text, "answer_start": start}]}
                                     for qa_id, question, text, start in qas]}
        for context, qas in contexts_and_qas]}]}


# --------------------------------------------------------------------------- data
def test_generated_answers_point_at_their_text_and_are_seeded():
    splits = generate_qa(seed=3, **SMALL)
    assert {k: len(v) for k, v in splits.items()} == {"train": 200, "validation": 40, "test": 40}
    for example in itertools.chain(*splits.values()):
        start = example["answer_start"]
        assert example["context"][start:start + len(example["answer_text"])] == example["answer_text"]
        assert example["answers"] == [example["answer_text"]]
    assert generate_qa(seed=3, **SMALL) == splits
    assert generate_qa(seed=4, **SMALL)["train"] != splits["train"]
    assert len({e["id"] for e in itertools.chain(*splits.values())}) == 280
    # a bigger train split does not change validation and test
    assert generate_qa(seed=3, **{**SMALL, "n_train": 300})["validation"] == splits["validation"]
    # several templates per field: the same kind of question is asked in different words
    assert len({e["question"].split()[0] for e in splits["train"]}) >= 5
    for example in generate_qa(seed=3, n_train=60, n_validation=0, n_test=0, people_per_passage=3)["train"]:
        start = example["answer_start"]
        assert example["context"][start:start + len(example["answer_text"])] == example["answer_text"]
        assert example["context"].count(example["answer_text"]) == 1  # unique within the passage
    with pytest.raises(TransformerLabError, match="birth"):
        generate_qa(facts=["work"])


def test_answer_spans_map_to_tokens_and_back(tokenizer):
    specials = special_ids(tokenizer)
    examples = generate_qa(seed=5, **SMALL)["train"]
    context = "Lucia Weber moved to São Paulo"  # the answer ends the passage, with accents the tokenizer strips
    examples.append({"id": "end", "question": "Where did Lucia Weber move to?", "context": context,
                     "answer_text": "São Paulo", "answer_start": context.index("São"), "answers": ["São Paulo"]})
    features = encode_examples(examples, tokenizer, specials, max_len=128, max_question_tokens=32)
    for feature, example in zip(features, examples):
        assert feature["answer_in_passage"]
        start, end = feature["start_position"], feature["end_position"]
        assert feature["segment_ids"][start] == 1 and start <= end < len(feature["input_ids"]) - 1
        char_start, char_end = feature["offsets"][start][0], feature["offsets"][end][1]
        assert example["context"][char_start:char_end] == example["answer_text"]


def test_truncated_passages_keep_answers_that_fit_and_mark_the_rest(tokenizer):
    specials = special_ids(tokenizer)
    context = "Maria Lopez was born in Lisbon. " + "She collected stamps. " * 40 + "She moved to Oslo."
    early = {"question": "Where was Maria Lopez born?", "context": context, "answer_text": "Lisbon",
             "answer_start": context.index("Lisbon"), "answers": ["Lisbon"]}
    late = {"question": "Where did Maria Lopez move to?", "context": context, "answer_text": "Oslo",
            "answer_start": context.index("Oslo"), "answers": ["Oslo"]}
    kept, cut = encode_examples([early, late], tokenizer, specials, max_len=48, max_question_tokens=16)
    for feature in (kept, cut):
        assert len(feature["input_ids"]) == 48 == len(feature["offsets"])
    assert kept["answer_in_passage"]
    assert context[kept["offsets"][kept["start_position"]][0]:kept["offsets"][kept["end_position"]][1]] == "Lisbon"
    assert not cut["answer_in_passage"] and cut["start_position"] == cut["end_position"] == 0
    # the last kept passage token is followed by [SEP]; everything outside the passage has no offset
    passage = [i for i, offset in enumerate(kept["offsets"]) if offset[0] >= 0]
    assert kept["input_ids"][passage[-1] + 1] == specials["sep"] and passage == list(range(passage[0], 47))


def test_long_passages_read_in_windows_cover_them_with_overlaps_of_doc_stride(tokenizer):
    specials = special_ids(tokenizer)
    context = "Maria Lopez was born in Lisbon. " + "She collected stamps. " * 40 + "She moved to Oslo."
    late = {"question": "Where did Maria Lopez move to?", "context": context, "answer_text": "Oslo",
            "answer_start": context.index("Oslo"), "answers": ["Oslo"]}
    features = encode_examples([late, {"question": "Who?", "context": "Oslo."}], tokenizer, specials, max_len=48,
                               max_question_tokens=16, doc_stride=8)
    assert [f["example"] for f in features].count(1) == 1  # a short passage: one window
    windows = [[tuple(o) for o in f["offsets"] if o[0] >= 0] for f in features if f["example"] == 0]
    passage = [tuple(o) for o in tokenizer.encode(context, add_special_tokens=False).offsets]
    assert len(windows) > 2 and all(len(f["input_ids"]) <= 48 for f in features)
    assert windows[0][0] == passage[0] and windows[-1][-1] == passage[-1]
    for before, after in zip(windows, windows[1:]):
        assert after[:8] == before[-8:]  # doc_stride tokens read twice, none skipped
    assert sum(map(len, windows)) - 8 * (len(windows) - 1) == len(passage)
    answered = [f for f in features if f["answer_in_passage"]]
    assert answered and all(f["example"] == 0 for f in answered)
    for feature in answered:
        start, end = feature["offsets"][feature["start_position"]][0], feature["offsets"][feature["end_position"]][1]
        assert context[start:end] == "Oslo"
    with pytest.raises(TransformerLabError, match="doc_stride=29: .* 29 passage tokens"):
        encode_examples([late], tokenizer, specials, max_len=48, max_question_tokens=16, doc_stride=29)


def test_char_to_token_span_on_partial_and_missing_overlap():
    offsets = [(0, 5), (6, 8), (8, 12), (13, 17)]
    assert char_to_token_span(offsets, 6, 12) == (1, 2)
    assert char_to_token_span(offsets, 9, 15) == (2, 3)  # inside words: the tokens that overlap
    assert char_to_token_span(offsets, 5, 6) is None  # only the space


def test_datamodule_drops_training_answers_beyond_max_len_and_keeps_evaluation_ones(tmp_path, tokenizer_path):
    context = "Maria Lopez was born in Lisbon. " + "She collected stamps. " * 40 + "She moved to Oslo."
    qas = [("q1", "Where was Maria Lopez born?", "Lisbon", context.index("Lisbon")),
           ("q2", "Where did Maria Lopez move to?", "Oslo", context.index("Oslo"))]
    for split in ("train", "dev"):
        (tmp_path / f"{split}.json").write_text(json.dumps(squad_json([(context, qas)])))
    files = {"train": str(tmp_path / "train.json"), "validation": str(tmp_path / "dev.json")}
    datamodule = QADataModule(str(tokenizer_path), source="local", local_files=files, max_len=48,
                              max_question_tokens=16)
    datamodule.setup()
    assert [f["answer_in_passage"] for f in datamodule.features["train"]] == [True]
    assert [f["answer_in_passage"] for f in datamodule.features["validation"]] == [True, False]
    assert len(datamodule.features["test"]) == 2  # no test file: the validation set
    batch = next(iter(datamodule.val_dataloader()))
    assert batch["offsets"].shape == (*batch["input_ids"].shape, 2) and batch["answers"] == [["Lisbon"], ["Oslo"]]


def test_local_squad_file_loads_and_bad_records_name_file_and_field(tmp_path):
    context = "Oslo is the capital of Norway. It lies on a fjord."
    good = squad_json([(context, [("a1", "What is the capital of Norway?", "Oslo", 0),
                                  ("a2", "What does Oslo lie on?", "a fjord", context.index("a fjord"))])])
    good["data"][0]["paragraphs"][0]["qas"][0]["answers"].append({"text": "Oslo", "answer_start": 0})
    path = tmp_path / "train.json"
    path.write_text(json.dumps(good))
    examples = read_squad(path)
    assert [(e["id"], e["answer_text"], e["answers"]) for e in examples] == [("a1", "Oslo", ["Oslo", "Oslo"]),
                                                                             ("a2", "a fjord", ["a fjord"])]
    splits = load_qa("local", {"train": str(path), "validation": str(path)})
    assert splits["test"] == splits["validation"] == examples

    missing = json.loads(json.dumps(good))
    del missing["data"][0]["paragraphs"][0]["context"]
    path.write_text(json.dumps(missing))
    with pytest.raises(DataError, match=r"train\.json: data\[0\]\.paragraphs\[0\]: field 'context' is missing"):
        read_squad(path)

    shifted = json.loads(json.dumps(good))
    shifted["data"][0]["paragraphs"][0]["qas"][1]["answers"][0]["answer_start"] += 1
    path.write_text(json.dumps(shifted))
    with pytest.raises(DataError, match=r"train\.json: qa 'a2': answer_start=\d+ points at ' fjord.', not"):
        read_squad(path)

    path.write_text('{"data": [\n{"paragraphs": }]}')
    with pytest.raises(DataError, match=r"train\.json:2: not valid JSON"):
        read_squad(path)
    with pytest.raises(DataError, match="local_files.validation"):
        load_qa("local", {"train": str(path)})


def test_hub_source_offline_is_one_clear_error(offline_hub):
    with pytest.raises(DataError, match=r"could not load 'rajpurkar/squad' from the Hugging Face Hub .*offline\?"):
        load_qa("hub")


# --------------------------------------------------------------------------- decoding and metrics
def brute_force_span(start, end, allowed, max_tokens):
    candidates = [(start[i] + end[j], i, j) for i in range(len(start)) for j in range(i, min(i + max_tokens, len(end)))
                  if allowed[i] and allowed[j]]
    return max(candidates)


def test_best_span_matches_brute_force_on_random_logits():
    generator = torch.Generator().manual_seed(0)
    for max_tokens in (1, 3, 30):
        start, end = torch.randn(16, 20, generator=generator), torch.randn(16, 20, generator=generator)
        allowed = torch.rand(16, 20, generator=generator) < 0.7
        allowed[:, 0] = True  # every row has at least one span
        starts, ends, scores = best_spans(start, end, allowed, max_tokens)
        for row in range(16):
            score, i, j = brute_force_span(start[row].tolist(), end[row].tolist(), allowed[row].tolist(), max_tokens)
            assert (starts[row].item(), ends[row].item()) == (i, j)
            assert scores[row].item() == pytest.approx(score)
            assert starts[row] <= ends[row] < starts[row] + max_tokens


def test_spans_map_to_character_offsets_in_the_context():
    offsets = torch.tensor([[[-1, -1], [0, 4], [5, 8], [8, 10], [11, 15], [-1, -1]]])
    [answer] = spans_to_answers(torch.tensor([2]), torch.tensor([3]), offsets, ["Some Día's text"])
    assert answer == {"answer": "Día's", "start": 5, "end": 10}  # sliced: case and accent kept


@pytest.mark.parametrize("prediction, gold, em, f1", [
    ("The Lisbon!", "lisbon", 1.0, 1.0),
    ("a chemist", "chemist", 1.0, 1.0),
    ("old  maps", "Old maps.", 1.0, 1.0),
    ("old maps", "maps", 0.0, 2 / 3),
    ("the city museum", "city museum of art", 0.0, 2 * (2 / 2) * (2 / 4) / (2 / 2 + 2 / 4)),
    ("Oslo", "Lisbon", 0.0, 0.0),
    ("the", "a", 1.0, 0.0),  # both normalise to nothing: v1.1 scores F1 0
])
def test_squad_exact_match_and_f1(prediction, gold, em, f1):
    assert exact_match(prediction, gold) == em
    assert f1_score(prediction, gold) == pytest.approx(f1)


def test_normalisation_and_best_gold():
    assert normalize_answer("  The Old-Town (an) Museum, ") == "oldtown museum"
    assert best_over_golds(f1_score, "old maps", ["stamps", "maps", "old maps"]) == 1.0
    assert best_over_golds(exact_match, "x", []) == 0.0


# --------------------------------------------------------------------------- training
@pytest.fixture
def one_thread():
    """The tiny model gains nothing from a second thread, and on two cores shared with other jobs
    OpenMP threads waiting for each other make each step many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_tiny_training_learns_and_predicts_offsets_that_slice_to_answers(tokenizer_path, one_thread):
    import lightning as L

    L.seed_everything(0)
    builtin = {"seed": 0, "n_train": 800, "n_validation": 100, "n_test": 10, "facts": ["birth", "work"]}
    datamodule = QADataModule(str(tokenizer_path), builtin=builtin, max_len=64, max_question_tokens=16, batch_size=16)
    config = {**datamodule.model_kwargs(), "n_layers": 2, "d_model": 64, "n_heads": 2, "max_len": 64, "dropout": 0.0}
    task = QuestionAnsweringTask(config, datamodule.preprocessor.to_state(), pretrained=None, lr=2e-3)
    # inference_mode=False: metric states reset under inference mode (the validation before fit)
    # could not be updated in place by fit's own validation.
    trainer = L.Trainer(max_epochs=12, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, inference_mode=False)
    before = trainer.validate(task, datamodule=datamodule, verbose=False)[0]["val/f1"]
    trainer.fit(task, datamodule=datamodule)
    after = trainer.validate(task, datamodule=datamodule, verbose=False)[0]["val/f1"]
    assert after > max(0.6, before + 0.3)

    examples = generate_qa(seed=9, n_train=20, n_validation=0, n_test=0, facts=["birth", "work"])["train"]
    predictions = task.predict([e["question"] for e in examples], [e["context"] for e in examples])
    for prediction, example in zip(predictions, examples):
        assert example["context"][prediction["start"]:prediction["end"]] == prediction["answer"] != ""
    assert sum(p["answer"] == e["answer_text"] for p, e in zip(predictions, examples)) >= 10


def test_experiment_config_trains_through_the_pipeline(tmp_path, tokenizer_path, one_thread):
    """experiment=bert/qa composes, and its datamodule, model config and task fit together in train()."""
    from transformer_lab.training.train import train
    from transformer_lab.runtime.config import compose_config

    overrides = ["experiment=bert/qa", "debug=smoke", "logger=none", "task.pretrained=null",
                 f"data.datamodule.tokenizer_path={tokenizer_path}", "data.builtin.n_train=64",
                 "data.builtin.n_validation=32", "data.builtin.n_test=32", "model.n_layers=1", "model.d_model=32"]
    cfg = compose_config("train", overrides, tmp_path)
    assert cfg.optimized_metric == "val/f1" and cfg.callbacks.model_checkpoint.mode == "max"
    metrics = train(cfg)
    for key in ("val/exact_match", "val/f1", "test/exact_match", "test/f1"):
        assert 0.0 <= metrics[key] <= 1.0
    assert (tmp_path / "checkpoints" / "best.ckpt").is_file()
    restored = QuestionAnsweringTask.load_from_checkpoint(tmp_path / "checkpoints" / "best.ckpt", pretrained=None)
    assert restored.preprocessor.max_len == 128  # the tokenizer itself travels in the checkpoint, not its path
    assert restored.preprocessor.tokenizer.to_str() == Tokenizer.from_file(str(tokenizer_path)).to_str()
