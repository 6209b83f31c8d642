"""Trained models as pipelines: raw inputs in, readable predictions out, one call per task.

    from transformer_lab import pipeline
    classify = pipeline("text-classification", model="artifacts/bert/sentiment")
    classify("a gripping, funny film")         # {"label": "1", "score": 0.93}
    classify(["dull", "moving"], top_k=None)   # every label of each text, best first

`model=` takes a checkpoint file, a stage's output folder (its checkpoints/best.ckpt, else
last.ckpt; a tabular baseline's folder: its fitted XGBoost or logistic regression), an MLflow
run (a run id, `runs:/RUN_ID`) or registered model (`models:/NAME@ALIAS`, `models:/NAME/VERSION`), or a published encoder (`minilm`, a Hugging Face BERT folder, hf:NAME:
feature-extraction only). The checkpoint names the family that wrote it, and the family's
registry entry (families.py, `pipelines=Pipelines(...)`) the tasks it does, the first when `task`
is left out; a task the model cannot do is one error naming the tasks it can. No task here knows
a family: what differs between the families a task reads (the words a tagger tags, the body
feature extraction pools) is what their entries declare.

A single input gives one result, a list gives a list. Text longer than the model's position
limit is cut to it with a warning (what the model reads is what BERT reads in training too),
except a question-answering context and an ATIS utterance: those are read whole, in overlapping
windows. Options are checked by name and range (OPTIONS) before anything is read.
"""

from __future__ import annotations

import inspect
import math
import operator
import re
import tempfile
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from hydra.utils import get_object

from transformer_lab.errors import TransformerLabError
from transformer_lab.families import FAMILIES, Pipelines
from transformer_lab.inference.options import OPTIONS, Option, check_options
from transformer_lab.tasks.checkpoints import (
    BASELINE_FILES,
    FAMILY_KEY,
    PREPROCESSOR_FILE,
    is_baseline_folder,
    load_task,
    read_checkpoint,
)

# The models pipeline() reads that no family's checkpoint holds: the class that loads each (imported
# by name, as a family's task is: a stage that trains no baseline runs none of it, and loading a
# checkpoint of another family runs none of BERT's code) and how it is read, as a family declares it.
BASELINE, PUBLISHED = "tabular_baseline", "published"
NOT_FAMILIES: dict[str, tuple[str, Pipelines]] = {
    # XGBoost or logistic regression (training/baselines.py): a fitted estimator and its preprocessor
    BASELINE: ("transformer_lab.training.baselines.FittedBaseline", Pipelines(("tabular-classification",))),
    # a published BERT encoder (data/published.py: minilm, a Hugging Face folder, hf:NAME)
    PUBLISHED: ("transformer_lab.inference.published_encoder.PublishedEncoder",
                Pipelines(("feature-extraction",), body="bert")),
}
RUN_ID = re.compile(r"[0-9a-f]{32}")


def pipelines_of(name: str) -> Pipelines | None:
    """How pipeline() reads a model of the family `name` (families.py's, or one of NOT_FAMILIES);
    None: it does not."""
    if name in FAMILIES:
        return FAMILIES[name].pipelines
    return NOT_FAMILIES[name][1] if name in NOT_FAMILIES else None


def tasks_of(name: str) -> list[str]:
    """The pipeline tasks a model of the family `name` does, the one it does when `task` is left out first."""
    declared = pipelines_of(name)
    return list(declared.tasks) if declared else []


@dataclass
class LoadedModel:
    family: str   # a families.py name, or one of NOT_FAMILIES (PUBLISHED, BASELINE)
    task: object  # the trained LightningModule (eval mode, CPU), a PublishedEncoder or a FittedBaseline
    source: str   # what `model=` said

    @property
    def pipelines(self) -> Pipelines | None:
        """How pipeline() reads it: its family's registry entry's `pipelines`."""
        return pipelines_of(self.family)

    @property
    def tasks(self) -> list[str]:
        return tasks_of(self.family)


# ------------------------------------------------------------------------------------------------
# Finding the model


