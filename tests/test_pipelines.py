"""transformer_lab.pipeline: every task on a tiny model read back from a checkpoint, the task
inferred from the family the checkpoint names, one-line errors for bad input, and feature
extraction from MiniLM against sentence-transformers."""

import importlib.util
import re
import warnings

import numpy as np
import pytest
import torch
from test_inference import TEXTS, _cases, tokenizer_path  # noqa: F401  (the fixture)

from transformer_lab import pipeline
from transformer_lab.errors import TransformerLabError
from transformer_lab.inference.pipeline import entities

FAMILY = {"atis": "joint_intent_slot", "bert_atis": "bert_joint_intent_slot", "bert_qa": "question_answering",
          "bert_classifier": "sequence_classification", "bert_ner": "token_classification",
          "bert_pretraining": "bert_pretraining", "gpt_classifier": "gpt_classification",
          "gpt_pretraining": "gpt_pretraining", "vit": "image_classification", "tabular": "tabular_classification"}


def save_checkpoint(task, path) -> dict:
    """`task` saved as train() saves it: weights, hyper-parameters and what the task's own
    on_save_checkpoint adds (the family; Lightning calls it for weights-only checkpoints too)."""
    checkpoint = {"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams)}
    task.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    return checkpoint


@pytest.fixture(scope="module")
def models(tokenizer_path, tmp_path_factory):
    """name -> (checkpoint path, the task it holds), written as train() writes them: weights,
    hyper-parameters and the family."""
    folder = tmp_path_factory.mktemp("checkpoints")
    saved = {}
    for name, (task, _) in _cases(tokenizer_path).items():
        if name not in FAMILY:
            continue
        path = folder / f"{name}.ckpt"
        assert save_checkpoint(task, path)["family"] == FAMILY[name]
        saved[name] = (path, task.eval())
    return saved


def test_text_classification_labels_and_scores_are_the_models(models):
    for name in ("bert_classifier", "gpt_classifier"):
        path, task = models[name]
        classify = pipeline(model=str(path))  # the task comes from the checkpoint
        assert classify.task_name == "text-classification"
        probabilities = task.predict(TEXTS)
        results = classify(TEXTS)
        for row, result in zip(probabilities, results):
            assert result == {"label": task.preprocessor.labels[int(row.argmax())], "score": pytest.approx(row.max().item())}
        ranked = classify(TEXTS[0], top_k=None)
        assert [r["score"] for r in ranked] == sorted((r["score"] for r in ranked), reverse=True)
        assert sum(r["score"] for r in ranked) == pytest.approx(1.0)
    pair = pipeline("text-classification", model=str(models["bert_classifier"][0]))
    assert pair({"text": "show me", "text_pair": "flights"}) == pair([("show me", "flights")])[0]


def test_token_classification_gives_entities_with_character_offsets(models):
    path, task = models["bert_ner"]
    text = "show me flights, from boston to denver"
    result = pipeline("token-classification", model=str(path))(text)
    assert result["words"] == ["show", "me", "flights", ",", "from", "boston", "to", "denver"]
    tags, scores = task.predict_scored([result["words"]])[0]
    assert result["tags"] == tags
    for entity in result["entities"]:
        assert text[entity["start"]:entity["end"]] == entity["word"] and 0 < entity["score"] <= 1
    for name in ("atis", "bert_atis"):  # intent and slots
        path, task = models[name]
        result = pipeline(model=str(path))(TEXTS[0])
        expected = task.predict([TEXTS[0].split()])[0]
        assert result["intent"] == expected["intent"] and result["tags"] == expected["slots"]


def long_utterance(n_words: int) -> list[str]:
    return (" ".join(TEXTS[:2]).split() * n_words)[:n_words]


def test_atis_taggers_tag_every_word_of_a_long_utterance_in_windows(models):
    words = long_utterance(300)
    for name, window in (("atis", 15), ("bert_atis", 30)):  # max_len less [CLS] (and BERT's [SEP])
        path, task = models[name]
        if name == "bert_atis":  # one piece a word: a window holds `window` words
            assert all(len(task.preprocessor.encode_words([word])[1]) == 1 for word in set(words))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing is cut, so nothing to warn about
            result = pipeline(model=str(path))(" ".join(words))
        assert result["words"] == words and len(result["tags"]) == 300
        assert result["intent"] in task.preprocessor.intent_labels
        # the first and the last words are read by one window each: the first words, the last words
        assert result["tags"][0] == task.predict([words[:window]])[0]["slots"][0]
        assert result["tags"][-1] == task.predict([words[-window:]])[0]["slots"][-1]


def test_word_windows_cover_every_word_within_the_budget():
    from transformer_lab.tasks.joint_intent_slot import best_window_of_each_word, word_windows

    assert word_windows([1] * 5, 15) == [(0, 5)]
    costs = [1, 3, 1, 1, 2, 1, 1, 1, 4, 1, 1, 2, 1, 1, 1, 1, 1, 9, 1]  # 9: a word longer than the budget
    windows = word_windows(costs, 8)
    assert windows[0][0] == 0 and windows[-1][1] == len(costs)
    for start, end in windows:
        assert sum(costs[start:end]) <= 8 or end - start == 1
    for before, after in zip(windows, windows[1:]):
        assert before[0] < after[0] <= before[1]  # no word skipped, never going back
    chosen = best_window_of_each_word(windows, len(costs))
    assert all(windows[w][0] <= i < windows[w][1] for i, w in enumerate(chosen))
    assert word_windows([1] * 30, 15)[-1] == (15, 30)  # the last window reaches back to the budget


def test_entities_join_bio_runs():
    text = "John Smith flew to New York ."
    words = [("John", 0, 4), ("Smith", 5, 10), ("flew", 11, 15), ("to", 16, 18), ("New", 19, 22), ("York", 23, 27),
             (".", 28, 29)]
    tags = ["B-PER", "I-PER", "O", "O", "B-LOC", "B-LOC", "O"]
    found = entities(words, tags, [0.9, 0.7, 1, 1, 0.6, 0.8, 1], text)
    assert found == [{"entity_group": "PER", "score": pytest.approx(0.8), "word": "John Smith", "start": 0, "end": 10},
                     {"entity_group": "LOC", "score": 0.6, "word": "New", "start": 19, "end": 22},
                     {"entity_group": "LOC", "score": 0.8, "word": "York", "start": 23, "end": 27}]
    assert "score" not in entities(words, tags, [None] * 7, text)[0]


def one_window_answer(task, question: str, context: str) -> dict:
    """The answer of the one feature a context cut to max_len makes (what predict read before long
    contexts were read in windows)."""
    from transformer_lab.tasks.question_answering import best_spans, span_probabilities, spans_to_answers

    batch = task.preprocessor.collate(task.preprocessor.encode([{"question": question, "context": context}]))
    with torch.no_grad():
        out = task(batch)
    allowed = batch["offsets"][..., 0] >= 0
    starts, ends, _ = best_spans(out.start_logits, out.end_logits, allowed, task.hparams.max_answer_tokens)
    score = span_probabilities(out.start_logits, out.end_logits, allowed, starts, ends)
    return {**spans_to_answers(starts, ends, batch["offsets"], batch["context"])[0], "score": score.item()}


def test_question_answering_answers_from_the_context(models):
    path, task = models["bert_qa"]
    answer = pipeline(model=str(path))(question=TEXTS[0], context=TEXTS[2])
    assert answer == task.predict([TEXTS[0]], [TEXTS[2]])[0]
    assert TEXTS[2][answer["start"]:answer["end"]] == answer["answer"]
    assert pipeline(model=str(path))({"question": TEXTS[0], "context": TEXTS[2]}) == answer
    # a context that fits: one window, the answer of the whole context read at once
    assert answer.pop("windows") == 1
    assert answer == pytest.approx(one_window_answer(task, TEXTS[0], TEXTS[2]))


def test_question_answering_finds_an_answer_beyond_the_first_window(models, monkeypatch):
    from transformer_lab.inference.pipeline import LoadedModel
    from transformer_lab.models.outputs import ModelOutput

    _, task = models["bert_qa"]
    lisbon = task.preprocessor.tokenizer.token_to_id("lisbon")

    def points_at_lisbon(input_ids, segment_ids=None, attention_mask=None, **_):
        """Span logits that pick the token "lisbon" wherever it is: the answer is known."""
        logits = (input_ids == lisbon).float()[..., None].expand(-1, -1, 2) * 10
        return ModelOutput(logits=logits, start_logits=logits[..., 0], end_logits=logits[..., 1])

    monkeypatch.setattr(task.model, "forward", points_at_lisbon)
    answer = pipeline(model=LoadedModel("question_answering", task, "a model that points at lisbon"))
    long = " ".join([TEXTS[3]] * 12) + " in lisbon"  # ~90 tokens; a window holds 21 or so
    found = answer(question=TEXTS[0], context=long)
    assert found["answer"] == "lisbon" and found["start"] == long.index("lisbon") and found["windows"] > 3
    assert one_window_answer(task, TEXTS[0], long)["answer"] != "lisbon"  # cut, the context had no answer
    assert answer(question=TEXTS[0], context=long, doc_stride=0)["windows"] < found["windows"]
    with pytest.raises(TransformerLabError, match="doc_stride=21: must be below the 21 passage tokens"):
        answer(question=TEXTS[0], context=long, doc_stride=21)
    short = answer(question=TEXTS[0], context=TEXTS[2])
    assert short["answer"] == "lisbon" and short["windows"] == 1


def test_fill_mask_ranks_the_vocabulary(models):
    path, task = models["bert_pretraining"]
    fill = pipeline(model=str(path))
    one = fill("show me [MASK] from boston", top_k=3)
    assert len(one) == 3 and [c["score"] for c in one] == sorted((c["score"] for c in one), reverse=True)
    assert one[0]["token"] == task.predict(["show me [MASK] from boston"])[0][0]
    two = fill("the [MASK] were [MASK] by a chemist", top_k=2)
    assert len(two) == 2 and all(len(mask) == 2 for mask in two)  # one list per mask
    with pytest.raises(TransformerLabError, match="no \\[MASK\\] to fill"):
        fill("no mask here")


def test_feature_extraction_mean_pools_any_bert_body(models):
    embed = pipeline("feature-extraction", model=str(models["bert_classifier"][0]))
    vectors = np.array(embed(TEXTS))
    assert vectors.shape == (4, 16)
    unit = np.array(embed(TEXTS, normalize=True))
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-5)
    assert embed.similarity(TEXTS[0], TEXTS[0]) == pytest.approx(1.0)


