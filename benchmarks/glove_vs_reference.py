"""This project's GloVe against mittens' (PyPI `mittens`, its NumPy GloVe), on one co-occurrence matrix.

    python benchmarks/glove_vs_reference.py --corpus FILE --out results.json [--vocab-size 5000] [--epochs 50]

FILE is any UTF-8 text (documents separated by blank lines, as WikiText-2's train.txt; `--corpus
builtin` = gensim's Lee corpus). The matrix X is counted once, as the pipeline counts it
(data/glove.py: window 10 each side, a pair d words apart adding 1/d, windows inside sentences),
over the `--vocab-size` most frequent words seen `--min-count` times: mittens takes X dense (V x V).
On that one X:

- ours, full batch: one AdaGrad step per epoch over every non-zero entry, the optimisation mittens
  runs (its GloVe takes one step per iteration on the whole matrix);
- mittens.GloVe: the same dim, x_max, alpha, learning rate, AdaGrad start (mittens' 0.1), epochs
  and the very same initial tables (mittens' test_mode `fixed_initialization`);
- ours in mini-batches of `--batch-size` shuffled non-zero entries, a step each: the paper's
  stochastic AdaGrad and the pipeline's way, for `--minibatch-epochs` (a step per batch: far fewer);
- gensim's Word2Vec on the same sentences, its vocabulary capped alike (skip-gram, dim 100,
  window 5, 5 negatives, sample 1e-3, 5 epochs, 2 threads: benchmarks/word2vec_vs_gensim.py's).

Loss: mittens' number (its `errors`), 0.5 x sum over X_ij > 0 of f(X_ij) (w_i.w~_j + b_i + b~_j -
log X_ij)^2, each epoch's as it stood before that epoch's step(s); ours is put on the same
definition (the paper's J is twice it). `loss_ratio` = ours / mittens per epoch. Seconds: training
alone (the matrix counted once, outside both; ours inside a Lightning Trainer). Vectors: w + w~ for
both GloVes, scored on WordSim-353 (Spearman, gensim's evaluator; `*_wordsim_oov` pairs skipped).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
from pathlib import Path

from word2vec_vs_gensim import tokenised_corpus

from transformer_lab.utils.machine import machine

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))
LOSS_DEFINITION = ("0.5 * sum over non-zero X_ij of f(X_ij) * (w_i.w~_j + b_i + b~_j - log X_ij)^2, an epoch's as it "
                   "stood before each of its steps: mittens' reported error; the paper's J (eq. 8) is twice this")


def train_ours(rows, cols, counts, words, counts_of_words, args, batch_size: int, epochs: int, seed: int):
    """Our task in a Lightning Trainer; returns (per-epoch loss on mittens' definition, seconds, the
    initial tables, the final vectors w + w~)."""
    import lightning as L
    import numpy as np
    from torch.utils.data import DataLoader

    from transformer_lab.data.glove import CooccurrenceEntries
    from transformer_lab.data.word2vec import Word2VecPreprocessor
    from transformer_lab.models.glove import GloVeConfig
    from transformer_lab.tasks.glove import GloVeTask

    L.seed_everything(seed, verbose=False)
    config = GloVeConfig(vocab_size=len(words), dim=args.dim, x_max=args.x_max, alpha=args.alpha)
    task = GloVeTask(config.to_dict(), Word2VecPreprocessor(words, counts_of_words.tolist()).to_state(), lr=args.lr,
                     initial_accumulator=args.initial_accumulator)
    initial = [table.detach().numpy().astype(np.float64) for table in task.model.tables()]
    losses: list[float] = []

    class EpochLoss(L.Callback):
        def on_train_epoch_start(self, trainer, module):
            losses.append(0.0)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            losses[-1] += 0.5 * float(outputs["entry_losses"].double().sum())

    trainer = L.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, callbacks=[EpochLoss()])
    entries = CooccurrenceEntries(rows, cols, counts, batch_size, seed)
    start = time.perf_counter()
    trainer.fit(task, train_dataloaders=DataLoader(entries, batch_size=None))
    seconds = time.perf_counter() - start
    return losses, seconds, initial, task.vectors()[1]


def train_mittens(dense, initial, args, epochs: int):
    """mittens' NumPy GloVe from our initial tables; returns (its per-epoch errors, seconds, vectors)."""
    from mittens.np_mittens import GloVe

    model = GloVe(n=args.dim, xmax=args.x_max, alpha=args.alpha, max_iter=epochs, learning_rate=args.lr,
                  display_progress=0, test_mode=True)  # test_mode: the only way it takes given initial tables
    w, w_tilde, b, b_tilde = (table.copy() for table in initial)  # biases (V, 1): mittens' own shape
    start = time.perf_counter()
    vectors = model.fit(dense, fixed_initialization={"W": w, "C": w_tilde, "bw": b, "bc": b_tilde})
    return [float(e) for e in model.errors], time.perf_counter() - start, vectors