def mlflow_model_path(model: str, tracking_uri: str | None) -> Path:
    """What the MLflow run `model` names (run id, runs:/ or models:/ URI) logged, downloaded into
    MLflow's local cache: its best checkpoint, or a baseline's folder (model file, preprocessor)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    client = mlflow.MlflowClient(tracking_uri)
    try:
        if model.startswith("models:/"):
            name, _, which = model.removeprefix("models:/").partition("@")
            if which:
                version = client.get_model_version_by_alias(name, which)
            else:
                name, _, number = name.partition("/")
                version = client.get_model_version(name, number)
            run_id = version.run_id
        else:
            run_id = model.removeprefix("runs:/").strip("/").split("/")[0]
        checkpoints = [a.path for a in client.list_artifacts(run_id, "checkpoints") if a.path.endswith(".ckpt")]
        files = [] if checkpoints else [a.path for a in client.list_artifacts(run_id) if a.path in BASELINE_FILES]
    except MlflowException as err:
        raise TransformerLabError(f"model={model}: {str(err).splitlines()[0][:200]} "
                                  f"(tracking store {client.tracking_uri})") from None
    download = partial(mlflow.artifacts.download_artifacts, run_id=run_id, tracking_uri=client.tracking_uri)
    if checkpoints:
        return Path(download(artifact_path=sorted(checkpoints)[0]))
    if PREPROCESSOR_FILE in files and len(files) > 1:
        folder = Path(tempfile.mkdtemp(prefix=f"baseline-{run_id}-"))
        for name in files:
            download(artifact_path=name, dst_path=str(folder))
        return folder
    raise TransformerLabError(f"model={model}: run {run_id} logged no checkpoint (checkpoints/*.ckpt) "
                              "and no baseline model")


def model_path(model: str, tracking_uri: str | None = None) -> Path:
    """The checkpoint file (or baseline folder) `model` (a file, a stage's folder or an MLflow
    reference) stands for."""
    if model.startswith(("runs:/", "models:/")) or RUN_ID.fullmatch(model):
        return mlflow_model_path(model, tracking_uri)
    path = Path(model)
    if path.is_dir():
        for candidate in (path / "checkpoints" / "best.ckpt", path / "checkpoints" / "last.ckpt",
                          path / "best.ckpt", path / "last.ckpt"):
            if candidate.is_file():
                return candidate
        if is_baseline_folder(path):
            return path
        raise TransformerLabError(f"model={model}: a folder without checkpoints/best.ckpt or last.ckpt "
                                  "(pass a training stage's output folder or a .ckpt file)")
    if not path.is_file():
        raise TransformerLabError(f"model={model}: no such file or folder, MLflow run or published model")
    return path


def load_model(model: str | LoadedModel, tracking_uri: str | None = None) -> LoadedModel:
    """The trained model `model` names (see the module docstring), on the CPU in eval mode."""
    from transformer_lab.data import published

    if isinstance(model, LoadedModel):
        return model
    model = str(model)
    # A Hugging Face folder has a config.json; a stage's folder (also a folder) has checkpoints
    if model in published.PACKAGES or model.startswith(published.HUB_PREFIX) or (Path(model) / "config.json").is_file():
        return LoadedModel(PUBLISHED, get_object(NOT_FAMILIES[PUBLISHED][0])(published.resolve(model)), model)
    path = model_path(model, tracking_uri)
    if path.is_dir():  # a baseline's folder
        return LoadedModel(BASELINE, get_object(NOT_FAMILIES[BASELINE][0]).load(path), model)
    family = read_checkpoint(path).get(FAMILY_KEY)
    if family not in FAMILIES:
        raise TransformerLabError(f"{path}: the checkpoint does not name its family (written before "
                                  f"checkpoints did); retrain it, e.g. `dvc repro`")
    task_class = get_object(FAMILIES[family].task)
    stage = (FAMILIES[family].stages or (f"task={family}",))[-1]
    return LoadedModel(family, load_task(path, task_class, stage), model)


# ------------------------------------------------------------------------------------------------
# Reading inputs


def one_or_many(inputs) -> tuple[list, bool]:
    """(inputs as a list, whether one input was given)."""
    if isinstance(inputs, (list, np.ndarray)) and not (isinstance(inputs, np.ndarray) and inputs.ndim == 3):
        return list(inputs), False
    return [inputs], True


def check_text(text, what: str = "text") -> str:
    if not isinstance(text, str) or not text.strip():
        raise TransformerLabError(f"{what} is empty" if isinstance(text, str) else
                                  f"{what} is a {type(text).__name__}, not a string")
    return text


def warn_if_cut(tokenizer, texts: list[str], max_tokens: int) -> list[int]:
    """The warning for inputs longer than the model reads (they are cut to max_tokens); returns
    each input's token count."""
    lengths = [len(encoding.ids) for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)]
    long = [(i, n) for i, n in enumerate(lengths) if n > max_tokens]
    if long:
        i, n = long[0]
        warnings.warn(f"{len(long)} input(s) longer than the model reads (input {i}: {n} tokens): "
                      f"cut to the first {max_tokens}", stacklevel=3)
    return lengths


