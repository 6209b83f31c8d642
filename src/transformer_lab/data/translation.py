"""Parallel text for the encoder-decoder Transformer: sentence pairs, one shared sub-word
vocabulary for both languages, and batches of similar length.

Sources (`data.source`):
    builtin  a generated English -> German task, offline: "she buys three hundred forty-two
             red apples." -> "sie kauft dreihundertzweiundvierzig rote Äpfel." Subjects,
             verbs (conjugated in both languages), numbers 2..9,999 (German writes them as one
             word, units before tens: the model must reorder), adjectives and plural nouns. Small
             and synthetic: it shows the pipeline working, not translation quality.
    local    a directory of line-aligned files, `<split>.<src>` and `<split>.<tgt>` for the
             splits train, val and any test_* (Multi30k's layout: train.en / train.de, ...).
    hub      a Multi30k copy on the Hugging Face Hub (columns named by the languages).

`prepare` checks the pairs (same number of lines on both sides, no empty line, UTF-8), writes
every split as two line files, trains one BPE vocabulary on the training pairs of both
languages (`tokenizer.json`), and a summary. The datamodule reads that folder.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from torch.utils.data import DataLoader, Dataset, Sampler

from transformer_lab.data.bert import IGNORE_INDEX
from transformer_lab.data.checks import require_file
from transformer_lab.data.hub import load_hub_dataset
from transformer_lab.data.preprocessing import TokenizerPreprocessor
from transformer_lab.errors import DataError
from transformer_lab.utils.io import atomic_directory, decode_utf8

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"  # ids 0, 1, 2, 3
SPECIAL = [PAD, BOS, EOS, UNK]
TRAIN, VALIDATION = "train", "val"


# ---------------------------------------------------------------------------------------
# Reading and checking sentence pairs

def read_lines(path: Path) -> list[str]:
    """A text file's lines; a missing file or a byte that is not UTF-8 is one DataError naming it."""
    require_file(path, "a text file of sentences, one a line")
    text = decode_utf8(path, path.read_bytes())
    lines = text.split("\n")
    if lines and lines[-1] == "":  # the newline that ends the last line
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def read_pairs(directory: str | Path, split: str, source_lang: str, target_lang: str) -> list[tuple[str, str]]:
    """The split's (source, target) sentence pairs from `<split>.<source_lang>` and
    `<split>.<target_lang>`: line-aligned, both sides the same length, no empty line."""
    directory = Path(directory)
    source_path, target_path = directory / f"{split}.{source_lang}", directory / f"{split}.{target_lang}"
    sources, targets = read_lines(source_path), read_lines(target_path)
    if len(sources) != len(targets):
        raise DataError(f"{source_path} has {len(sources)} lines but {target_path} has {len(targets)}: "
                        "the two sides of a split are line-aligned")
    if not sources:
        raise DataError(f"{source_path}: no sentences")
    for path, lines in ((source_path, sources), (target_path, targets)):
        for number, line in enumerate(lines, 1):
            if not line.strip():
                raise DataError(f"{path}:{number}: empty line (every line is one sentence of a pair)")
    return [(" ".join(s.split()), " ".join(t.split())) for s, t in zip(sources, targets)]


