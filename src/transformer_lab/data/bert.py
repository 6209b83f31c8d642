"""BERT inputs: `[CLS] A [SEP] (B [SEP])` with segment ids, truncation of long inputs,
next-sentence pairs from a prepared corpus, and masked-LM masking on the fly per batch.

Pre-training examples keep the corpus' documents: B is the sentence that follows A in its
document half of the time (IsNext) and a sentence from another document otherwise
(NotNext), as in the BERT paper. With next_sentence=False an example is one sentence,
`[CLS] A [SEP]`, and only the masked LM learns (RoBERTa dropped NSP; a corpus of single
sentences, such as a task's own unlabelled inputs, has no next sentence to predict).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader

from transformer_lab.data.corpus import read_documents
from transformer_lab.data.preprocessing import TokenizerPreprocessor
from transformer_lab.data.tokenizers import load_tokenizer
from transformer_lab.errors import DataError

IGNORE_INDEX = -100  # cross_entropy's default: no loss at this position
BERT_MASKING = {"mask": 0.8, "random": 0.1, "keep": 0.1}  # what becomes of a chosen token (the paper's 80/10/10)
TRUNCATION = ("head", "tail", "head_tail")


def truncate(ids: list[int], max_tokens: int, strategy: str = "head", head_tokens: int = 128) -> list[int]:
    """Shorten one long input to max_tokens (512 - 2 = 510 for a single BERT segment).

    head: the first max_tokens; tail: the last max_tokens; head_tail: the first head_tokens
    plus the last max_tokens - head_tokens (Sun et al., 2019, "How to Fine-Tune BERT for Text
    Classification": 128 + 382 did best on long reviews).
    """
    if strategy not in TRUNCATION:
        raise ValueError(f"truncation={strategy!r}; expected one of {', '.join(TRUNCATION)}")
    if len(ids) <= max_tokens:
        return list(ids)
    if strategy == "head":
        return list(ids[:max_tokens])
    if strategy == "tail":
        return list(ids[len(ids) - max_tokens:])
    head = min(head_tokens, max_tokens)
    return list(ids[:head]) + list(ids[len(ids) - (max_tokens - head):])


def truncate_pair(a: list[int], b: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
    """BERT's pair truncation: drop tokens from the end of the longer segment until both fit."""
    a, b = list(a), list(b)
    while len(a) + len(b) > max_tokens:
        (a if len(a) > len(b) else b).pop()
    return a, b


def special_ids(tokenizer: Tokenizer) -> dict[str, int]:
    ids = {name: tokenizer.token_to_id(f"[{name.upper()}]") for name in ("pad", "unk", "cls", "sep", "mask")}
    missing = [f"[{name.upper()}]" for name, i in ids.items() if i is None]
    if missing:
        raise DataError(f"tokenizer lacks BERT's special tokens {' '.join(missing)}; use the wordpiece tokenizer")
    return ids


def encode_pair(a: list[int], b: list[int] | None, specials: dict[str, int]) -> tuple[list[int], list[int]]:
    """`[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]` and segment ids (0 for A, 1 for B)."""
    ids = [specials["cls"], *a, specials["sep"]]
    segments = [0] * len(ids)
    if b is not None:
        ids += [*b, specials["sep"]]
        segments += [1] * (len(b) + 1)
    return ids, segments


def pad_batch(items: list[dict], pad_id: int, keys: tuple[str, ...] = ("input_ids", "segment_ids")) -> dict:
    """Right-pad the listed fields to the longest item; attention_mask is True on real tokens."""
    length = max(len(item["input_ids"]) for item in items)
    out = {}
    for key in keys:
        fill = pad_id if key == "input_ids" else 0
        out[key] = torch.tensor([item[key] + [fill] * (length - len(item[key])) for item in items])
    out["attention_mask"] = torch.tensor([[True] * len(item["input_ids"]) + [False] * (length - len(item["input_ids"]))
                                          for item in items])
    return out


def check_masking(masking: dict[str, float]) -> dict[str, float]:
    """{mask, random, keep}: the shares of chosen tokens that become [MASK], a random token, or stay."""
    if set(masking) != set(BERT_MASKING) or any(v < 0 for v in masking.values()) \
            or abs(sum(masking.values()) - 1) > 1e-6:
        raise DataError(f"data.datamodule.masking={dict(masking)}: expected shares mask, random, keep "
                        "(each >= 0, summing to 1), e.g. {mask: 0.8, random: 0.1, keep: 0.1}")
    return {key: float(masking[key]) for key in BERT_MASKING}


def mask_tokens(input_ids: torch.Tensor, maskable: torch.Tensor, mask_id: int, vocab_size: int,
                first_normal_id: int, probability: float = 0.15, generator: torch.Generator | None = None,
                masking: dict[str, float] = BERT_MASKING) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masked-LM corruption. Each maskable position (not special, not padding) is
    chosen with `probability`; a chosen token becomes [MASK] (masking["mask"], 80% in the paper),
    a random normal token (masking["random"], 10%) or stays itself (the rest, 10%). Returns the
    corrupted ids and labels (the original id at chosen positions, IGNORE_INDEX elsewhere, so the
    loss sees only chosen positions)."""
    def uniform() -> torch.Tensor:
        return torch.rand(input_ids.shape, generator=generator)

    chosen = (uniform() < probability) & maskable
    labels = input_ids.masked_fill(~chosen, IGNORE_INDEX)
    action = uniform()
    to_mask = chosen & (action < masking["mask"])
    to_random = chosen & (action >= masking["mask"]) & (action < masking["mask"] + masking["random"])
    random_ids = torch.randint(first_normal_id, vocab_size, input_ids.shape, generator=generator)
    corrupted = input_ids.masked_fill(to_mask, mask_id)
    corrupted = torch.where(to_random, random_ids, corrupted)
    return corrupted, labels


def pack_sentences(sentences: list[list[int]], max_tokens: int, sep_id: int) -> list[list[int]]:
    """Consecutive sentences joined by [SEP] into examples of at most max_tokens ids (RoBERTa's
    full-sentence inputs): a corpus of short sentences then spends its compute on tokens, not on
    padding. Each sentence must already fit max_tokens; none is split across two examples."""
    packed, current = [], []
    for ids in sentences:
        if current and len(current) + 1 + len(ids) > max_tokens:
            packed.append(current)
            current = []
        current = [*current, sep_id, *ids] if current else list(ids)
    if current:
        packed.append(current)
    return packed


def next_sentence_pairs(documents: list[list], rng: np.random.Generator) -> list[tuple[object, object, int]]:
    """(A, B, is_next) for every sentence that has a successor in its document: B is that
    successor with probability 1/2 (is_next=1), else a random sentence of another document
    (is_next=0). Sentences may be token-id lists or text."""
    if sum(len(d) > 0 for d in documents) < 2:
        raise DataError("next-sentence pairs need at least two non-empty documents")
    pairs = []
    for doc_index, sentences in enumerate(documents):
        for a, following in itertools.pairwise(sentences):
            if rng.random() < 0.5:
                pairs.append((a, following, 1))
                continue
            other = doc_index
            while other == doc_index or not documents[other]:
                other = int(rng.integers(len(documents)))
            pairs.append((a, documents[other][int(rng.integers(len(documents[other])))], 0))
    return pairs


class MaskingCollator:
    """Pads a batch of sentence pairs (or single sentences) and masks it; with a seed, the same masks
    every time (validation), otherwise fresh masks from the global RNG every batch (training)."""

    def __init__(self, specials: dict[str, int], vocab_size: int, probability: float = 0.15, seed: int | None = None,
                 masking: dict[str, float] = BERT_MASKING):
        self.specials, self.vocab_size, self.probability, self.seed = specials, vocab_size, probability, seed
        self.masking = check_masking(masking)
        self.first_normal_id = max(specials.values()) + 1  # specials come first in a trained WordPiece vocabulary

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        batch = pad_batch(items, self.specials["pad"])
        ids = batch["input_ids"]
        maskable = batch["attention_mask"] & (ids != self.specials["cls"]) & (ids != self.specials["sep"])
        generator = None
        if self.seed is not None:
            generator = torch.Generator().manual_seed(self.seed + sum(item["index"] for item in items))
        batch["input_ids"], batch["mlm_labels"] = mask_tokens(ids, maskable, self.specials["mask"], self.vocab_size,
                                                              self.first_normal_id, self.probability, generator,
                                                              self.masking)
        if "is_next" in items[0]:  # sentence pairs; single sentences (next_sentence=False) have no NSP label
            batch["is_next"] = torch.tensor([item["is_next"] for item in items])
        return batch


class BertTokenizerPreprocessor(TokenizerPreprocessor):
    """Base of the preprocessors with a BERT WordPiece tokenizer: `specials`, the ids of its
    [PAD] [UNK] [CLS] [SEP] [MASK] (a tokenizer without them is one clear error)."""

    def __post_init__(self):
        self.specials = special_ids(self.tokenizer)


@dataclass(eq=False)
class BertPreprocessor(BertTokenizerPreprocessor):
    """Sentence pairs and texts as `[CLS] A [SEP] (B [SEP])` WordPiece ids. State: tokenizer (its JSON), max_len."""

    tokenizer: Tokenizer
    max_len: int = 128

    def batch(self, texts: list[str]) -> dict:
        """Model inputs (input_ids, segment_ids, attention_mask) of raw texts, each `[CLS] text [SEP]`
        (cut to max_len); `[MASK]` in a text is the mask token."""
        encoded = [encode_pair(truncate(e.ids, self.max_len - 2), None, self.specials)
                   for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]
        return pad_batch([{"input_ids": ids, "segment_ids": segments} for ids, segments in encoded],
                         self.specials["pad"])


class BertPretrainingDataModule(L.LightningDataModule):
    """Sentence pairs from the prepared corpus, tokenised with the trained WordPiece tokenizer."""

    preprocessor: BertPreprocessor

    def __init__(self, prepared_dir: str, tokenizer_path: str, max_len: int = 128, mask_probability: float = 0.15,
                 batch_size: int = 32, eval_batch_size: int = 128, seed: int = 0, max_documents: int | None = None,
                 num_workers: int = 0, max_examples: int | None = None, next_sentence: bool = True,
                 masking: dict[str, float] | None = None, pack_sentences: bool = False):
        """max_examples: examples kept per split (None = all; debug=smoke). next_sentence: sentence pairs
        with NSP labels (the paper), or single sentences for the masked LM alone. masking: the shares of
        chosen tokens that become [MASK] / a random token / stay (BERT_MASKING by default).
        pack_sentences (with next_sentence=False): consecutive sentences share an example up to max_len."""
        super().__init__()
        self.masking = check_masking(masking or BERT_MASKING)
        self.next_sentence, self.pack_sentences = next_sentence, pack_sentences
        self.prepared_dir, self.max_len, self.mask_probability = Path(prepared_dir), max_len, mask_probability
        self.batch_size, self.eval_batch_size, self.seed = batch_size, eval_batch_size, seed
        self.max_documents, self.num_workers, self.max_examples = max_documents, num_workers, max_examples
        self.preprocessor = BertPreprocessor(load_tokenizer(tokenizer_path), max_len)
        self.tokenizer, self.specials = self.preprocessor.tokenizer, self.preprocessor.specials
        self.examples: dict[str, list[dict]] = {}

    def model_kwargs(self) -> dict:
        return {"vocab_size": self.tokenizer.get_vocab_size(), "pad_id": self.specials["pad"]}

    def _examples(self, split: str) -> list[dict]:
        documents = read_documents(self.prepared_dir, split)[: self.max_documents]
        flat = [s for d in documents for s in d]
        encoded = iter(e.ids for e in self.tokenizer.encode_batch(flat, add_special_tokens=False))
        tokenised = [[next(encoded) for _ in d] for d in documents]
        if not self.next_sentence:
            sentences = [truncate(ids, self.max_len - 2) for d in tokenised for ids in d if ids]
            if self.pack_sentences:
                sentences = pack_sentences(sentences, self.max_len - 2, self.specials["sep"])
            return [{"input_ids": encode_pair(ids, None, self.specials)[0], "segment_ids": [0] * (len(ids) + 2),
                     "index": index} for index, ids in enumerate(sentences)]
        rng = np.random.default_rng([self.seed, 0 if split == "train" else 1])
        examples = []
        for a, b, is_next in next_sentence_pairs(tokenised, rng):
            a, b = truncate_pair(a, b, self.max_len - 3)
            if a and b:
                ids, segments = encode_pair(a, b, self.specials)
                examples.append({"input_ids": ids, "segment_ids": segments, "is_next": is_next,
                                 "index": len(examples)})
        return examples

    def setup(self, stage: str | None = None) -> None:
        for split in ("train", "validation"):
            if split not in self.examples:
                self.examples[split] = self._examples(split)[: self.max_examples]

    def train_dataloader(self) -> DataLoader:
        collate = MaskingCollator(self.specials, self.tokenizer.get_vocab_size(), self.mask_probability,
                                  masking=self.masking)
        return DataLoader(self.examples["train"], self.batch_size, shuffle=True, collate_fn=collate,
                          num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        collate = MaskingCollator(self.specials, self.tokenizer.get_vocab_size(), self.mask_probability, seed=self.seed,
                                  masking=self.masking)
        return DataLoader(self.examples["validation"], self.eval_batch_size, collate_fn=collate,
                          num_workers=self.num_workers)