SPACED = re.compile(r"\S+")  # ATIS's words: as typed, split at spaces


def split_words(text: str, tokenizer=None) -> list[tuple[str, int, int]]:
    """(word, start, end) of each word of text: the words the tokenizer's own pre-tokenizer sees
    (BERT's: punctuation apart, as transformers' token-classification pipeline groups pieces),
    or the space-separated ones."""
    if tokenizer is not None and tokenizer.pre_tokenizer is not None:
        return [(word, start, end) for word, (start, end) in tokenizer.pre_tokenizer.pre_tokenize_str(text)]
    return [(m.group(), m.start(), m.end()) for m in SPACED.finditer(text)]


def entities(words: list[tuple[str, int, int]], tags: list[str], scores: list[float | None], text: str
             ) -> list[dict]:
    """BIO tags over words (word, start, end) as entities: {"entity_group", "word", "start", "end"}
    (character offsets into text) and, when the tags were scored, "score", the mean of the words'."""
    found, current = [], None
    for (word, start, end), tag, score in zip(words, tags, scores):
        kind = tag[2:] if tag[:2] in ("B-", "I-") else None
        if current and (kind != current["entity_group"] or tag.startswith("B-")):
            found.append(current)
            current = None
        if kind and current is None:
            current = {"entity_group": kind, "start": start, "end": end, "scores": []}
        if current:
            current["end"] = end
            current["scores"].append(score)
    found += [current] if current else []
    for entity in found:
        scores = entity.pop("scores")
        entity["word"] = text[entity["start"]:entity["end"]]
        if None not in scores:
            entity["score"] = sum(scores) / len(scores)
    return [{k: e[k] for k in ("entity_group", "score", "word", "start", "end") if k in e} for e in found]


def read_image(image, channels: int, size: int) -> np.ndarray:
    """A uint8 (C, H, W) array of an image file or its bytes (any format Pillow reads), resized to the model's
    size, in its channels (1: grey, 3: RGB); arrays are taken as they are."""
    if isinstance(image, (np.ndarray, torch.Tensor)):
        return np.asarray(image)
    import io

    from PIL import Image, UnidentifiedImageError

    name = "the image bytes" if isinstance(image, bytes) else image
    try:
        with Image.open(io.BytesIO(image) if isinstance(image, bytes) else image) as opened:
            picture = opened.convert("L" if channels == 1 else "RGB").resize((size, size), Image.BILINEAR)
    except (OSError, UnidentifiedImageError) as err:
        raise TransformerLabError(f"{name}: not a readable image ({str(err).splitlines()[0][:120]})") from None
    array = np.array(picture, dtype=np.uint8)  # a copy: torch refuses read-only arrays
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


# ------------------------------------------------------------------------------------------------
# Running the model


def by_length(run_batch, items: list, lengths: list[int], batch_size: int) -> list:
    """run_batch(batch) -> one result per item, over the items in batches of batch_size of like
    length, longest first; the results in the items' order. A batch is padded to its longest
    input: batched in the order given, half the positions of SST-2's sentences at batch 32 are
    padding, an eighth in length order. The outputs do not depend on the batching (beyond float
    rounding: padded keys are masked out)."""
    order = sorted(range(len(items)), key=lambda i: -lengths[i])
    results = [None] * len(items)
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        for i, result in zip(batch, run_batch([items[i] for i in batch]), strict=True):
            results[i] = result
    return results