def local_splits(directory: str | Path, source_lang: str) -> list[str]:
    """The splits a local directory holds: train, val and every test_*, by their source files."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"data.local_dir={directory}: no such directory")
    splits = sorted(p.name[:-len(source_lang) - 1] for p in directory.glob(f"*.{source_lang}"))
    missing = [split for split in (TRAIN, VALIDATION) if split not in splits]
    if missing:
        raise DataError(f"data.local_dir={directory}: no {missing[0]}.{source_lang} (the layout is "
                        f"<split>.<lang> for train, val and test_*)")
    return [TRAIN, VALIDATION, *[s for s in splits if s.startswith("test")]]


def hub_pairs(hub_id: str, source_lang: str, target_lang: str) -> dict[str, list[tuple[str, str]]]:
    dataset = load_hub_dataset(hub_id, local_hint="data.local_dir=DIR (e.g. ../shared/data/multi30k)")
    names = {"train": TRAIN, "validation": VALIDATION, "test": "test"}
    splits = {}
    for name, split in dataset.items():
        missing = [lang for lang in (source_lang, target_lang) if lang not in split.column_names]
        if missing:
            raise DataError(f"{hub_id} ({name}): no column {missing[0]!r}; it has {', '.join(split.column_names)}")
        splits[names.get(name, name)] = [(" ".join(s.split()), " ".join(t.split()))
                                         for s, t in zip(split[source_lang], split[target_lang])]
    return splits


# ---------------------------------------------------------------------------------------
# The built-in generated task

_EN_UNITS = "zero one two three four five six seven eight nine".split()
_EN_TEENS = "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_EN_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_DE_UNITS = ["", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun"]
_DE_TEENS = "zehn elf zwölf dreizehn vierzehn fünfzehn sechzehn siebzehn achtzehn neunzehn".split()
_DE_TENS = ["", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig", "neunzig"]
# English subject, German subject, and the verb's person: 0 = I, 1 = you, 2 = he/she, 3 = we/they
_SUBJECTS = [("I", "ich", 0), ("you", "du", 1), ("he", "er", 2), ("she", "sie", 2), ("we", "wir", 3),
             ("they", "sie", 3)]
_VERBS = [(("see", "sees"), ("sehe", "siehst", "sieht", "sehen")),
          (("buy", "buys"), ("kaufe", "kaufst", "kauft", "kaufen")),
          (("have", "has"), ("habe", "hast", "hat", "haben")),
          (("need", "needs"), ("brauche", "brauchst", "braucht", "brauchen")),
          (("paint", "paints"), ("male", "malst", "malt", "malen"))]
_ADJECTIVES = [("red", "rote"), ("green", "grüne"), ("small", "kleine"), ("big", "große"), ("old", "alte"),
               ("new", "neue"), ("blue", "blaue"), ("cheap", "billige")]
_NOUNS = [("apples", "Äpfel"), ("books", "Bücher"), ("houses", "Häuser"), ("cars", "Autos"), ("dogs", "Hunde"),
          ("cats", "Katzen"), ("chairs", "Stühle"), ("flowers", "Blumen"), ("birds", "Vögel"), ("boats", "Boote")]


def english_number(n: int) -> str:
    """1 <= n <= 9,999 in English words: 'three thousand four hundred twenty-one'."""
    words = []
    if n >= 1000:
        words += [_EN_UNITS[n // 1000], "thousand"]
    if n % 1000 >= 100:
        words += [_EN_UNITS[n % 1000 // 100], "hundred"]
    rest = n % 100
    if 10 <= rest < 20:
        words.append(_EN_TEENS[rest - 10])
    elif rest >= 20:
        words.append(_EN_TENS[rest // 10] + (f"-{_EN_UNITS[rest % 10]}" if rest % 10 else ""))
    elif rest:
        words.append(_EN_UNITS[rest])
    return " ".join(words)


def german_number(n: int) -> str:
    """1 <= n <= 9,999 as German writes it, one word: 'dreitausendvierhunderteinundzwanzig'."""
    word = ""
    if n >= 1000:
        word += ("ein" if n // 1000 == 1 else _DE_UNITS[n // 1000]) + "tausend"
    if n % 1000 >= 100:
        word += ("ein" if n % 1000 // 100 == 1 else _DE_UNITS[n % 1000 // 100]) + "hundert"
    rest = n % 100
    if 10 <= rest < 20:
        word += _DE_TEENS[rest - 10]
    elif rest >= 20:
        unit = rest % 10
        word += (("ein" if unit == 1 else _DE_UNITS[unit]) + "und" if unit else "") + _DE_TENS[rest // 10]
    elif rest:
        word += _DE_UNITS[rest]
    return word


def generated_pair(rng: random.Random) -> tuple[str, str]:
    english_subject, german_subject, person = rng.choice(_SUBJECTS)
    english_verbs, german_verbs = rng.choice(_VERBS)
    number = rng.choice([rng.randint(2, 99), rng.randint(100, 999), rng.randint(1000, 9999)])
    english_noun, german_noun = rng.choice(_NOUNS)
    english = [english_subject, english_verbs[1] if person == 2 else english_verbs[0], english_number(number)]
    german = [german_subject, german_verbs[person], german_number(number)]
    if rng.random() < 0.5:
        english_adjective, german_adjective = rng.choice(_ADJECTIVES)
        english.append(english_adjective)
        german.append(german_adjective)
    return " ".join([*english, english_noun]) + ".", " ".join([*german, german_noun]) + "."


def builtin_pairs(n_train: int, n_val: int, n_test: int, seed: int) -> dict[str, list[tuple[str, str]]]:
    """Distinct generated pairs, no sentence in two splits."""
    rng, seen, pairs = random.Random(seed), set(), []
    while len(pairs) < n_train + n_val + n_test:
        pair = generated_pair(rng)
        if pair[0] not in seen:
            seen.add(pair[0])
            pairs.append(pair)
    return {TRAIN: pairs[:n_train], VALIDATION: pairs[n_train:n_train + n_val], "test_builtin": pairs[n_train + n_val:]}


# ---------------------------------------------------------------------------------------
# The shared vocabulary

def train_translation_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """BPE over both languages. Metaspace marks word starts inside the tokens (SentencePiece's
    scheme), so that decoding gives back the text with its spaces: what sacreBLEU scores."""
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(texts, trainer=trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL))
    return tokenizer


def prepare(source: str, output_dir: str, source_lang: str = "en", target_lang: str = "de",
            local_dir: str | None = None, hub_id: str = "bentrevett/multi30k", vocab_size: int = 8000,
            builtin: dict | None = None) -> dict:
    """The `prepare_translation` stage: `<split>.<lang>` line files for every split, the shared
    BPE `tokenizer.json` (trained on the training pairs) and summary.json."""
    if source == "builtin":
        splits = builtin_pairs(**(builtin or {}))
    elif source == "local":
        if not local_dir:
            raise DataError("data.local_dir is required with data.source=local")
        splits = {split: read_pairs(local_dir, split, source_lang, target_lang)
                  for split in local_splits(local_dir, source_lang)}
    elif source == "hub":
        splits = hub_pairs(hub_id, source_lang, target_lang)
    else:
        raise DataError(f"data.source={source!r} is not one of builtin, local, hub")
    for split in (TRAIN, VALIDATION):
        if not splits.get(split):
            raise DataError(f"the {source} data has no {split} pairs")
    tokenizer = train_translation_tokenizer([text for pair in splits[TRAIN] for text in pair], vocab_size)
    summary = {"source": source, "source_lang": source_lang, "target_lang": target_lang,
               "vocab_size": tokenizer.get_vocab_size(), "splits": {}}
    with atomic_directory(output_dir) as tmp:
        for split, pairs in splits.items():
            for index, lang in ((0, source_lang), (1, target_lang)):
                (tmp / f"{split}.{lang}").write_text("".join(pair[index] + "\n" for pair in pairs), encoding="utf-8")
            lengths = [len(e.ids) for e in tokenizer.encode_batch([t for pair in pairs for t in pair])]
            summary["splits"][split] = {"pairs": len(pairs), "tokens": sum(lengths), "max_tokens": max(lengths)}
        tokenizer.save(str(tmp / "tokenizer.json"))
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary


# ---------------------------------------------------------------------------------------
# Encoding and batches

@dataclass(eq=False)
class TranslationPreprocessor(TokenizerPreprocessor):
    """Sentences <-> ids with the shared vocabulary. A source is its tokens and the end token; a
    target's decoder input is the start token and its tokens (shifted right), its labels the
    tokens and the end token. Both cut to max_len. State: tokenizer (its JSON), max_len, languages."""

    tokenizer: Tokenizer
    max_len: int = 128
    source_lang: str = "en"
    target_lang: str = "de"

    def __post_init__(self):
        ids = [self.tokenizer.token_to_id(token) for token in SPECIAL]
        if None in ids:
            raise DataError(f"the tokenizer lacks {SPECIAL[ids.index(None)]} (train it with prepare_translation)")
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = ids

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Each sentence's tokens and the end token, cut to max_len (a target's to max_len - 1
        tokens and the end token, so that the start token in front of it still fits)."""
        return [e.ids[:self.max_len - 1] + [self.eos_id] for e in self.tokenizer.encode_batch(texts)]

    def decode(self, ids: list[int]) -> str:
        """Ids up to the first end token as text (special tokens dropped)."""
        if self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class PairDataset(Dataset):
    def __init__(self, pairs: list[tuple[str, str]], preprocessor: TranslationPreprocessor):
        self.pairs = pairs
        self.sources = preprocessor.encode([s for s, _ in pairs])
        self.targets = preprocessor.encode([t for _, t in pairs])

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict:
        return {"source": self.sources[index], "target": self.targets[index], "reference": self.pairs[index][1]}