def train_word2vec(sentences, args):
    from gensim.models import Word2Vec

    model = Word2Vec(vector_size=100, window=5, min_count=args.min_count, max_final_vocab=args.vocab_size, sg=1,
                     negative=5, hs=0, sample=1e-3, workers=2, seed=1)
    model.build_vocab(sentences)
    start = time.perf_counter()
    model.train(sentences, total_examples=len(sentences), epochs=5)
    return model.wv, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True, help="text file, or 'builtin' for gensim's Lee corpus")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--vocab-size", type=int, default=5000,
                        help="the most frequent words kept (mittens holds X dense: V x V float64)")
    parser.add_argument("--min-count", type=int, default=5)
    parser.add_argument("--window", type=int, default=10, help="co-occurrence window, each side")
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--x-max", type=float, default=100.0)
    parser.add_argument("--alpha", type=float, default=0.75)
    parser.add_argument("--lr", type=float, default=0.05, help="AdaGrad's initial rate (the paper's and mittens' 0.05)")
    parser.add_argument("--initial-accumulator", type=float, default=0.1,
                        help="where AdaGrad's sums of squared gradients start (mittens' fixed 0.1)")
    parser.add_argument("--epochs", type=int, default=50, help="full-batch epochs, ours and mittens'")
    parser.add_argument("--batch-size", type=int, default=16384,
                        help="non-zero entries per step of ours in mini-batches (the pipeline's default)")
    parser.add_argument("--minibatch-epochs", type=int, default=10,
                        help="epochs of ours in mini-batches (a step per batch: it needs far fewer epochs)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-word2vec", action="store_true", help="leave gensim's Word2Vec out (its figures null)")
    args = parser.parse_args(argv)
    minibatch_epochs = args.minibatch_epochs

    import numpy as np
    import scipy.sparse
    import torch

    from transformer_lab.data.glove import cooccurrences, vocabulary
    from transformer_lab.data.word2vec import encode_sentences
    from transformer_lab.data.word_vectors import intrinsic_scores, keyed_vectors
    from transformer_lab.errors import TransformerLabError
    from transformer_lab.utils.io import atomic_write_json

    logging.getLogger("gensim").setLevel(logging.WARNING)
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    torch.set_num_threads(2)
    started = time.perf_counter()
    try:
        sentences = tokenised_corpus(args.corpus)
        words, word_counts = vocabulary(sentences, args.min_count, args.vocab_size)
        start = time.perf_counter()
        rows, cols, counts = cooccurrences(encode_sentences(sentences, words), len(words), args.window)
        count_seconds = time.perf_counter() - start
    except TransformerLabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    dense = scipy.sparse.coo_matrix((counts, (rows, cols)), shape=(len(words),) * 2).toarray()
    print(f"{len(words)} words, {len(rows):,} non-zero co-occurrences, counted in {count_seconds:.1f} s", flush=True)

    ours_loss, ours_seconds, initial, ours_vectors = train_ours(rows, cols, counts, words, word_counts, args,
                                                                len(rows), args.epochs, args.seed)
    print(f"ours, full batch: {ours_seconds:.1f} s, loss {ours_loss[0]:.1f} -> {ours_loss[-1]:.1f}", flush=True)
    mittens_loss, mittens_seconds, mittens_vectors = train_mittens(dense, initial, args, args.epochs)
    print(f"mittens: {mittens_seconds:.1f} s, loss {mittens_loss[0]:.1f} -> {mittens_loss[-1]:.1f}", flush=True)
    del dense
    minibatch_loss, minibatch_seconds, _, minibatch_vectors = train_ours(rows, cols, counts, words, word_counts, args,
                                                                         args.batch_size, minibatch_epochs, args.seed)
    print(f"ours, mini-batches: {minibatch_seconds:.1f} s, loss {minibatch_loss[0]:.1f} -> {minibatch_loss[-1]:.1f}",
          flush=True)
    word2vec_scores, word2vec_seconds, word2vec_vocab = {}, None, None
    if not args.skip_word2vec:
        word2vec, word2vec_seconds = train_word2vec(sentences, args)
        word2vec_scores, word2vec_vocab = intrinsic_scores(word2vec), len(word2vec.index_to_key)

    scores = {name: intrinsic_scores(keyed_vectors(words, np.asarray(vectors, dtype=np.float32)))
              for name, vectors in (("ours", ours_vectors), ("mittens", mittens_vectors),
                                    ("ours_minibatch", minibatch_vectors))}
    ratios = [o / m for o, m in zip(ours_loss, mittens_loss)]
    rounded = lambda value, digits=4: None if value is None else round(value, digits)
    result = {
        "ours_loss": [round(v, 3) for v in ours_loss],
        "mittens_loss": [round(v, 3) for v in mittens_loss],
        "loss_ratio": [round(r, 6) for r in ratios],
        "max_loss_deviation": round(max(abs(r - 1) for r in ratios), 6),  # the target: under 0.01
        "ours_seconds": round(ours_seconds, 2),
        "mittens_seconds": round(mittens_seconds, 2),
        "ours_to_mittens_speed": round(mittens_seconds / ours_seconds, 3),  # the target: at least 1
        "ours_wordsim_spearman": rounded(scores["ours"]["wordsim_spearman"]),
        "mittens_wordsim_spearman": rounded(scores["mittens"]["wordsim_spearman"]),
        "word2vec_wordsim_spearman": rounded(word2vec_scores.get("wordsim_spearman")),
        "ours_minibatch_wordsim_spearman": rounded(scores["ours_minibatch"]["wordsim_spearman"]),
        "ours_minibatch_loss": [round(v, 3) for v in minibatch_loss],
        "ours_minibatch_seconds": round(minibatch_seconds, 2),
        "glove_wordsim_oov": rounded(scores["ours"]["wordsim_oov"]),
        "word2vec_wordsim_oov": rounded(word2vec_scores.get("wordsim_oov")),
        "word2vec_seconds": rounded(word2vec_seconds, 2),
        "word2vec_vocab_size": word2vec_vocab,
        "loss_definition": LOSS_DEFINITION,
        "vocab_size": len(words),
        "nonzero_entries": len(rows),
        "count_seconds": round(count_seconds, 2),
        "corpus_sentences": len(sentences),
        "corpus_words": sum(map(len, sentences)),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "settings": {**vars(args), "minibatch_epochs": minibatch_epochs, "full_batch": len(rows),
                     "init": "ours (uniform +-0.5/dim, GloVe's C code), handed to mittens as fixed_initialization",
                     "word2vec": "gensim skip-gram, dim 100, window 5, 5 negatives, sample 1e-3, 5 epochs, 2 workers"},
        "machine": {**machine(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
                    "torch": torch.__version__},
    }
    atomic_write_json(args.out, result)
    print({k: v for k, v in result.items() if not isinstance(v, (dict, list))})
    return 0


if __name__ == "__main__":
    sys.exit(main())
