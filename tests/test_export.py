"""Export: every exportable head written as a Hugging Face folder, loaded by
`transformers.pipeline`, gives this project's labels and scores on the same inputs."""

import json
import os

import pytest
import torch
from conftest import PYTHON, ROOT, run
from test_inference import TEXTS, _cases, tokenizer_path  # noqa: F401  (the fixture)
from test_io import mode, snapshot, umask  # noqa: F401  (the fixture)
from test_pipelines import save_checkpoint
from test_trust import assert_one_line_error

from transformer_lab import pipeline
from transformer_lab.errors import TransformerLabError
from transformer_lab.inference.export import export_hf
from transformer_lab.inference.pipeline import LoadedModel

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


# ------------------------------------------------------------------------------------------------
# What out= may name: a new or empty folder, or an earlier export of the same model kind; never a
# file, a folder of other files, nor the model's own folder or one that holds it.


@pytest.fixture
def run_folder(exported, tmp_path):
    """A training stage's folder as train() leaves it: the checkpoint, metrics and history."""
    loaded, _ = exported["bert_classifier"]
    folder = tmp_path / "artifacts" / "bert" / "sentiment"
    (folder / "checkpoints").mkdir(parents=True)
    save_checkpoint(loaded.task, folder / "checkpoints" / "best.ckpt")
    (folder / "metrics.json").write_text('{"val_acc": 0.9}\n')
    (folder / "history.csv").write_text("epoch,val_acc\n0,0.9\n")
    return folder


def from_source(exported, name: str, source) -> LoadedModel:
    loaded, _ = exported[name]
    return LoadedModel(loaded.family, loaded.task, str(source))


def refused(loaded, out, *fragments: str) -> str:
    with pytest.raises(TransformerLabError) as error:
        export_hf(loaded, out)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"out={out}: "), message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_export_refuses_a_file(exported, tmp_path):
    out = tmp_path / "model.bin"
    out.write_bytes(b"someone's weights")
    refused(from_source(exported, "bert_classifier", "x.ckpt"), out, "a file, not a folder")
    assert out.read_bytes() == b"someone's weights"


def test_export_refuses_a_folder_of_other_files(exported, tmp_path):
    out = tmp_path / "reports"
    (out / "figures").mkdir(parents=True)
    (out / "notes.md").write_text("results")
    (out / "figures" / "curve.png").write_bytes(b"\x89PNG")
    before = snapshot(out)
    refused(from_source(exported, "bert_classifier", "x.ckpt"), out, "not an export", "notes.md")
    assert snapshot(out) == before


@pytest.mark.parametrize("source", ["folder", "checkpoint"])
def test_export_refuses_the_models_own_folder_and_the_folders_holding_it(exported, run_folder, source):
    loaded = from_source(exported, "bert_classifier",
                         run_folder if source == "folder" else run_folder / "checkpoints" / "best.ckpt")
    before = snapshot(run_folder.parents[2])
    refused(loaded, run_folder, "the folder of model=")
    for holder in (run_folder / "checkpoints", run_folder.parent, run_folder.parents[2]):
        refused(loaded, holder, "holds model=")
    assert snapshot(run_folder.parents[2]) == before


def test_export_may_write_a_new_folder_inside_the_models_folder(exported, run_folder):
    before = snapshot(run_folder)
    folder = export_hf(from_source(exported, "bert_classifier", run_folder), run_folder / "hf")
    assert (folder / "model.safetensors").is_file()
    assert {k: v for k, v in snapshot(run_folder).items() if not k.startswith("hf/")} == before