def test_text_generation_is_the_models_own_greedy_continuation(models):
    path, task = models["gpt_pretraining"]
    generate = pipeline(model=str(path))
    result = generate("show me", max_new_tokens=5, strategy="greedy")
    expected = task.predict(["show me"], 5, strategy="greedy")[0]["text"]
    assert result == {"generated_text": "show me" + expected}
    sampled = [generate("show me", max_new_tokens=5, strategy="sample", seed=3) for _ in range(2)]
    assert sampled[0] == sampled[1]  # seeded


def test_image_classification_reads_image_files(models, tmp_path):
    from PIL import Image

    path, task = models["vit"]
    picture = np.random.default_rng(0).integers(0, 256, (16, 16), dtype=np.uint8)
    Image.fromarray(picture).save(tmp_path / "digit.png")  # twice the model's size: resized to 8x8
    classify = pipeline(model=str(path))
    result = classify(str(tmp_path / "digit.png"))
    resized = np.array(Image.fromarray(picture).resize((8, 8), Image.BILINEAR))[None]
    probabilities = task.predict(resized[None])[0][0]
    assert result == {"label": task.preprocessor.labels[int(probabilities.argmax())],
                      "score": pytest.approx(probabilities.max().item())}
    (tmp_path / "broken.png").write_bytes(b"not an image")
    with pytest.raises(TransformerLabError, match="broken.png: not a readable image"):
        classify(str(tmp_path / "broken.png"))


