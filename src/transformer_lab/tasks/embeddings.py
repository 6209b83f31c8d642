"""How a model's token embeddings start: `task.embeddings.init` = random (the model's own
initialisation), word2vec or glove (pre-trained vectors, the lecture's comparison), for every task
whose model has token embeddings (the ATIS encoder, the BERT and GPT families).

A task option rather than a model field: it changes where training starts, not the architecture,
so a checkpoint's model config stays the same either way. The rows are found by token string:
the model's `get_input_embeddings()` (as in Hugging Face models) and the preprocessor's `tokens`
(id -> token). Sub-word vocabularies match only the pieces that are whole words.
"""

from __future__ import annotations

from pathlib import Path

import torch

from transformer_lab.errors import TransformerLabError

INITS = ("random", "word2vec", "glove")
# Where each pre-trained init's vectors are exported (word2vec text format), and the stage that writes them.
EXPORTED = {"word2vec": ("artifacts/word2vec/eval/vectors.txt", "evaluate_word2vec"),
            "glove": ("artifacts/glove/eval/vectors.txt", "evaluate_glove")}


class TokenEmbeddings:
    """Mixed into a LightningModule that has `self.model.get_input_embeddings()`, `self.preprocessor.tokens`
    and an `embeddings` hyper-parameter ({init, vectors}); train() calls `initialise_embeddings` once,
    before the first step (not on a resume: the checkpoint's weights are the ones to continue)."""

    def initialise_embeddings(self, root_dir: str | Path) -> float | None:
        """Apply task.embeddings; returns the vocabulary coverage for word2vec or glove, None for random."""
        embeddings = dict(self.hparams.get("embeddings") or {})
        init = embeddings.get("init", "random")
        if init not in INITS:
            raise TransformerLabError(f"task.embeddings.init={init!r} is not one of {', '.join(INITS)}")
        if init == "random":
            return None
        vectors = embeddings.get("vectors")
        default, stage = EXPORTED[init]
        if not vectors:
            raise TransformerLabError(f"task.embeddings.init={init} needs task.embeddings.vectors=FILE "
                                      f"(word2vec text format; {stage} writes {default})")
        # The task configs name word2vec's file; the other init's default file is a mistake, not a choice.
        others = {path: name for name, (path, _) in EXPORTED.items() if name != init}
        if str(vectors) in others:
            raise TransformerLabError(f"task.embeddings.vectors={vectors} holds {others[str(vectors)]}'s vectors, "
                                      f"not {init}'s: set task.embeddings.vectors={default}")
        path = Path(root_dir, vectors)
        if not path.is_file():
            raise TransformerLabError(f"task.embeddings.vectors={vectors}: not found; `dvc repro {stage}` writes "
                                      f"{init}'s vectors to {default}")
        return load_word_vectors(self.model.get_input_embeddings(), self.preprocessor.tokens, path)


@torch.no_grad()
def load_word_vectors(embedding: torch.nn.Embedding, tokens: list[str], path: str | Path) -> float:
    """Initialise the rows of `embedding` whose token has a vector in `path` (word2vec text format:
    word2vec's or GloVe's); the others keep their random row. Returns the share of tokens found.

    The vectors are rescaled to the random initialisation's standard deviation, so that tokens
    and positions still start at comparable magnitudes."""
    from transformer_lab.data.word_vectors import load_word2vec_format

    words, vectors = load_word2vec_format(str(path))
    weight = embedding.weight
    if vectors.shape[1] != weight.shape[1]:
        raise TransformerLabError(f"{path}: vectors have {vectors.shape[1]} dimensions but model.d_model="
                                  f"{weight.shape[1]}; set model.d_model={vectors.shape[1]}")
    table = dict(zip(words, torch.from_numpy(vectors)))
    scale = weight.std() / torch.from_numpy(vectors).std()
    found = [(row, table[token]) for row, token in enumerate(tokens) if token in table]
    for row, vector in found:
        weight[row] = vector * scale
    return len(found) / len(tokens)
