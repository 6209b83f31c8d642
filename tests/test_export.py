"""Export: every exportable head written as a Hugging Face folder, loaded by
`transformers.pipeline`, gives this project's labels and scores on the same inputs."""

import json

import pytest
import torch

from conftest import PYTHON, ROOT, run
from test_inference import TEXTS, _cases, tokenizer_path  # noqa: F401  (the fixture)
from test_pipelines import save_checkpoint
from transformer_lab import pipeline
from transformer_lab.errors import TransformerLabError
from transformer_lab.export import export_hf
from transformer_lab.pipelines import LoadedModel

transformers = pytest.importorskip("transformers")
FAMILY = {"bert_classifier": "sequence_classification", "bert_ner": "token_classification",
          "bert_qa": "question_answering", "bert_pretraining": "bert_pretraining", "gpt_pretraining": "gpt_pretraining",
          "bert_atis": "bert_joint_intent_slot"}


@pytest.fixture(scope="module")
def exported(tokenizer_path, tmp_path_factory):
    """name -> (our pipeline's model, the exported folder)."""
    folder = tmp_path_factory.mktemp("exported")
    cases = _cases(tokenizer_path)
    result = {}
    generator = torch.Generator().manual_seed(0)
    for name, family in FAMILY.items():
        task = cases[name][0].eval()
        with torch.no_grad():  # weights far from the initialisation's tiny ones: every input path shows in the scores
            for parameter in task.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
        loaded = LoadedModel(family, task, name)
        result[name] = (loaded, export_hf(loaded, folder / name))
    return result


def hf(task: str, folder):
    return transformers.pipeline(task, model=str(folder), device="cpu")


def test_the_folder_is_what_transformers_reads(exported):
    _, folder = exported["bert_classifier"]
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and config["id2label"] == {"0": "neg", "1": "pos"}


def test_sequence_classification_gives_the_same_labels_and_scores(exported):
    loaded, folder = exported["bert_classifier"]
    ours, theirs = pipeline(model=loaded), hf("text-classification", folder)
    for text in TEXTS:
        assert theirs(text)[0] == {"label": ours(text)["label"], "score": pytest.approx(ours(text)["score"], abs=1e-5)}
    pair = {"text": TEXTS[0], "text_pair": TEXTS[1]}
    assert theirs(pair)["score"] == pytest.approx(ours(pair)["score"], abs=1e-5)


def test_token_classification_gives_the_same_entities_and_scores(exported):
    loaded, folder = exported["bert_ner"]
    ours, theirs = pipeline(model=loaded), hf("token-classification", folder)
    for text in ("show me flights from boston to denver", "who drew the old maps of lisbon, and when?",
                 "o'hare's maps: boston-denver (1990)"):
        expected = ours(text)["entities"]
        found = theirs(text, aggregation_strategy="first")
        assert [(e["entity_group"], e["start"], e["end"]) for e in found] == \
            [(e["entity_group"], e["start"], e["end"]) for e in expected]
        assert [e["score"] for e in found] == pytest.approx([e["score"] for e in expected], abs=1e-5)


def test_question_answering_gives_the_same_span_logits(exported):
    # transformers 5 has no question-answering pipeline: its model class and tokenizer instead
    loaded, folder = exported["bert_qa"]
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(str(folder))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    question, context = TEXTS[0], TEXTS[2]
    encoded = tokenizer(question, context, return_tensors="pt")
    ours_input = loaded.task.preprocessor.collate(loaded.task.preprocessor.encode([{"question": question,
                                                                                    "context": context}]))
    assert encoded["input_ids"].tolist() == ours_input["input_ids"].tolist()
    with torch.no_grad():
        theirs = model(**encoded)
        ours = loaded.task.eval()(ours_input)
    torch.testing.assert_close(theirs.start_logits, ours.start_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(theirs.end_logits, ours.end_logits, atol=1e-5, rtol=1e-5)


def test_fill_mask_gives_the_same_tokens_and_scores(exported):
    loaded, folder = exported["bert_pretraining"]
    ours, theirs = pipeline(model=loaded), hf("fill-mask", folder)
    expected = ours("show me [MASK] from boston", top_k=5)
    found = theirs("show me [MASK] from boston", top_k=5)
    assert [c["token"] for c in found] == [c["token_id"] for c in expected]
    assert [c["score"] for c in found] == pytest.approx([c["score"] for c in expected], abs=1e-5)


def test_gpt_generates_the_same_greedy_text(exported):
    loaded, folder = exported["gpt_pretraining"]
    ours, theirs = pipeline(model=loaded), hf("text-generation", folder)
    expected = ours("show me", max_new_tokens=8, strategy="greedy")["generated_text"]
    found = theirs("show me", max_new_tokens=8, do_sample=False)[0]["generated_text"]
    assert found == expected
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    ids = torch.tensor([loaded.task.preprocessor.encode("show me flights")])
    ours_logits = loaded.task.model(ids).logits
    torch.testing.assert_close(model(ids).logits, ours_logits, atol=1e-5, rtol=1e-5)


def test_joint_bert_exports_its_encoder_and_heads(exported):
    from safetensors.torch import load_file

    loaded, folder = exported["bert_atis"]
    encoder = transformers.AutoModel.from_pretrained(str(folder))
    heads = load_file(str(folder / "joint_heads.safetensors"))
    labels = json.loads((folder / "joint_heads.json").read_text())
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    words = TEXTS[0].split()
    encoded = tokenizer(words, is_split_into_words=True, return_tensors="pt")
    with torch.no_grad():
        out = encoder(**encoded)
    intent = (out.pooler_output @ heads["intent.weight"].T + heads["intent.bias"]).argmax(-1).item()
    assert labels["intent_labels"][intent] == pipeline(model=loaded)(TEXTS[0])["intent"]


def test_export_refuses_what_has_no_transformers_class(tokenizer_path, tmp_path):
    task = _cases(tokenizer_path)["vit"][0]
    with pytest.raises(TransformerLabError, match="image_classification model: format=hf exports"):
        export_hf(LoadedModel("image_classification", task, "vit.ckpt"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # over 20 s here (a CLI process or training first): the full suite's
def test_export_cli_writes_the_folder_and_refuses_another_format(exported, tmp_path):
    loaded, _ = exported["bert_classifier"]
    checkpoint = tmp_path / "sentiment.ckpt"
    save_checkpoint(loaded.task, checkpoint)
    result = run([PYTHON, ROOT / "pipelines" / "export.py", f"model={checkpoint}", f"out={tmp_path / 'hf'}",
                  f"hydra.run.dir={tmp_path}/run"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    refused = run([PYTHON, ROOT / "pipelines" / "export.py", f"model={checkpoint}", f"out={tmp_path / 'x'}",
                   "format=onnx", f"hydra.run.dir={tmp_path}/run"])
    assert refused.returncode == 2 and "format=onnx: only hf" in refused.stderr
