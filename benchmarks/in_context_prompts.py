"""In-context learning on a task only the prompt can teach (GPT-3's point, at CPU size).

Every sequence draws its own random mapping: `symbols_per_sequence` symbols out of `n_symbols`,
each given one of `n_labels` labels at random. The sequence shows K demonstrations of that
mapping, then a query symbol:

    s_1 l_1  s_2 l_2  ...  s_K l_K  q   ->  the label q has in this sequence

The mapping is new in every sequence, so no weight can store it: a model that answers above
chance has read it from the demonstrations (by copying the label that followed the query's
earlier occurrence: an induction-style head). With K = 0 nothing can be read (chance); as K grows
the query's symbol is more likely to have been shown, and the best possible accuracy is
1 - (1 - 1/n_labels) · (1 - 1/symbols_per_sequence)^K.

Tokens: symbols 0 .. n_symbols - 1, then the labels. Training predicts the label after every
symbol of a K_max-demonstration sequence (each position is a k-shot query for its k earlier
demonstrations); evaluation scores only the query's label, argmax over the label tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE_INDEX = -100


@dataclass
class MappingTask:
    n_symbols: int = 32
    symbols_per_sequence: int = 4
    n_labels: int = 2

    @property
    def vocab_size(self) -> int:
        return self.n_symbols + self.n_labels

    @property
    def chance(self) -> float:
        return 1 / self.n_labels

    def best_possible(self, shots: int) -> float:
        """Accuracy of a reader that knows a shown symbol's label and guesses an unseen one's."""
        unseen = (1 - 1 / self.symbols_per_sequence) ** shots
        return 1 - (1 - self.chance) * unseen

    def sample(self, n: int, shots: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """n sequences of `shots` demonstrations and a query: input_ids (n, 2 * shots + 1);
        labels (n, 2 * shots + 1): the label token after every symbol (IGNORE_INDEX elsewhere);
        answer (n,): the query's label token."""
        symbols = torch.stack([torch.randperm(self.n_symbols, generator=generator)[: self.symbols_per_sequence]
                               for _ in range(n)])                                     # (n, symbols_per_sequence)
        label_of = self.n_symbols + torch.randint(self.n_labels, symbols.shape, generator=generator)
        picks = torch.randint(self.symbols_per_sequence, (n, shots + 1), generator=generator)
        shown, their_labels = symbols.gather(1, picks), label_of.gather(1, picks)      # (n, shots + 1)
        input_ids = torch.full((n, 2 * shots + 1), 0)
        input_ids[:, 0::2], input_ids[:, 1::2] = shown, their_labels[:, :-1]
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        labels[:, 0::2] = their_labels
        return {"input_ids": input_ids, "labels": labels, "answer": their_labels[:, -1]}

    def predict(self, logits: torch.Tensor) -> torch.Tensor:
        """The label token with the highest logit at each query position (logits (n, vocab))."""
        return self.n_symbols + logits[:, self.n_symbols:].argmax(-1)


@torch.no_grad()
def accuracy_by_shots(model, task: MappingTask, shots: list[int], n: int, seed: int) -> dict[int, float]:
    """Query accuracy for each number of demonstrations, on mappings drawn with `seed` (fresh:
    training draws with other seeds). `model(input_ids).logits` is a causal LM's."""
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    scores = {}
    for k in shots:
        batch = task.sample(n, k, generator)
        logits = model(batch["input_ids"]).logits[:, -1]
        scores[k] = float((task.predict(logits) == batch["answer"]).float().mean())
    model.train(was_training)
    return scores