# ------------------------------------------------------------------------------------------------
# The pipelines


class Pipeline:
    """A task on a loaded model: `pipeline(inputs, **options)`; options given to `pipeline()` are
    the defaults of every call. The options are `run`'s keyword arguments, checked by OPTIONS.

    What the task's served model (inference/served.py) takes is declared here too, once per task:
    `example`, the input row its logged model shows and is checked with (`input_example()` where
    it depends on the model), and `served_input`, a row of the served table as this task's input."""

    task_name: str
    rules: dict[str, Option] = {}  # where an option's range differs from OPTIONS's
    example: dict = {}             # a served input row (its fields as predict.py's input files name them)
    typed_cells: bool = True       # whether each column of served rows has one type (infer_signature)

    def __init__(self, loaded: LoadedModel, **defaults):
        check_options(self.task_name, defaults)
        self.loaded, self.model, self.defaults = loaded, loaded.task, defaults

    @classmethod
    def option_rules(cls) -> dict[str, Option]:
        names = list(inspect.signature(cls.run).parameters)[2:]  # after self and inputs
        return {name: cls.rules.get(name) or OPTIONS[name] for name in names}

    def __call__(self, inputs, **options):
        check_options(self.task_name, options)
        many, single = one_or_many(inputs)
        if not many:
            return []
        results = self.run(many, **{**self.defaults, **options})
        return results[0] if single else results

    def run(self, inputs: list) -> list:
        raise NotImplementedError

    def input_example(self) -> dict:
        """One input row of the served model: what its signature is inferred from."""
        return dict(self.example)

    @classmethod
    def served_input(cls, record: dict, where: str):
        """The pipeline input of a row of the served table (a dict of its columns); pandas' NaN
        stands for a field the row lacks."""
        from transformer_lab.inference.predict import record_input

        record = {k: v for k, v in record.items() if not (isinstance(v, float) and math.isnan(v))}
        return record_input(cls.task_name, record, where, Path.cwd())


class TextClassificationPipeline(Pipeline):
    """texts or (text, text_pair) pairs -> {"label", "score"}; top_k=None (or a number) -> a list of
    them, best first."""

    task_name = "text-classification"
    example = {"text": "a gripping, funny and moving film"}

    def run(self, inputs, top_k: int | None = 1, batch_size: int = 64):
        texts = []
        for item in inputs:
            if isinstance(item, dict):  # transformers' {"text", "text_pair"}
                item = (item.get("text"), item["text_pair"]) if item.get("text_pair") else item.get("text")
            texts.append(tuple(check_text(t) for t in item) if isinstance(item, (tuple, list)) else check_text(item))
        preprocessor = self.model.preprocessor
        if hasattr(preprocessor, "tokenizer"):
            lengths = warn_if_cut(preprocessor.tokenizer, [t if isinstance(t, str) else " ".join(t) for t in texts],
                                  preprocessor.max_len - 2)
        else:
            lengths = [len(str(text)) for text in texts]
        # one predict call a batch: predict pads all the texts it is given to the longest of them
        probabilities = by_length(lambda batch: self.model.predict(batch, batch_size=batch_size),
                                  texts, lengths, batch_size)
        return [ranked(row, preprocessor.labels, top_k) for row in probabilities]


def ranked(probabilities: torch.Tensor, labels: list[str], top_k: int | None) -> dict | list[dict]:
    order = probabilities.argsort(descending=True).tolist()[:top_k]
    best = [{"label": labels[i], "score": probabilities[i].item()} for i in order]
    return best[0] if top_k == 1 else best


