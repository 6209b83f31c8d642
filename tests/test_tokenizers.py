import numpy as np
import pytest
from tokenizers import Tokenizer

from transformer_lab.data.corpus import prepare, read_documents
from transformer_lab.data.tokenizers import (
    BERT_SPECIAL,
    END_OF_TEXT,
    document_text,
    prepare_tokenizers,
    train_tokenizer,
)

SPECS = {
    "wordpiece": {"kind": "wordpiece", "vocab_size": 2000, "lowercase": True, "document_separator": None},
    "bpe": {"kind": "bpe", "vocab_size": 800, "document_separator": END_OF_TEXT},
    "char": {"kind": "char", "vocab_size": 500, "document_separator": END_OF_TEXT},
}


@pytest.fixture(scope="module")
def encoded(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    prepare("builtin", str(root / "corpus"))
    summary = prepare_tokenizers(str(root / "corpus"), str(root / "tokenizers"), SPECS)
    return root, summary


@pytest.mark.parametrize("name", ["bpe", "char"])
def test_decode_encode_round_trips(encoded, name):
    root, _ = encoded
    tokenizer = Tokenizer.from_file(str(root / "tokenizers" / name / "tokenizer.json"))
    for document in read_documents(root / "corpus", "validation")[:10]:
        text = document_text(document)
        assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_bpe_round_trips_text_it_never_saw():
    tokenizer = train_tokenizer("bpe", ["the cat sat on the mat"] * 50, 300)
    text = "Zürich — naïve café, 4:00pm 🙂"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text  # byte level: no unknown tokens


def test_char_tokenizer_is_one_token_per_character_line_breaks_included():
    text = "First Citizen:\nSpeak, speak.\n\nAll:\n\n\nResolved.\n"
    tokenizer = train_tokenizer("char", [text], 100)
    encoding = tokenizer.encode(text)
    assert encoding.tokens == list(text)  # a run of line breaks is not one token (a per-character loss needs this)
    assert tokenizer.decode(encoding.ids) == text


def test_wordpiece_has_bert_special_tokens_and_lowercases(encoded):
    root, _ = encoded
    tokenizer = Tokenizer.from_file(str(root / "tokenizers" / "wordpiece" / "tokenizer.json"))
    assert [tokenizer.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 1, 2, 3, 4]
    assert tokenizer.encode("The FIRE").tokens[0] == "the"


def test_corpus_is_encoded_once_with_document_separators(encoded):
    root, summary = encoded
    bpe = Tokenizer.from_file(str(root / "tokenizers" / "bpe" / "tokenizer.json"))
    ids = np.load(root / "tokenizers" / "bpe" / "validation.npy")
    assert ids.dtype == np.uint16 and len(ids) == summary["bpe"]["validation_tokens"]
    assert (ids == bpe.token_to_id(END_OF_TEXT)).sum() == len(read_documents(root / "corpus", "validation"))
    assert summary["char"]["vocab_size"] < 200 and summary["wordpiece"]["vocab_size"] == 2000


def test_wordpiece_training_is_deterministic(encoded):
    # tokenizers' WordPiece trainer alone learns a different vocabulary on almost every run
    # on this corpus (huggingface/tokenizers#1794)
    root, _ = encoded
    texts = [document_text(d) for d in read_documents(root / "corpus", "train")]
    tokenizers = [train_tokenizer("wordpiece", texts, 2000, lowercase=True) for _ in range(5)]
    assert len({tuple(sorted(t.get_vocab().items())) for t in tokenizers}) == 1
    tokenizer = tokenizers[0]
    # the reserved "##" pieces are plain vocabulary entries, not special tokens
    assert sorted(t.content for t in tokenizer.get_added_tokens_decoder().values()) == sorted(BERT_SPECIAL)
    assert tokenizer.token_to_id("##s") is not None
    pieces = tokenizer.encode("cats", add_special_tokens=False).tokens
    assert "".join(piece.removeprefix("##") for piece in pieces) == "cats"
    assert all(piece.startswith("##") for piece in pieces[1:])