def test_export_refuses_a_folder_inside_a_dvc_output(exported, tmp_path):
    """`dvc repro` deletes a stage's outputs before it runs, and `dvc commit` takes in what is there."""
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "dvc.yaml").write_text("stages:\n  train:\n    matrix:\n      model: [a, b]\n"
                                       "    cmd: python train.py\n    outs:\n"
                                       "      - artifacts/${item.model}/checkpoints\n"
                                       "      - artifacts/${item.model}/mlflow_run.json:\n          cache: false\n")
    loaded = from_source(exported, "bert_classifier", "x.ckpt")
    refused(loaded, tmp_path / "artifacts" / "a" / "checkpoints" / "hf", "inside artifacts/${item.model}/checkpoints",
            "DVC stage train")
    refused(loaded, tmp_path / "artifacts" / "b" / "mlflow_run.json", "DVC stage train")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".dvc", "dvc.yaml"]
    assert (export_hf(loaded, tmp_path / "artifacts" / "a" / "hf") / "config.json").is_file()


def test_export_replaces_an_earlier_export_of_the_same_kind(exported, tmp_path):
    out = tmp_path / "sentiment"
    loaded = from_source(exported, "bert_classifier", "x.ckpt")
    export_hf(loaded, out)
    (out / "model.safetensors").write_bytes(b"stale")
    export_hf(loaded, out)
    assert (out / "model.safetensors").read_bytes() != b"stale"
    assert transformers.AutoConfig.from_pretrained(str(out)).architectures == ["BertForSequenceClassification"]
    assert [p.name for p in tmp_path.iterdir()] == ["sentiment"]


def test_export_refuses_another_kind_of_export_or_one_with_files_added(exported, tmp_path):
    gpt, bert = (from_source(exported, name, "x.ckpt") for name in ("gpt_pretraining", "bert_classifier"))
    out = export_hf(gpt, tmp_path / "gpt")
    before = snapshot(out)
    refused(bert, out, "a gpt_pretraining export", "sequence_classification")
    assert snapshot(out) == before
    (out / "README.md").write_text("# our model card")
    refused(gpt, out, "README.md")
    assert snapshot(out) == {**before, "README.md": b"# our model card"}


@pytest.mark.parametrize("mask, folder_mode, file_mode", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_exported_files_follow_the_umask(exported, tmp_path, umask, mask, folder_mode, file_mode):
    umask(mask)
    out = export_hf(from_source(exported, "bert_atis", "x.ckpt"), tmp_path / "atis")
    assert mode(out) == folder_mode
    assert {name: mode(out / name) for name in os.listdir(out)} == dict.fromkeys(os.listdir(out), file_mode)


@pytest.mark.slow  # four CLI processes
def test_export_cli_refuses_what_it_would_destroy_and_replaces_its_own(exported, run_folder, tmp_path):
    def export(out):
        return run([PYTHON, ROOT / "pipelines" / "export.py", f"model={run_folder}", f"out={out}",
                    f"hydra.run.dir={tmp_path}/hydra"])

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    (tmp_path / "model.bin").write_bytes(b"weights")
    before = snapshot(tmp_path / "artifacts"), snapshot(notes), (tmp_path / "model.bin").read_bytes()
    assert_one_line_error(export(run_folder), f"out={run_folder}: ", "the folder of model=")
    assert_one_line_error(export(notes), f"out={notes}: ", "not an export", "todo.txt")
    assert_one_line_error(export(tmp_path / "model.bin"), "model.bin: ", "a file, not a folder")
    assert (snapshot(tmp_path / "artifacts"), snapshot(notes), (tmp_path / "model.bin").read_bytes()) == before
    for _ in range(2):  # the second run replaces the first's folder
        result = export(tmp_path / "exported")
        assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "exported" / "model.safetensors").is_file()


@pytest.mark.parametrize("field, value", [("pool", "mean"), ("attention_projections", "v"), ("residual", False),
                                          ("attention_scaled", False), ("layer_norm", False)])
def test_a_model_transformers_cannot_express_is_refused_in_one_line(field, value):
    from types import SimpleNamespace

    from transformer_lab.inference.export import check_expressible

    check_expressible(SimpleNamespace(pool="cls", residual=True), "BertForSequenceClassification")  # the defaults
    with pytest.raises(TransformerLabError, match=f"the model has {field}={value!r}, which transformers' "
                                                  "BertForSequenceClassification cannot express"):
        check_expressible(SimpleNamespace(**{field: value}), "BertForSequenceClassification")
