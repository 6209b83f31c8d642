"""This project's word2vec against gensim's, on the same tokenised corpus and settings.

    python benchmarks/word2vec_vs_gensim.py --corpus FILE --out results.json [--repeat 3]

FILE is any UTF-8 text (documents separated by blank lines; `--corpus builtin` = gensim's
Lee corpus, one document per line). Both train dim 100, window 5, 5 negatives, sample 1e-3,
the same min_count and epochs, on 2 threads, alternately, `--repeat` times. Writes
words/second (effective words after min_count and subsampling, as gensim counts them; medians,
and the median of the per-repeat ratio ours/gensim),
WordSim-353 Spearman, analogy accuracy, their OOV rate, and agreement: the Spearman
correlation of cosine similarities over fixed pairs of the 1,000 most frequent words,
gensim seed 1 vs seed 2 (`gensim_seed_agreement`) and ours vs gensim seed 1
(`ours_gensim_agreement`).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from transformer_lab.utils.machine import machine

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))


def tokenised_corpus(spec: str) -> list[list[str]]:
    from transformer_lab.data.corpus import load_documents, split_sentences, word_tokens

    documents = load_documents("builtin") if spec == "builtin" else load_documents("local", [spec], "blank_line")
    return [t for doc in documents for s in split_sentences(doc) if len(t := word_tokens(s)) > 1]


def train_ours(sentences, args, seed: int):
    import lightning as L
    import numpy as np

    from transformer_lab.data.word2vec import (
        Word2VecExamples,
        Word2VecPreprocessor,
        build_vocabulary,
        encode_sentences,
        keep_probabilities,
    )
    from transformer_lab.models.word2vec import Word2VecConfig
    from transformer_lab.tasks.word2vec import Word2VecTask

    words, counts = build_vocabulary(sentences, args.min_count)
    examples = Word2VecExamples(encode_sentences(sentences, words), keep_probabilities(counts, args.sample),
                                args.window, args.batch_size, seed)
    config = Word2VecConfig(vocab_size=len(words), dim=100, architecture=args.architecture, negatives=5,
                            update=args.update, shared_negatives=args.shared_negatives)
    L.seed_everything(seed, verbose=False)
    task = Word2VecTask(config.to_dict(), Word2VecPreprocessor(words, counts.tolist()).to_state(),
                        update_size=args.update_size)
    counted = {"words": 0.0}

    class CountWords(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            counted["words"] += len(batch["centres"])  # one example per effective word

    trainer = L.Trainer(max_epochs=args.epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, callbacks=[CountWords()])
    from torch.utils.data import DataLoader

    start = time.perf_counter()
    trainer.fit(task, train_dataloaders=DataLoader(examples, batch_size=None))
    seconds = time.perf_counter() - start
    words, vectors = task.vectors()
    return words, np.asarray(vectors), counted["words"] / seconds


def train_gensim(sentences, args, seed: int):
    from gensim.models import Word2Vec

    model = Word2Vec(vector_size=100, window=args.window, min_count=args.min_count, sg=int(args.architecture == "skipgram"),
                     negative=5, hs=0, sample=args.sample, workers=2, seed=seed)
    model.build_vocab(sentences)
    start = time.perf_counter()
    effective, _ = model.train(sentences, total_examples=len(sentences), epochs=args.epochs)
    return model.wv, effective / (time.perf_counter() - start)


def agreement(a, b, words: list[str], pairs) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr([a.similarity(words[i], words[j]) for i, j in pairs],
                           [b.similarity(words[i], words[j]) for i, j in pairs]).statistic)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True, help="text file, or 'builtin' for gensim's Lee corpus")
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--min-count", type=int, default=5)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--sample", type=float, default=1e-3)
    parser.add_argument("--architecture", choices=["skipgram", "cbow"], default="skipgram")
    parser.add_argument("--batch-size", type=int, default=32768, help="this project's centre words per training step")
    parser.add_argument("--update-size", type=int, default=None,
                        help="this project's centre words per SGD update (default: the task's, 512 skip-gram, 2048 CBOW)")
    parser.add_argument("--update", choices=["batched", "per_word"], default=None,
                        help="this project's SGD update (model.update; default per_word for CBOW, batched for skip-gram)")
    parser.add_argument("--shared-negatives", type=int, default=None,
                        help="batched CBOW: examples sharing one draw of noise words (model.shared_negatives; default 16)")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from transformer_lab.data.word_vectors import intrinsic_scores, keyed_vectors
    from transformer_lab.errors import TransformerLabError
    from transformer_lab.utils.io import atomic_write_json

    logging.getLogger("gensim").setLevel(logging.WARNING)
    logging.getLogger("lightning").setLevel(logging.WARNING)
    torch.set_num_threads(2)
    try:
        sentences = tokenised_corpus(args.corpus)
    except TransformerLabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    ours_speed, gensim_speed, ours_vectors, gensim_vectors = [], [], None, None
    for repeat in range(args.repeat):  # alternate, so that machine noise hits both alike
        words, vectors, speed = train_ours(sentences, args, seed=1)
        ours_speed.append(speed)
        ours_vectors = keyed_vectors(words, vectors)
        gensim_vectors, speed = train_gensim(sentences, args, seed=1)
        gensim_speed.append(speed)
        print(f"repeat {repeat + 1}: ours {ours_speed[-1]:,.0f} words/s, gensim {gensim_speed[-1]:,.0f} words/s",
              flush=True)
    gensim_seed2, _ = train_gensim(sentences, args, seed=2)

    top = gensim_vectors.index_to_key[:1000]
    pairs = np.random.default_rng(0).choice(len(top), size=(5000, 2))
    pairs = [(i, j) for i, j in pairs if i != j]
    ours_scores, gensim_scores = intrinsic_scores(ours_vectors), intrinsic_scores(gensim_vectors)
    result = {
        "ours_words_per_s": round(statistics.median(ours_speed)),
        "gensim_words_per_s": round(statistics.median(gensim_speed)),
        # Each repeat runs both back to back, so the ratio within a repeat cancels machine load
        # that changes between repeats.
        "ours_to_gensim_speed": round(statistics.median(o / g for o, g in zip(ours_speed, gensim_speed)), 3),
        "ours_wordsim_spearman": round(ours_scores["wordsim_spearman"], 4),
        "gensim_wordsim_spearman": round(gensim_scores["wordsim_spearman"], 4),
        "ours_analogy_acc": round(ours_scores["analogy_acc"], 4),
        "gensim_analogy_acc": round(gensim_scores["analogy_acc"], 4),
        "oov_rate": round(gensim_scores["wordsim_oov"], 4),
        "analogy_oov_rate": round(gensim_scores["analogy_oov"], 4),
        "gensim_seed_agreement": round(agreement(gensim_vectors, gensim_seed2, top, pairs), 4),
        "ours_gensim_agreement": round(agreement(ours_vectors, gensim_vectors, top, pairs), 4),
        "settings": {**vars(args), "dim": 100, "negatives": 5, "threads": 2},
        "corpus_sentences": len(sentences),
        "corpus_words": sum(map(len, sentences)),
        "all_speeds": {"ours": [round(s) for s in ours_speed], "gensim": [round(s) for s in gensim_speed]},
        "machine": {**machine(), "cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
    }
    atomic_write_json(args.out, result)
    print({k: v for k, v in result.items() if not isinstance(v, dict)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
