"""The slot tagger's options: a linear-chain CRF (exact against enumerating every tag sequence;
Viterbi follows the learnt transitions where per-word argmax would not), character features
(a word the vocabulary lacks is spelt out, not one shared [UNK] vector) and frozen ELMo
features (the biLM's weights never move, the task's layer mix does; the tagger's checkpoint
alone restores it)."""

import itertools

import pytest
import torch

from transformer_lab.models.crf import LinearChainCRF


def enumerated_scores(crf: LinearChainCRF, emissions: torch.Tensor, length: int) -> dict[tuple, float]:
    """score(y) of every tag sequence y of one row, by the formula."""
    scores = {}
    for tags in itertools.product(range(emissions.shape[-1]), repeat=length):
        score = crf.start_transitions[tags[0]] + crf.end_transitions[tags[-1]]
        score = score + sum(emissions[t, tag] for t, tag in enumerate(tags))
        score = score + sum(crf.transitions[a, b] for a, b in zip(tags, tags[1:]))
        scores[tags] = float(score)
    return scores


def test_forward_algorithm_and_viterbi_match_enumeration_with_padding():
    torch.manual_seed(0)
    crf = LinearChainCRF(3)
    with torch.no_grad():
        for parameter in crf.parameters():
            parameter.normal_()
    emissions = torch.randn(3, 4, 3)
    lengths = torch.tensor([4, 2, 1])
    mask = torch.arange(4) < lengths[:, None]
    best = crf.decode(emissions, mask)
    tags = torch.randint(0, 3, (3, 4))
    log_likelihood = crf.log_likelihood(emissions, tags, mask)
    for row, length in enumerate(lengths.tolist()):
        scores = enumerated_scores(crf, emissions[row], length)
        log_z = torch.logsumexp(torch.tensor(list(scores.values())), 0)
        assert float(crf.log_partition(emissions, mask)[row]) == pytest.approx(float(log_z), abs=1e-5)
        gold = tuple(tags[row, :length].tolist())
        assert float(log_likelihood[row]) == pytest.approx(scores[gold] - float(log_z), abs=1e-5)
        assert tuple(best[row, :length].tolist()) == max(scores, key=scores.get)
        assert best[row, length:].eq(0).all()  # padding


def test_viterbi_follows_the_transitions_where_per_word_argmax_does_not():
    o, b, i = 0, 1, 2  # I may follow B or I, never O
    crf = LinearChainCRF(3)
    with torch.no_grad():
        crf.transitions[o, i] = -100.0
        crf.start_transitions[i] = -100.0
    # word 2 slightly prefers I, but word 1 is surely O: I cannot follow
    emissions = torch.tensor([[[5.0, 0.0, 0.0], [0.0, 0.9, 1.0]]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    assert emissions.argmax(-1).tolist() == [[o, i]]
    assert crf.decode(emissions, mask).tolist() == [[o, b]]


def atis_task(task_options: dict | None = None, **options):
    from transformer_lab.data.atis import AtisPreprocessor, collate
    from transformer_lab.tasks.joint_intent_slot import JointIntentSlotTask

    vocab = ["[PAD]", "[UNK]", "[CLS]", "flights", "to", "boston", "denver"]
    preprocessor = AtisPreprocessor(vocab, ["UNK", "flight"], ["UNK", "O", "B-city", "I-city"])
    torch.manual_seed(0)
    task = JointIntentSlotTask(dict(vocab_size=len(vocab), max_len=16, d_model=16, n_heads=2, n_layers=1,
                                    n_intents=2, n_slots=4, dropout=0.0, **options), preprocessor.to_state(),
                               **(task_options or {}))
    examples = [{"words": ["flights", "to", "boston"], "slots": ["O", "O", "B-city"], "intent": "flight"},
                {"words": ["flights", "to", "new", "york"], "slots": ["O", "O", "B-city", "I-city"], "intent": "flight"}]
    return task, collate([preprocessor.encode(e) for e in examples])


def test_unseen_words_are_told_apart_by_their_spelling_only_with_char_features():
    for char_features in (False, True):
        task, _ = atis_task(char_features=char_features)
        batch = task.preprocessor.batch([["flights", "to", "oslo"], ["flights", "to", "rome"]])
        assert batch["input_ids"][0, 3] == batch["input_ids"][1, 3] == task.preprocessor.unk_id
        with torch.no_grad():
            states = task.model(**task.model_inputs(batch)).hidden_states
        assert torch.allclose(states[0, 3], states[1, 3]) is not char_features


@pytest.mark.parametrize("options", [{"crf": True}, {"char_features": True, "char_combine": "concat", "crf": True}])
def test_a_crf_tagger_trains_and_predicts_whole_tag_sequences(options):
    task, batch = atis_task(**options)
    assert batch["characters"].shape == (2, 5, task.preprocessor.max_word_chars)
    _, slot_loss, _, _ = task._losses(batch)
    slot_loss.backward()
    assert slot_loss > 0 and task.model.crf.transitions.grad.abs().sum() > 0
    if options.get("char_features"):
        assert task.model.encoder.char_encoder.projection.weight.grad.abs().sum() > 0
    predictions = task.predict([["flights", "to", "boston"], ["to", "denver"]])
    assert [len(p["slots"]) for p in predictions] == [3, 2]


def test_a_char_model_without_characters_is_one_clear_error():
    task, batch = atis_task(char_features=True)
    with pytest.raises(ValueError, match="char_features=true: the inputs need `characters`"):
        task.model(batch["input_ids"], batch["attention_mask"])


def test_elmo_features_stay_frozen_and_the_tagger_restores_from_its_own_checkpoint(tmp_path):
    from test_elmo import save_tiny_bilm
    from test_pipelines import save_checkpoint

    from transformer_lab.tasks.checkpoints import load_task
    from transformer_lab.tasks.joint_intent_slot import JointIntentSlotTask

    torch.manual_seed(1)
    elmo_checkpoint = tmp_path / "elmo.ckpt"
    bilm = save_tiny_bilm(elmo_checkpoint, ["<S>", "</S>", "<UNK>", "flights", "to", "boston"])
    task, batch = atis_task({"elmo": str(elmo_checkpoint)})
    elmo = task.model.encoder.elmo
    assert all(torch.equal(p, bilm.model.state_dict()[n]) for n, p in elmo.state_dict().items())
    task.train()
    assert not elmo.training  # the frozen biLM runs without dropout
    intent_loss, slot_loss, _, _ = task._losses(batch)
    (intent_loss + slot_loss).backward()
    assert all(p.grad is None for p in elmo.parameters())
    assert task.model.encoder.elmo_mix.scalar_parameters.grad.abs().sum() > 0
    assert all(not p.requires_grad for p in elmo.parameters())

    tagger_checkpoint = tmp_path / "tagger.ckpt"
    save_checkpoint(task, tagger_checkpoint)
    elmo_checkpoint.unlink()  # the tagger's checkpoint alone must do
    restored = load_task(tagger_checkpoint, JointIntentSlotTask, "train_atis")
    utterances = [["flights", "to", "boston"], ["to", "oslo"]]
    assert restored.predict(utterances) == task.eval().predict(utterances)