def test_tabular_classification_reads_rows_and_names_a_missing_column(models):
    path, task = models["tabular"]
    classify = pipeline(model=str(path))
    result = classify({"colour": "red", "size": 1.5})
    probabilities = task.predict([{"colour": "red", "size": 1.5}])[0]
    assert result["score"] == pytest.approx(probabilities.max().item()) and result["label"] in ("no", "yes")
    with pytest.raises(TransformerLabError, match="size"):
        classify({"colour": "red"})


@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_tabular_baselines_are_pipelines_and_mlflow_models(tmp_path):
    """XGBoost and logistic regression from their stage folders and from their MLflow runs: the
    same probabilities as the fitted estimator on the encoded rows; the run's pyfunc agrees."""
    import json
    import os

    import mlflow
    import pandas as pd
    from test_tabular import write_table

    from transformer_lab.data.tabular import TabularEncoder, TabularPreprocessor, prepare, read_schema
    from transformer_lab.training import baselines
    from transformer_lab.runtime.config import compose_config

    csv, schema = write_table(tmp_path, rows=120)
    prepared = tmp_path / "prepared"
    prepare("local", str(prepared), str(schema), local_path=str(csv), seed=0)
    rows = pd.read_csv(csv).drop(columns="label").head(8).to_dict(orient="records")
    encoder = TabularEncoder.from_dict(json.loads((prepared / "encoder.json").read_text()))
    encoded = TabularPreprocessor(read_schema(prepared), encoder).encode(rows)
    for baseline in ("xgboost", "logistic_regression"):
        folder = tmp_path / baseline
        baselines.train_baseline(compose_config("train_baseline", [f"baseline={baseline}",
                                                                   f"data.prepared_dir={prepared}"], folder))
        classify = pipeline(model=str(folder))
        assert classify.loaded.family == "tabular_baseline"
        expected = baselines.predict(baselines.load(folder, "train_xgboost"), encoder, encoded)
        results = classify(rows)
        for row, result in zip(expected, results):
            assert result == {"label": encoder.classes[int(row.argmax())], "score": pytest.approx(float(row.max()))}
        with pytest.raises(TransformerLabError, match="size"):
            classify({"colour": "red", "shape": "round", "weight": "5"})

        run_id = json.loads((folder / "mlflow_run.json").read_text())["run_id"]
        uri = os.environ["MLFLOW_TRACKING_URI"]
        assert pipeline(model=run_id, tracking_uri=uri)(rows) == results
        mlflow.set_tracking_uri(uri)
        model_uri = mlflow.MlflowClient().get_run(run_id).data.tags["model_uri"]
        served = mlflow.pyfunc.load_model(model_uri).predict(pd.DataFrame(rows))
        assert [r["label"] for r in served] == [r["label"] for r in results]
        assert [r["score"] for r in served] == pytest.approx([r["score"] for r in results])


