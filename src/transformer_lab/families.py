"""The model families, each declared once: what trains it, on what data, what it is selected on,
where it sits in the pipeline, how a trained model of it is evaluated, read by `pipeline()`,
served and exported.

`train()`, the evaluators, `pipeline()`, the served MLflow model and `pipelines/export.py` look a
family up here instead of knowing any of them; a `model=` / `task=` / `data=` combination that no
family declares is one error before anything is built. Classes and functions are named by import
path, so reading the registry imports no model code (runtime/stage_deps.py follows imports: a
change to one family's code reruns that family's stages only). Every field of an entry is given:
a family without an evaluator, a pipeline task or an export says so (None), so that a new entry
cannot leave one out unnoticed (tests/test_families.py).
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Literal, Protocol, runtime_checkable

from transformer_lab.errors import TransformerLabError
from transformer_lab.utils.resolvers import register_resolver
from transformer_lab.utils.validate import check_batch_sizes, check_trainer, check_types

Mode = Literal["min", "max"]
Tagger = Literal["entities", "intent_and_slots"]


@dataclass(frozen=True)
class Metric:
    name: str
    mode: Mode  # whether a better model has a lower (loss, perplexity) or higher (accuracy, F1) value


@dataclass(frozen=True)
class Pipelines:
    """How `transformer_lab.pipeline()` (inference/pipeline.py) reads a trained model, and so how the
    training run's logged MLflow model serves it (inference/served.py)."""

    tasks: tuple[str, ...]  # the pipeline tasks it does (inference/pipeline.py's PIPELINES); the first is
    #                         the one it does when `task` is left out
    _: KW_ONLY
    # feature-extraction: the attribute path, from the loaded model, of the BERT body whose last
    # hidden states are mean-pooled ("model.bert": the task's model's body); None: the task's own
    # `features(texts, batch_size)` (ELMo's layers)
    body: str | None = None
    # token-classification: "entities": the words its tokenizer's pre-tokenizer sees, each tag scored
    # (the task's `predict_scored`); "intent_and_slots": the words as typed (split at spaces), their
    # slot tags and the utterance's intent (the task's `predict`)
    tagger: Tagger | None = None

    def __post_init__(self):
        if not self.tasks:
            raise ValueError("Pipelines(): no task; a family that no pipeline reads declares pipelines=None")
        if ("token-classification" in self.tasks) != (self.tagger is not None):
            raise ValueError(f"Pipelines{self.tasks}: tagger= goes with token-classification, and only with it")
        if self.body is not None and "feature-extraction" not in self.tasks:
            raise ValueError(f"Pipelines{self.tasks}: body= goes with feature-extraction only")


@dataclass(frozen=True)
class Export:
    """How `pipelines/export.py` writes a trained model as a Hugging Face folder (inference/export.py)
    that `transformers` loads with its own class."""

    architecture: str   # the `transformers` class (config.json's `architectures`)
    converter: str      # the module that builds that class's config, weights and tokenizer from the
    #                     model's (inference/hf_bert.py, inference/hf_gpt2.py)
    labels: str | None  # the preprocessor's attribute listing its head's labels (config.json's
    #                     id2label); None: no labels are written
    _: KW_ONLY
    omit: tuple[str, ...] = ()  # prefixes of the model's own weights that the class has no place for
    body: str = ""              # the prefix the class's weight names lack: "bert." for BertModel, the body alone
    beside: str | None = None   # the function (task, folder) that writes what the class does not hold
    #                             next to it (JointBERT's intent and slot heads)


@dataclass(frozen=True)
class Family:
    name: str                     # the conf/task/ file that selects it
    model: str                    # the nn.Module the task trains
    config: str                   # its config class: the `_target_` of conf/model/<...>.yaml
    task: str                     # the LightningModule: the `_target_` of conf/task/<name>.yaml
    datamodule: str               # the LightningDataModule: the `_target_` of conf/data/<...>.yaml datamodule
    metrics: tuple[Metric, ...]   # what a run may be selected on (optimized_metric); the first is the default
    stages: tuple[str, ...]       # its DVC stages (dvc.yaml)
    _: KW_ONLY                    # the rest by name, none of them left out (None: the family has none)
    evaluator: str | None         # the function `pipelines/evaluate.py evaluate=<name>` runs (conf/evaluate/)
    pipelines: Pipelines | None   # how pipeline() reads its checkpoints; None: no pipeline task does
    export: Export | None         # how its checkpoints become a Hugging Face folder; None: no `transformers` class

    def metric(self, name: str) -> Metric:
        for metric in self.metrics:
            if metric.name == name:
                return metric
        choices = ", ".join(f"{m.name} ({m.mode})" for m in self.metrics)
        raise TransformerLabError(f"optimized_metric={name}: not a metric of {self.name}; choose one of {choices}")


