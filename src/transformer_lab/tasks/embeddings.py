"""How a model's token embeddings start: `task.embeddings.init` = random (the model's own
initialisation) or word2vec (pre-trained vectors, the lecture's comparison), for every task whose
model has token embeddings (the ATIS encoder, the BERT and GPT families).

A task option rather than a model field: it changes where training starts, not the architecture,
so a checkpoint's model config stays the same either way. The rows are found by token string:
the model's `get_input_embeddings()` (as in Hugging Face models) and the preprocessor's `tokens`
(id -> token). Sub-word vocabularies match only the pieces that are whole words.
"""

from __future__ import annotations

from pathlib import Path

import torch

from transformer_lab.errors import TransformerLabError

INITS = ("random", "word2vec")


class TokenEmbeddings:
    """Mixed into a LightningModule that has `self.model.get_input_embeddings()`, `self.preprocessor.tokens`
    and an `embeddings` hyper-parameter ({init, vectors}); train() calls `initialise_embeddings` once,
    before the first step (not on a resume: the checkpoint's weights are the ones to continue)."""

    def initialise_embeddings(self, root_dir: str | Path) -> float | None:
        """Apply task.embeddings; returns the vocabulary coverage for word2vec, None for random."""
        embeddings = dict(self.hparams.get("embeddings") or {})
        init = embeddings.get("init", "random")
        if init not in INITS:
            raise TransformerLabError(f"task.embeddings.init={init!r} is not one of {', '.join(INITS)}")
        if init == "random":
            return None
        if not embeddings.get("vectors"):
            raise TransformerLabError("task.embeddings.init=word2vec needs task.embeddings.vectors=FILE "
                                      "(word2vec text format)")
        path = Path(root_dir, embeddings["vectors"])
        return load_word_vectors(self.model.get_input_embeddings(), self.preprocessor.tokens, path)


@torch.no_grad()
def load_word_vectors(embedding: torch.nn.Embedding, tokens: list[str], path: str | Path) -> float:
    """Initialise the rows of `embedding` whose token has a word2vec vector; the others keep their
    random row. Returns the share of tokens found.

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