class TokenClassificationPipeline(Pipeline):
    """text -> {"entities": [{"entity_group", "score", "word", "start", "end"}], "words", "tags"}, and
    "intent" for the taggers of intent and slots (families.Pipelines tagger="intent_and_slots":
    ATIS's), which tag every word of a long text in overlapping windows (JointIntentSlotTask.predict);
    a tagger of scored entities (tagger="entities") tags the words its tokenizer's pre-tokenizer sees."""

    task_name = "token-classification"
    example = {"text": "show me flights from boston to denver"}

    @property
    def scored(self) -> bool:
        """Whether the model tags scored entities (else intent and slots), as its family declares."""
        return self.loaded.pipelines.tagger == "entities"

    def run(self, inputs, batch_size: int = 64):
        texts = [check_text(text) for text in inputs]
        tokenizer = self.model.preprocessor.tokenizer if self.scored else None
        words = [split_words(text, tokenizer) for text in texts]  # the ATIS taggers read long ones in windows
        # characters: a length that costs nothing and follows the count of word pieces
        return by_length(lambda batch: self.tag(batch, batch_size), list(zip(texts, words)),
                         [len(text) for text in texts], batch_size)

    def tag(self, texts_and_words: list[tuple[str, list]], batch_size: int) -> list[dict]:
        """The results of texts and their words (split_words)."""
        plain = [[w for w, _, _ in row] for _, row in texts_and_words]
        results = []
        if self.scored:
            for (text, row), (tags, scores) in zip(texts_and_words, self.model.predict_scored(plain, batch_size)):
                results.append({"entities": entities(row, tags, scores, text), "words": [w for w, _, _ in row],
                                "tags": tags})
            return results
        for (text, row), prediction in zip(texts_and_words, self.model.predict(plain, batch_size=batch_size)):
            results.append({"intent": prediction["intent"],
                            "entities": entities(row, prediction["slots"], [None] * len(row), text),
                            "words": [w for w, _, _ in row], "tags": prediction["slots"]})
        return results


class QuestionAnsweringPipeline(Pipeline):
    """{"question", "context"} (or question=, context=) -> {"answer", "score", "start", "end",
    "windows"}, context[start:end] == answer. A context longer than the model reads is read in
    overlapping windows (doc_stride tokens shared; null: half a window), the best span of any
    window the answer; "windows" says how many were read."""

    task_name = "question-answering"
    example = {"question": "who wrote the report", "context": "the report was written by the committee"}

    def __call__(self, inputs=None, question=None, context=None, **options):
        if inputs is None:
            if isinstance(question, list):
                inputs = [{"question": q, "context": c} for q, c in zip(question, context)]
            else:
                inputs = {"question": question, "context": context}
        return super().__call__(inputs, **options)

    def run(self, inputs, batch_size: int = 16, doc_stride: int | None = None):
        for item in inputs:
            if not isinstance(item, dict):
                raise TransformerLabError("question-answering takes {'question': ..., 'context': ...}")
        questions = [check_text(item.get("question"), "question") for item in inputs]
        contexts = [check_text(item.get("context"), "context") for item in inputs]
        return self.model.predict(questions, contexts, batch_size=batch_size, doc_stride=doc_stride)


class FillMaskPipeline(Pipeline):
    """text with `[MASK]` -> its top_k fills [{"token", "token_id", "score"}], a list of them per
    mask when the text has several."""

    task_name = "fill-mask"
    example = {"text": "show me [MASK] from boston to denver"}
    rules = {"top_k": Option(int, minimum=1)}

    def run(self, inputs, top_k: int = 5, batch_size: int = 64):
        texts = [check_text(text) for text in inputs]
        for i, text in enumerate(texts):
            if "[MASK]" not in text:
                raise TransformerLabError(f"input {i} has no [MASK] to fill: {text[:60]!r}")
        preprocessor = self.model.preprocessor
        warn_if_cut(preprocessor.tokenizer, texts, preprocessor.max_len - 2)
        filled = self.model.fill_mask(texts, top_k, batch_size)
        return [masks[0] if len(masks) == 1 else masks for masks in filled]