@runtime_checkable
class Preprocessor(Protocol):
    """A family's whole encoding state (vocabulary or tokenizer, label names, lengths, statistics) and
    the encoding of raw inputs into model features, used by its datamodule and by its task's predict."""

    def to_state(self) -> dict:
        """Plain JSON-able values only: the task keeps it in its checkpoint, which is read with
        torch.load(weights_only=True)."""

    @classmethod
    def from_state(cls, state: dict) -> Preprocessor:
        """The preprocessor back from to_state(); a state that lacks a key is one TransformerLabError."""


@runtime_checkable
class FamilyDataModule(Protocol):
    """What every datamodule provides besides Lightning's loaders: what only the data knows."""

    preprocessor: Preprocessor  # train() hands `preprocessor.to_state()` to the task

    def model_kwargs(self) -> dict:
        """The model config's sizes that come from the data (vocabulary size, label counts, image size)."""


def _metrics(*pairs: str) -> tuple[Metric, ...]:
    return tuple(Metric(*pair.split(":")) for pair in pairs)


M, T, D, E = "transformer_lab.models.", "transformer_lab.tasks.", "transformer_lab.data.", "transformer_lab.evaluation."
CLASSIFICATION = _metrics("val/acc:max", "val/macro_f1:max", "val/loss:min")
SLOTS = _metrics("val/slot_f1:max", "val/intent_acc:max", "val/sentence_acc:max", "val/loss:min")
BERT_BODY = "model.bert"  # a BERT task's model's encoder: what feature-extraction mean-pools
HF_BERT, HF_GPT2 = "transformer_lab.inference.hf_bert", "transformer_lab.inference.hf_gpt2"

FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("joint_intent_slot", M + "encoder.JointIntentSlotModel", M + "encoder.JointIntentSlotConfig",
           T + "joint_intent_slot.JointIntentSlotTask", D + "atis.AtisDataModule", SLOTS,
           ("prepare_atis", "train_atis", "evaluate_atis", "train_atis_no_elmo", "train_atis_elmo", "compare_atis_elmo"),
           evaluator=E + "atis.evaluate",
           pipelines=Pipelines(("token-classification",), tagger="intent_and_slots"),
           export=None),
    Family("word2vec", M + "word2vec.Word2Vec", M + "word2vec.Word2VecConfig", T + "word2vec.Word2VecTask",
           D + "word2vec.Word2VecDataModule", _metrics("val/loss:min"),
           ("prepare_corpus", "pretrain_word2vec", "evaluate_word2vec"),
           evaluator=E + "word2vec.evaluate",
           pipelines=None,  # what it gives is its vectors: evaluate_word2vec writes them (vectors.txt)
           export=None),
    Family("glove", M + "glove.GloVe", M + "glove.GloVeConfig", T + "glove.GloVeTask", D + "glove.GloVeDataModule",
           _metrics("val/loss:min"),
           ("prepare_corpus", "pretrain_glove", "evaluate_glove"),
           evaluator=E + "glove.evaluate",
           pipelines=None,  # as word2vec's: what it gives is its vectors, which evaluate_glove writes (vectors.txt)
           export=None),
    Family("bert_pretraining", M + "bert.BertForPreTraining", M + "bert.BertConfig",
           T + "bert_pretraining.BertPretrainingTask", D + "bert.BertPretrainingDataModule",
           _metrics("val/loss:min", "val/mlm_loss:min", "val/mlm_acc:max", "val/nsp_acc:max"),
           ("prepare_corpus", "train_tokenizers", "pretrain_bert"),
           evaluator=None,
           pipelines=Pipelines(("fill-mask", "feature-extraction"), body=BERT_BODY),
           export=Export("BertForMaskedLM", HF_BERT, None, omit=("nsp.", "bert.pooler."))),
    Family("sequence_classification", M + "bert.BertForSequenceClassification", M + "bert.BertClassifierConfig",
           T + "sequence_classification.SequenceClassificationTask",
           D + "text_classification.TextClassificationDataModule", CLASSIFICATION,
           ("finetune_sentiment", "finetune_sentiment_scratch", "finetune_sentiment_minilm", "compare_sentiment",
            "finetune_pairs"),
           evaluator=None,
           pipelines=Pipelines(("text-classification", "feature-extraction"), body=BERT_BODY),
           export=Export("BertForSequenceClassification", HF_BERT, "labels")),
    Family("bert_joint_intent_slot", M + "bert.BertForJointIntentSlot", M + "bert.BertJointConfig",
           T + "bert_joint_intent_slot.BertJointIntentSlotTask", D + "atis_bert.AtisBertDataModule", SLOTS,
           ("finetune_atis",),
           evaluator=None,
           pipelines=Pipelines(("token-classification", "feature-extraction"), body=BERT_BODY,
                               tagger="intent_and_slots"),
           export=Export("BertModel", HF_BERT, None, omit=("intent_head.", "slot_head."), body="bert.",
                         beside=HF_BERT + ".write_joint_heads")),
    Family("token_classification", M + "bert.BertForTokenClassification", M + "bert.BertTaggerConfig",
           T + "token_classification.TokenClassificationTask", D + "conll.ConllDataModule",
           _metrics("val/f1:max", "val/token_acc:max", "val/loss:min"), (),
           evaluator=None,
           pipelines=Pipelines(("token-classification", "feature-extraction"), body=BERT_BODY, tagger="entities"),
           export=Export("BertForTokenClassification", HF_BERT, "labels", omit=("bert.pooler.",))),
    Family("question_answering", M + "bert.BertForQuestionAnswering", M + "bert.BertConfig",
           T + "question_answering.QuestionAnsweringTask", D + "qa.QADataModule",
           _metrics("val/f1:max", "val/exact_match:max", "val/loss:min"), ("finetune_qa",),
           evaluator=None,
           pipelines=Pipelines(("question-answering", "feature-extraction"), body=BERT_BODY),
           export=Export("BertForQuestionAnswering", HF_BERT, None, omit=("bert.pooler.",))),
    Family("gpt_pretraining", M + "gpt.GPTLMHeadModel", M + "gpt.GPTConfig", T + "gpt.GPTPretrainingTask",
           D + "gpt.LanguageModelDataModule", _metrics("val/loss:min", "val/perplexity:min"),
           ("prepare_corpus", "train_tokenizers", "pretrain_gpt", "generate_gpt"),
           evaluator="transformer_lab.inference.generate.generate",
           pipelines=Pipelines(("text-generation",)),
           export=Export("GPT2LMHeadModel", HF_GPT2, None)),
    Family("elmo_pretraining", M + "elmo.ElmoBiLM", M + "elmo.ElmoConfig", T + "elmo.ElmoPretrainingTask",
           D + "elmo.ElmoDataModule", _metrics("val/loss:min", "val/perplexity:min", "val/forward_loss:min"),
           ("prepare_corpus", "pretrain_elmo", "evaluate_elmo"),
           evaluator=E + "elmo.evaluate",
           pipelines=Pipelines(("feature-extraction",), body=None),  # body=None: its task's features()
           export=None),
    Family("gpt_classification", M + "gpt.GPTForSequenceClassification", M + "gpt.GPTClassifierConfig",
           T + "gpt.GPTClassificationTask", D + "gpt.GPTClassificationDataModule", CLASSIFICATION,
           ("finetune_gpt_sentiment",),
           evaluator=None,
           pipelines=Pipelines(("text-classification",)),
           export=None),
    Family("image_classification", M + "vit.VisionTransformer", M + "vit.ViTConfig",
           T + "image_classification.ImageClassificationTask", D + "images.ImageDataModule", CLASSIFICATION,
           ("prepare_images", "train_vit", "evaluate_vit"),
           evaluator=E + "vit.evaluate",
           pipelines=Pipelines(("image-classification",)),
           export=None),
    Family("translation", M + "seq2seq.TransformerSeq2Seq", M + "seq2seq.Seq2SeqConfig",
           T + "translation.TranslationTask", D + "translation.TranslationDataModule",
           _metrics("val/bleu:max", "val/chrf:max", "val/loss:min", "val/nll:min", "val/perplexity:min"),
           ("prepare_translation", "train_translation", "evaluate_translation"),
           evaluator=E + "translation.evaluate",
           pipelines=Pipelines(("translation",)),
           export=None),
    Family("multimodal_classification", M + "multimodal.MultimodalTransformer", M + "multimodal.MultimodalConfig",
           T + "multimodal.MultimodalClassificationTask", D + "multimodal.MultimodalDataModule", CLASSIFICATION,
           ("prepare_multimodal", "train_multimodal", "evaluate_multimodal"),
           evaluator=E + "multimodal.evaluate",
           pipelines=None,  # its input is a row of text and table columns with an image: no pipeline task's
           export=None),
    Family("tabular_classification", M + "tab_transformer.TabTransformer", M + "tab_transformer.TabTransformerConfig",
           T + "tabular_classification.TabularClassificationTask", D + "tabular.TabularDataModule",
           _metrics("val/loss:min", "val/auroc:max", "val/acc:max", "val/f1:max"),
           ("prepare_tabular", "train_tabular", "train_xgboost", "train_logreg", "evaluate_tabular"),
           evaluator=E + "tabular.evaluate",
           pipelines=Pipelines(("tabular-classification",)),
           export=None),
]}