def test_every_task_a_family_declares_reads_its_served_example(models, tokenizer_path, tmp_path):
    """pipeline() does every task the registry declares for a family (families.Pipelines), each on
    the input row the family's served model shows (Pipeline.input_example), read as a served row is;
    a family that declares none is refused in one line."""
    from transformer_lab.inference.pipeline import PIPELINES, tasks_of

    for name, (path, _) in models.items():
        tasks = tasks_of(FAMILY[name])
        assert pipeline(model=str(path)).task_name == tasks[0]  # the first declared: the default
        for task in tasks:
            run = pipeline(task, model=str(path))
            assert run(PIPELINES[task].served_input(run.input_example(), "the example")), (name, task)
    word2vec = tmp_path / "word2vec.ckpt"
    save_checkpoint(_cases(tokenizer_path)["word2vec"][0], word2vec)
    with pytest.raises(TransformerLabError, match="is a word2vec model: no pipeline task reads it"):
        pipeline(model=str(word2vec))


def test_wrong_task_unknown_task_empty_text_and_untagged_checkpoints_are_one_error(models, tmp_path):
    sentiment = str(models["bert_classifier"][0])
    with pytest.raises(TransformerLabError, match="sequence_classification model: it does text-classification "
                                                  "and feature-extraction, not fill-mask"):
        pipeline("fill-mask", model=sentiment)
    with pytest.raises(TransformerLabError, match="task=summarization: not a pipeline task"):
        pipeline("summarization", model=sentiment)
    with pytest.raises(TransformerLabError, match="it does text-classification and feature-extraction, not translation"):
        pipeline("translation", model=sentiment)
    with pytest.raises(TransformerLabError, match="text is empty"):
        pipeline(model=sentiment)("  ")
    with pytest.raises(TransformerLabError, match="no such file or folder"):
        pipeline(model=str(tmp_path / "nothing"))
    with pytest.raises(TransformerLabError, match="without checkpoints/best.ckpt"):
        pipeline(model=str(tmp_path))
    untagged = tmp_path / "old.ckpt"
    checkpoint = torch.load(models["bert_classifier"][0], weights_only=True)
    del checkpoint["family"]
    torch.save(checkpoint, untagged)
    with pytest.raises(TransformerLabError, match="does not name its family"):
        pipeline(model=str(untagged))