class FeatureExtractionPipeline(Pipeline):
    """text -> its embedding: the encoder's last hidden states averaged over the text's tokens
    (sentence-transformers' mean pooling), unit length with normalize=True. `similarity(a, b)`
    is the cosine of two texts' embeddings. The encoder is the BERT body at the attribute path its
    family declares (families.Pipelines body=, e.g. "model.bert"); a family that declares none
    gives its task's own features: ELMo's L + 1 layers, averaged (the scalar mix with equal weights
    and γ = 1), then over the words."""

    task_name = "feature-extraction"
    example = {"text": "a sentence to embed"}

    def __init__(self, loaded: LoadedModel, **defaults):
        super().__init__(loaded, **defaults)
        body = loaded.pipelines.body
        self.bert = None
        if body is None:  # the task's own features()
            return
        from transformer_lab.data.bert import BertPreprocessor

        self.bert = operator.attrgetter(body)(self.model)
        tokenizer = self.model.preprocessor.tokenizer
        self.preprocessor = BertPreprocessor(tokenizer, max_len=self.bert.embeddings.position.num_embeddings)

    def run(self, inputs, normalize: bool = False, batch_size: int = 64) -> list[list[float]]:
        return self.embed([check_text(text) for text in inputs], normalize, batch_size).tolist()

    def embed(self, texts: list[str], normalize: bool = False, batch_size: int = 64) -> torch.Tensor:
        from transformer_lab.tasks.inference import batches

        if self.bert is None:  # ELMo: sentences longer than its max_len are cut by its preprocessor
            layers = self.model.features(texts, batch_size=batch_size)
            embeddings = torch.stack([sentence.mean(0).mean(0) for sentence in layers])
            return F.normalize(embeddings, dim=-1) if normalize else embeddings
        warn_if_cut(self.preprocessor.tokenizer, texts, self.preprocessor.max_len - 2)
        pooled = []
        with torch.no_grad():
            for chunk in batches(self.preprocessor.batch(texts), batch_size, torch.device("cpu")):
                hidden = self.bert.eval()(chunk["input_ids"], chunk["segment_ids"], chunk["attention_mask"])[0]
                mask = chunk["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled.append((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9))
        embeddings = torch.cat(pooled)
        return F.normalize(embeddings, dim=-1) if normalize else embeddings

    def similarity(self, a: str, b: str) -> float:
        first, second = self.embed([check_text(a), check_text(b)])
        return F.cosine_similarity(first, second, dim=0).item()


class TextGenerationPipeline(Pipeline):
    """prompt -> {"generated_text"} (prompt and continuation), with generate's options:
    max_new_tokens, strategy (greedy | sample), temperature, top_k, top_p, seed, stop_at_eos,
    use_cache."""

    task_name = "text-generation"
    example = {"text": "The"}

    def run(self, inputs, max_new_tokens: int = 50, strategy: str = "greedy", temperature: float = 1.0,
            top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
            return_full_text: bool = True, stop_at_eos: bool = True, use_cache: bool = True):
        if not all(isinstance(prompt, str) for prompt in inputs):
            raise TransformerLabError("text-generation takes prompts (strings)")
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        sampling = dict(strategy=strategy, temperature=temperature, top_k=top_k, top_p=top_p, use_cache=use_cache)
        results = []
        for prompt in inputs:  # one call each: prompts of different lengths cannot share a batch
            new = self.model.predict([prompt], max_new_tokens, stop_at_eos=stop_at_eos, generator=generator,
                                     **sampling)[0]["text"]
            results.append({"generated_text": prompt + new if return_full_text else new})
        return results


class TranslationPipeline(Pipeline):
    """source sentence -> {"translation_text"}, beam search: num_beams (1 = greedy), length_penalty."""

    task_name = "translation"
    example = {"text": "she buys two red apples."}

    def run(self, inputs, num_beams: int = 4, length_penalty: float = 1.0, batch_size: int = 64):
        texts = [check_text(text, f"input {i}") for i, text in enumerate(inputs)]
        translations = self.model.predict(texts, num_beams=num_beams, length_penalty=length_penalty,
                                          batch_size=batch_size)
        return [{"translation_text": text} for text in translations]


class ImageClassificationPipeline(Pipeline):
    """image file (or a uint8 (C, H, W) array) -> {"label", "score"}; top_k as text-classification."""

    task_name = "image-classification"

    def run(self, inputs, top_k: int | None = 1, batch_size: int = 64):
        config = self.model.model.config
        images = np.stack([read_image(image, config.in_channels, config.image_size) for image in inputs])
        probabilities, _ = self.model.predict(images, batch_size=batch_size)
        return [ranked(row, self.model.preprocessor.labels, top_k) for row in probabilities]

    def input_example(self) -> dict:
        """A blank image of the model's size and channels, as a served row carries one: a PNG file's
        bytes, base64-encoded."""
        import base64
        import io

        from PIL import Image

        config = self.model.model.config
        image = Image.fromarray(np.zeros((config.image_size, config.image_size), dtype=np.uint8))
        buffer = io.BytesIO()
        image.convert("L" if config.in_channels == 1 else "RGB").save(buffer, format="PNG")
        return {"image": base64.b64encode(buffer.getvalue()).decode()}

    @classmethod
    def served_input(cls, record: dict, where: str) -> bytes:
        """A served row's `image`: the bytes of an image file, base64-encoded."""
        import base64
        import binascii

        encoded = record.get("image")
        if not isinstance(encoded, str) or not encoded.strip():
            raise TransformerLabError(f"{where}: field 'image' is missing or empty")
        try:
            return base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise TransformerLabError(f"{where}: field 'image' is not base64-encoded bytes") from None


class TabularClassificationPipeline(Pipeline):
    """table row (a dict of feature columns, cells as in the CSV) -> {"label", "score"}; top_k as
    text-classification. A row without one of the model's feature columns is one error (the
    preprocessor's, naming the row)."""

    task_name = "tabular-classification"
    typed_cells = False  # a table row's cells are numbers or missing markers ("?"), as cells of a CSV

    def run(self, inputs, top_k: int | None = 1, batch_size: int = 1024):
        for i, row in enumerate(inputs):
            if not isinstance(row, dict):
                raise TransformerLabError(f"row {i} is a {type(row).__name__}; tabular-classification takes "
                                          "dicts of the feature columns")
        probabilities = self.model.predict(inputs, batch_size=batch_size)
        return [ranked(row, self.model.preprocessor.labels, top_k) for row in probabilities]

    def input_example(self) -> dict:
        """A row of the model's feature columns: each category column's first category, each
        continuous column's training mean."""
        encoder = self.model.preprocessor.encoder
        row = {c: encoder.categories[c][0] if encoder.categories[c] else "" for c in encoder.categorical}
        row.update({c: encoder.means[c] for c in encoder.continuous})
        return row

    @classmethod
    def served_input(cls, record: dict, where: str) -> dict:
        """A served row as it is: pandas' NaN is a missing cell, which the preprocessor reads as one."""
        from transformer_lab.inference.predict import record_input

        return record_input(cls.task_name, record, where, Path.cwd())


PIPELINES = {p.task_name: p for p in (TextClassificationPipeline, TokenClassificationPipeline,
                                      QuestionAnsweringPipeline, FillMaskPipeline, FeatureExtractionPipeline,
                                      TextGenerationPipeline, TranslationPipeline, ImageClassificationPipeline,
                                      TabularClassificationPipeline)}
# The pipeline tasks and the models that do them (families.py's entries, NOT_FAMILIES): the registry read by task.
TASKS: dict[str, tuple[str, ...]] = {task: tuple(name for name in (*FAMILIES, *NOT_FAMILIES) if task in tasks_of(name))
                                     for task in PIPELINES}


def pipeline(task: str | None = None, model: str | LoadedModel | None = None, tracking_uri: str | None = None,
             **defaults) -> Pipeline:
    """The pipeline of `task` on `model` (see the module docstring); task=None: the model's own."""
    if task is not None and task not in PIPELINES:
        raise TransformerLabError(f"task={task}: not a pipeline task; choose one of {', '.join(PIPELINES)}")
    if model is None:
        raise TransformerLabError("model= is required: a checkpoint, a stage's folder, an MLflow run or "
                                  "model URI, or a published encoder (minilm)")
    check_options(task, defaults)  # before the model loads; names too once the task is known
    loaded = load_model(model, tracking_uri)
    possible = loaded.tasks
    if not possible:
        raise TransformerLabError(f"model={loaded.source} is a {loaded.family} model: no pipeline task reads it")
    if task is None:
        task = possible[0]
    elif task not in possible:
        raise TransformerLabError(f"model={loaded.source} is a {loaded.family} model: it does "
                                  f"{' and '.join(possible)}, not {task}")
    return PIPELINES[task](loaded, **defaults)
