"""One prediction interface: every task's `predict` takes raw inputs, encodes them with the preprocessor
that travels in its checkpoint, runs without dropout or autograd, in batches, and hands the module back
in the mode it came in (train or eval, per submodule, even on error)."""

import pytest
import torch

from transformer_lab.data.tokenizers import train_tokenizer
from transformer_lab.errors import TransformerLabError

TEXTS = ["show me flights from boston to denver", "what is the cheapest fare to dallas",
         "who drew the old maps of lisbon", "the maps were drawn by a chemist"]
INTENTS, SLOTS = ["flight", "fare", "other"], ["O", "B-city", "I-city", "UNK"]


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    train_tokenizer("wordpiece", TEXTS * 3, 200, lowercase=True).save(str(path))
    return path


def _cases(tokenizer_path) -> dict:
    """name -> (tiny task, a call of its predict on raw inputs). Dropout stays on (0.1 by default) so
    that a predict left in train mode would show up as two different answers."""
    from tokenizers import Tokenizer

    from transformer_lab.data.atis import AtisPreprocessor
    from transformer_lab.data.atis_bert import AtisBertPreprocessor
    from transformer_lab.data.bert import BertPreprocessor
    from transformer_lab.data.conll import TaggingPreprocessor
    from transformer_lab.data.gpt import GPTClassificationPreprocessor, GPTPreprocessor
    from transformer_lab.data.images import ImagePreprocessor
    from transformer_lab.data.qa import QAPreprocessor
    from transformer_lab.data.tabular import TableSchema, TabularEncoder, TabularPreprocessor
    from transformer_lab.data.text_classification import TextClassificationPreprocessor
    from transformer_lab.data.word2vec import Word2VecPreprocessor
    from transformer_lab.tasks.bert_joint_intent_slot import BertJointIntentSlotTask
    from transformer_lab.tasks.bert_pretraining import BertPretrainingTask
    from transformer_lab.tasks.gpt import GPTClassificationTask, GPTPretrainingTask
    from transformer_lab.tasks.image_classification import ImageClassificationTask
    from transformer_lab.tasks.joint_intent_slot import JointIntentSlotTask
    from transformer_lab.tasks.question_answering import QuestionAnsweringTask
    from transformer_lab.tasks.sequence_classification import SequenceClassificationTask
    from transformer_lab.tasks.tabular_classification import TabularClassificationTask
    from transformer_lab.tasks.token_classification import TokenClassificationTask
    from transformer_lab.tasks.word2vec import Word2VecTask

    torch.manual_seed(0)
    wordpiece = Tokenizer.from_file(str(tokenizer_path))
    bpe = gpt_tokenizer()
    bert = dict(vocab_size=wordpiece.get_vocab_size(), n_layers=1, d_model=16, n_heads=2, max_len=32)
    gpt = dict(vocab_size=bpe.get_vocab_size(), n_layers=1, d_model=16, n_heads=2, max_len=32)
    words = [text.split() for text in TEXTS]
    vocab = ["[PAD]", "[UNK]", "[CLS]", *sorted({w for text in words for w in text})]
    masked = ["show me [MASK] from boston", "the [MASK] were [MASK] by a chemist"]
    schema = TableSchema("toy", "y", categorical=["colour"], continuous=["size"])
    encoder = TabularEncoder(["colour"], ["size"], {"colour": ["blue", "red"]}, {"size": 1.0}, {"size": 2.0}, [],
                             ["no", "yes"])
    rows = [{"colour": "red", "size": 1.5}, {"colour": "blue", "size": "?"}, {"colour": "green", "size": 0}]
    images = torch.randint(0, 256, (5, 1, 8, 8), dtype=torch.uint8)
    return {
        "atis": (JointIntentSlotTask(dict(vocab_size=len(vocab), max_len=16, d_model=16, n_heads=2, n_layers=1,
                                          n_intents=3, n_slots=4), AtisPreprocessor(vocab, INTENTS, SLOTS).to_state()),
                 lambda task: task.predict(words, batch_size=3)),
        "bert_atis": (BertJointIntentSlotTask({**bert, "n_intents": 3, "n_slots": 4},
                                              AtisBertPreprocessor(wordpiece, INTENTS, SLOTS, max_len=32).to_state()),
                      lambda task: task.predict(words, batch_size=3)),
        "bert_qa": (QuestionAnsweringTask(bert, QAPreprocessor(wordpiece, max_len=32, max_question_tokens=8).to_state()),
                    lambda task: task.predict(TEXTS[:2], TEXTS[2:], batch_size=1)),
        "bert_classifier": (SequenceClassificationTask({**bert, "n_classes": 2}, TextClassificationPreprocessor(
                                wordpiece, ["neg", "pos"], max_len=32).to_state()),
                            lambda task: task.predict([TEXTS[0], (TEXTS[1], TEXTS[2]), TEXTS[3]], batch_size=2)),
        "bert_ner": (TokenClassificationTask({**bert, "n_labels": 3}, TaggingPreprocessor(
                         wordpiece, ["B-LOC", "I-LOC", "O"], max_len=32).to_state()),
                     lambda task: task.predict(words, batch_size=3)),
        "bert_pretraining": (BertPretrainingTask(bert, BertPreprocessor(wordpiece, max_len=32).to_state()),
                             lambda task: task.predict(masked, batch_size=1)),
        "gpt_classifier": (GPTClassificationTask({**gpt, "n_classes": 2}, GPTClassificationPreprocessor(
                               bpe, ["a", "b"], max_len=32).to_state()),
                           lambda task: task.predict(TEXTS, batch_size=2)),
        "gpt_pretraining": (GPTPretrainingTask(gpt, GPTPreprocessor(bpe).to_state()),
                            lambda task: task.predict(["show me", "show me"], 5, strategy="greedy")),
        "vit": (ImageClassificationTask(dict(image_size=8, n_layers=1, d_model=16, n_heads=2),
                                        ImagePreprocessor(list("0123456789"), [0.3], [0.2]).to_state()),
                lambda task: task.predict(images, batch_size=2, return_weights=True)),
        "tabular": (TabularClassificationTask(dict(cardinalities=encoder.cardinalities, n_continuous=1, d_model=8,
                                                   n_layers=1, n_heads=2),
                                              TabularPreprocessor(schema, encoder).to_state()),
                    lambda task: task.predict(rows, batch_size=2)),
        "word2vec": (Word2VecTask(dict(vocab_size=4, dim=6), Word2VecPreprocessor(["a", "b", "c", "d"],
                                                                                 [9, 5, 3, 1]).to_state()),
                     lambda task: task.predict(["c", "a"])),
    }