class LengthBucketSampler(Sampler[list[int]]):
    """Batches of sentences of similar length (less padding, the paper's section 5.1): shuffle,
    sort each stretch of 50 batches by length, cut into batches, shuffle the batches. Seeded by
    seed and epoch, so that a resumed run draws the batches an uninterrupted one would. epoch:
    a number, or a function giving the epoch about to start (the trainer's current_epoch)."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int, epoch: int | Callable[[], int] = 0,
                 pool: int = 50):
        self.lengths, self.batch_size, self.pool, self.seed, self.epoch = lengths, batch_size, pool, seed, epoch

    def __iter__(self):
        epoch = self.epoch() if callable(self.epoch) else self.epoch
        generator = random.Random(self.seed * 100_003 + epoch)
        order = list(range(len(self.lengths)))
        generator.shuffle(order)
        stretch = self.batch_size * self.pool
        batches = []
        for start in range(0, len(order), stretch):
            chunk = sorted(order[start:start + stretch], key=lambda i: self.lengths[i])
            batches += [chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        generator.shuffle(batches)
        return iter(batches)

    def __len__(self) -> int:
        return sum(-(-min(self.batch_size * self.pool, len(self.lengths) - start) // self.batch_size)
                   for start in range(0, len(self.lengths), self.batch_size * self.pool))


def pad_ids(rows: list[list[int]], value: int) -> torch.Tensor:
    """Id lists as one (rows, longest) tensor, filled after each row's end with `value`."""
    padded = torch.full((len(rows), max(len(row) for row in rows)), value, dtype=torch.long)
    for index, row in enumerate(rows):
        padded[index, :len(row)] = torch.tensor(row)
    return padded