def test_text_longer_than_the_model_reads_is_cut_with_a_warning(models):
    classify = pipeline(model=str(models["bert_classifier"][0]))
    with pytest.warns(UserWarning, match="longer than the model reads .* cut to the first 30"):
        result = classify(" ".join(["boston"] * 100))
    assert set(result) == {"label", "score"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        classify(TEXTS[0])  # short: no warning


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None, reason="sentence-transformers absent")
def test_minilm_sentence_embeddings_equal_sentence_transformers():
    from sentence_transformers import SentenceTransformer

    from transformer_lab.data import published

    sentences = ["A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell sharply today."]
    embed = pipeline("feature-extraction", model="minilm")
    ours = np.array(embed(sentences, normalize=True))
    theirs = SentenceTransformer(str(published.resolve("minilm").folder), device="cpu").encode(
        sentences, normalize_embeddings=True)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert embed.similarity(sentences[0], sentences[1]) > embed.similarity(sentences[0], sentences[2])


def test_free_text_on_the_command_line_is_quoted_for_hydra():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from transformer_lab.utils.overrides import quote_free_text

    texts = ["a gripping, funny film", "the film was [MASK] .", "flights at 8 o'clock", "ends in a backslash \\",
             "='already quoted'"]
    argv = quote_free_text(["predict.py", *(f"text={t}" for t in texts), "model=x", "text='kept, as typed'"], ("text",))
    assert argv[0] == "predict.py" and argv[-2] == "model=x" and argv[-1] == "text='kept, as typed'"
    parsed = OverridesParser.create().parse_overrides(argv[1:-2])
    assert [override.value() for override in parsed] == texts


# ------------------------------------------------------------------------------------------------
# Input files: output line N answers input line N


def test_a_blank_line_inside_an_input_file_is_one_error_naming_it(tmp_path):
    from transformer_lab.inference.predict import read_inputs

    files = {"gap.txt": ("first\n\nthird\n", 2), "gap.jsonl": ('{"text": "a"}\n{"text": "b"}\n  \n"c"\n', 3),
             "gap.csv": ("text,label\na,1\n\nb,2\n", 3)}
    for name, (content, line) in files.items():
        (tmp_path / name).write_text(content)
        with pytest.raises(TransformerLabError, match=f"^{re.escape(str(tmp_path / name))}:{line}: blank line"):
            read_inputs(tmp_path / name, "text-classification")
    # blank lines after the last input shift nothing: they end the file
    (tmp_path / "trailing.txt").write_text("first\nsecond\n\n \n")
    assert read_inputs(tmp_path / "trailing.txt", "text-classification") == ["first", "second"]
    (tmp_path / "trailing.jsonl").write_text('{"text": "a"}\n"b"\n\n')
    assert read_inputs(tmp_path / "trailing.jsonl", "text-classification") == ["a", "b"]


def test_csv_rows_are_numbered_by_their_line_and_must_fill_the_header(tmp_path):
    from transformer_lab.inference.predict import read_inputs

    (tmp_path / "quoted.csv").write_text('text\n"two\nlines"\n""\n')  # a quoted cell across lines
    quoted = re.escape(str(tmp_path / "quoted.csv"))
    with pytest.raises(TransformerLabError, match=f"^{quoted}:4: field 'text' is missing"):
        read_inputs(tmp_path / "quoted.csv", "text-classification")
    (tmp_path / "ragged.csv").write_text("text,text_pair\na,b\nc,d,e\n")
    ragged = re.escape(str(tmp_path / "ragged.csv"))
    with pytest.raises(TransformerLabError, match=f"^{ragged}:3: 3 cells for the header's 2"):
        read_inputs(tmp_path / "ragged.csv", "text-classification")


# ------------------------------------------------------------------------------------------------
# Options: checked by name and range, given to pipeline() or to a call, before any input is read