def gpt_tokenizer():
    return train_tokenizer("bpe", TEXTS * 3, 300)


CASES = ["atis", "bert_atis", "bert_qa", "bert_classifier", "bert_ner", "bert_pretraining", "gpt_classifier",
         "gpt_pretraining", "vit", "tabular", "word2vec"]


def _modes(module: torch.nn.Module) -> list[bool]:
    return [m.training for m in module.modules()]


def _same(a, b) -> bool:
    if torch.is_tensor(a):
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("training", [True, False], ids=["from_train", "from_eval"])
@pytest.mark.parametrize("name", CASES)
def test_predict_leaves_the_mode_as_it_was(tokenizer_path, name, training):
    task, predict = _cases(tokenizer_path)[name]
    task.train(training)
    before = _modes(task)
    first = predict(task)
    assert task.training is training and _modes(task) == before
    assert _same(predict(task), first)  # no dropout: the same answer twice, even from train mode
    tensors = [first] if torch.is_tensor(first) else [t for t in first if torch.is_tensor(t)]
    assert not any(t.requires_grad for t in tensors)  # under no_grad: no graph kept


def test_predict_restores_mixed_modes_and_restores_them_after_an_error(tokenizer_path):
    task, predict = _cases(tokenizer_path)["word2vec"]
    task.train()
    task.model.input_vectors.eval()  # a part held in eval mode on purpose stays so
    before = _modes(task)
    predict(task)
    assert _modes(task) == before
    with pytest.raises(TransformerLabError, match="not in the vocabulary: 'zebra'"):
        task.predict(["a", "zebra"])
    assert _modes(task) == before


def test_batching_does_not_change_predictions(tokenizer_path):
    cases = _cases(tokenizer_path)
    atis, _ = cases["atis"]
    words = [text.split() for text in TEXTS]
    assert atis.predict(words, batch_size=1) == atis.predict(words)
    vit, _ = cases["vit"]
    images = torch.randint(0, 256, (7, 1, 8, 8), dtype=torch.uint8)
    classes, weights = vit.predict(images, batch_size=3, return_weights=True)
    whole, whole_weights = vit.predict(images, return_weights=True)
    torch.testing.assert_close(classes, whole)
    assert len(weights) == 1 and weights[0].shape == (7, 2, 17, 17)
    torch.testing.assert_close(weights[0], whole_weights[0])
    assert vit.predict(images)[1] is None
    tabular, _ = cases["tabular"]
    rows = [{"colour": c, "size": s} for c, s in (("red", 1), ("blue", None), ("green", "2.5"), (None, -1))]
    probabilities = tabular.predict(rows, batch_size=3)
    torch.testing.assert_close(probabilities, tabular.predict(rows))
    torch.testing.assert_close(probabilities.sum(-1), torch.ones(4))
    word2vec, _ = cases["word2vec"]
    torch.testing.assert_close(word2vec.predict(["c", "a"]), torch.from_numpy(word2vec.vectors()[1][[2, 0]]))