def family_of_task(task_target: str) -> Family:
    for family in FAMILIES.values():
        if family.task == task_target:
            return family
    raise TransformerLabError(f"task._target_={task_target}: no family trains it (families.py lists "
                              f"{', '.join(f.task.rsplit('.', 1)[1] for f in FAMILIES.values())})")


def check_combination(task_target: str, model_target: str, datamodule_target: str, choices: dict) -> Family:
    """The family a config trains, or one line naming the part that does not belong to it.

    choices: the config groups' chosen options (Hydra's runtime choices), to name files, not classes."""
    family = family_of_task(task_target)
    for group, target, expected in (("model", model_target, family.config), ("data", datamodule_target,
                                                                              family.datamodule)):
        if target != expected:
            raise TransformerLabError(
                f"{group}={choices.get(group, '?')} ({target.rsplit('.', 1)[1]}) does not fit "
                f"task={choices.get('task', family.name)}: it trains {expected.rsplit('.', 1)[1]}; "
                f"pick an experiment (experiment=NAME) or a matching {group}=")
    return family


def metric_mode(name: str) -> Mode:
    """The mode of a metric any family declares: what the checkpoint callback's `mode` reads
    (`${metric_mode:${optimized_metric}}`), so that metric and mode cannot disagree."""
    modes = {m.mode for family in FAMILIES.values() for m in family.metrics if m.name == name}
    if len(modes) != 1:
        known = sorted({m.name for family in FAMILIES.values() for m in family.metrics})
        raise TransformerLabError(f"optimized_metric={name}: no family declares it; known: {', '.join(known)}")
    return modes.pop()


def check_config(cfg) -> Family:
    """The family a training config trains: its model, task and data must belong to one, the metric it
    is selected on must be one of its own, their settings must have the types their classes declare, and
    its batch sizes and trainer settings must be ones training can run with (utils/validate.py); else one
    line, before anything is built or any data is read."""
    from hydra.core.hydra_config import HydraConfig

    choices = dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else {}
    family = check_combination(cfg.task._target_, cfg.model._target_, cfg.data.datamodule._target_, choices)
    family.metric(cfg.optimized_metric)
    for node, where in ((cfg.data.datamodule, "data.datamodule"), (cfg.model, "model"), (cfg.task, "task")):
        check_types(node, where)
    check_batch_sizes(cfg.data.datamodule)
    check_trainer(cfg.trainer, choices.get("trainer"))  # last: a GPU trainer's check imports torch
    return family


# conf/callbacks/default.yaml: `mode: ${metric_mode:${optimized_metric}}`
register_resolver("metric_mode", metric_mode)