def test_options_are_checked_by_name_and_range_when_given_and_when_called(models):
    generate = str(models["gpt_pretraining"][0])
    for options, message in (({"temperature": 0}, "temperature=0: expected a number > 0"),
                             ({"top_p": 2}, r"top_p=2: expected a number in \(0, 1\], or null"),
                             ({"top_k": 0}, "top_k=0: expected an integer >= 1, or null"),
                             ({"max_new_tokens": -1}, "max_new_tokens=-1: expected an integer >= 1"),
                             ({"max_new_tokens": 2.5}, "max_new_tokens=2.5: expected an integer >= 1"),
                             ({"strategy": "beam"}, "strategy='beam': expected greedy or sample"),
                             ({"temprature": 0.7}, "temprature: not an option of text-generation; its options: "
                                                   "max_new_tokens, strategy, temperature, top_k, top_p")):
        with pytest.raises(TransformerLabError, match=f"^{message}"):
            pipeline(model=generate, **options)
        with pytest.raises(TransformerLabError, match=f"^{message}"):
            pipeline(model=generate)(["show me"], **options)
    classify = pipeline(model=str(models["bert_classifier"][0]))
    with pytest.raises(TransformerLabError, match="^batch_size=0: expected an integer >= 1$"):
        classify(None, batch_size=0)  # the option first: the input is not read
    with pytest.raises(TransformerLabError, match="^normalize: not an option of text-classification; "
                                                  "its options: top_k, batch_size$"):
        classify(TEXTS[0], normalize=True)
    with pytest.raises(TransformerLabError, match="^top_k=None: expected an integer >= 1$"):  # fill-mask: no null
        pipeline(model=str(models["bert_pretraining"][0]), top_k=None)
    # a task named: before the model is looked for
    with pytest.raises(TransformerLabError, match="^num_beams=0: expected an integer >= 1$"):
        pipeline("translation", model="/no/such/model", num_beams=0)
    with pytest.raises(TransformerLabError, match="^beams: not an option of translation"):
        pipeline("translation", model="/no/such/model", beams=4)
    assert classify(TEXTS[0], top_k=None, batch_size=1)[0]["label"] in ("neg", "pos")  # valid options still run


def test_every_pipeline_option_has_a_rule():
    import inspect

    from transformer_lab.inference.pipeline import PIPELINES

    for task, pipeline_class in PIPELINES.items():
        names = list(inspect.signature(pipeline_class.run).parameters)[2:]  # after self, inputs
        assert names == list(pipeline_class.option_rules()), task


@pytest.mark.slow  # command-line processes
def test_bad_options_on_the_command_line_are_one_line_before_the_model_or_data_is_read(models, tmp_path):
    from conftest import PYTHON, ROOT, run
    from test_trust import assert_one_line_error

    predict, generate = ROOT / "pipelines" / "predict.py", ROOT / "pipelines" / "generate.py"
    hydra_dir = f"hydra.run.dir={tmp_path / 'hydra'}"
    result = run([PYTHON, predict, "model=/no/such/model", "task=text-generation", "text=hi", "+options.temperature=0",
                  hydra_dir])
    assert_one_line_error(result, "options.temperature=0: expected a number > 0")
    (tmp_path / "inputs.txt").write_text("show me flights\n")
    result = run([PYTHON, predict, f"model={models['atis'][0]}", f"input={tmp_path / 'inputs.txt'}",
                  f"output={tmp_path / 'out.jsonl'}", "+options.temprature=1", hydra_dir])
    assert_one_line_error(result, "options.temprature: not an option of token-classification; its options: batch_size")
    assert not (tmp_path / "out.jsonl").exists()
    for setting in ("max_new_tokens=-1", "top_p=2", "temperature=0"):
        result = run([PYTHON, generate, "checkpoint=/no/such.ckpt", setting, "strategy=greedy", hydra_dir])
        assert_one_line_error(result, f"{setting}: expected")


@pytest.mark.slow  # command-line processes
def test_a_prompt_with_a_comma_or_an_emoji_generates_from_the_command_line(models, tmp_path):
    from conftest import PYTHON, ROOT, run

    for prompt in ("Hello, world", "show me 🙂", "[a] b={c}"):
        result = run([PYTHON, ROOT / "pipelines" / "generate.py", f"checkpoint={models['gpt_pretraining'][0]}",
                      f"prompt={prompt}", "max_new_tokens=3", "strategy=greedy", f"hydra.run.dir={tmp_path}"])
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.startswith(f"--- sample 0 ---\n{prompt}")


@pytest.mark.slow  # a command-line process
def test_a_long_atis_utterance_is_tagged_from_the_command_line(models, tmp_path):
    import json

    from conftest import PYTHON, ROOT, run

    words = long_utterance(300)
    result = run([PYTHON, ROOT / "pipelines" / "predict.py", f"model={models['atis'][0]}", f"text={' '.join(words)}",
                  f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    printed = json.loads(result.stdout)
    assert printed["words"] == words and len(printed["tags"]) == 300