def length_sorted_batches(encoded: list[list[int]], batch_size: int, pad_id: int):
    """(row indices, padded source ids) of batches of similar length, shortest first: what
    translating a list of sentences decodes in (less padding, fewer steps per batch)."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        yield rows, pad_ids([encoded[i] for i in rows], pad_id)


def collate(items: list[dict], pad_id: int, bos_id: int) -> dict:
    """Padded source ids, decoder inputs (start token + target, shifted right), labels (target,
    padding = IGNORE_INDEX) and the reference texts (for BLEU)."""
    targets = [item["target"] for item in items]
    return {"input_ids": pad_ids([item["source"] for item in items], pad_id),
            "decoder_input_ids": pad_ids([[bos_id, *target[:-1]] for target in targets], pad_id),
            "labels": pad_ids(targets, IGNORE_INDEX), "references": [item["reference"] for item in items]}


class TranslationDataModule(L.LightningDataModule):
    preprocessor: TranslationPreprocessor

    def __init__(self, prepared_dir: str, source_lang: str = "en", target_lang: str = "de", max_len: int = 128,
                 batch_size: int = 64, eval_batch_size: int = 128, seed: int = 0, num_workers: int = 0,
                 max_examples: int | None = None):
        """prepared_dir: what `prepare_translation` writes. max_len: longest source or target in
        tokens (longer ones are cut). max_examples: cap every split (debug=smoke)."""
        super().__init__()
        self.prepared_dir = Path(prepared_dir)
        tokenizer_path = self.prepared_dir / "tokenizer.json"
        if not tokenizer_path.is_file():
            raise DataError(f"{tokenizer_path}: not found; run `dvc repro prepare_translation`")
        self.preprocessor = TranslationPreprocessor(Tokenizer.from_file(str(tokenizer_path)), max_len,
                                                    source_lang, target_lang)
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.seed, self.num_workers, self.max_examples = seed, num_workers, max_examples
        self.train_set: PairDataset | None = None
        self.val_set: PairDataset | None = None

    def model_kwargs(self) -> dict:
        p = self.preprocessor
        return {"vocab_size": p.tokenizer.get_vocab_size(), "pad_id": p.pad_id, "bos_id": p.bos_id,
                "eos_id": p.eos_id, "max_len": p.max_len}

    def pairs(self, split: str) -> list[tuple[str, str]]:
        pairs = read_pairs(self.prepared_dir, split, self.preprocessor.source_lang, self.preprocessor.target_lang)
        return pairs[:self.max_examples] if self.max_examples else pairs

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set = PairDataset(self.pairs(TRAIN), self.preprocessor)
            self.val_set = PairDataset(self.pairs(VALIDATION), self.preprocessor)

    def _collate(self, items: list[dict]) -> dict:
        return collate(items, self.preprocessor.pad_id, self.preprocessor.bos_id)

    def train_dataloader(self) -> DataLoader:
        lengths = [max(len(s), len(t)) for s, t in zip(self.train_set.sources, self.train_set.targets)]
        # the epoch read when each epoch starts: Lightning builds this loader once
        sampler = LengthBucketSampler(lengths, self.batch_size, self.seed,
                                      epoch=lambda: self.trainer.current_epoch if self.trainer else 0)
        return DataLoader(self.train_set, batch_sampler=sampler, collate_fn=self._collate,
                          num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, self.eval_batch_size, collate_fn=self._collate, num_workers=self.num_workers)
