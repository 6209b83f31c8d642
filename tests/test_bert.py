import lightning as L
import numpy as np
import pytest
import torch

from transformer_lab.data.bert import (
    IGNORE_INDEX,
    BertPretrainingDataModule,
    encode_pair,
    mask_tokens,
    next_sentence_pairs,
    truncate,
    truncate_pair,
)
from transformer_lab.data.corpus import prepare
from transformer_lab.data.tokenizers import prepare_tokenizers
from transformer_lab.errors import DataError, TransformerLabError
from transformer_lab.models.bert import (
    SIZES,
    BertConfig,
    BertForPreTraining,
    BertModel,
    config_from_hf,
    from_hf_state_dict,
    to_hf_state_dict,
)
from transformer_lab.models.interop import WeightsUnavailable
from transformer_lab.tasks.bert_pretraining import BertPretrainingTask, load_pretrained_bert

SPECIALS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


@pytest.fixture(scope="module")
def corpus_and_tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("bert")
    prepare("builtin", str(root / "corpus"))
    prepare_tokenizers(str(root / "corpus"), str(root / "tokenizers"),
                       {"wordpiece": {"kind": "wordpiece", "vocab_size": 2000, "lowercase": True}})
    return root / "corpus", root / "tokenizers" / "wordpiece" / "tokenizer.json"


# ------------------------------------------------------------------ model and Hugging Face parity
def hf_pair(seed: int = 0, **hf_options):
    from transformers import BertConfig as HFBertConfig
    from transformers import BertForPreTraining as HFBertForPreTraining

    torch.manual_seed(seed)
    hf_config = HFBertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=64, max_position_embeddings=40, **hf_options)
    reference = HFBertForPreTraining(hf_config).eval()
    ours = BertForPreTraining(config_from_hf(hf_config)).eval()
    ours.load_state_dict(from_hf_state_dict(reference.state_dict()), strict=True)
    return reference, ours


def test_converted_transformers_bert_gives_the_same_outputs():
    reference, ours = hf_pair()
    ids = torch.randint(5, 120, (3, 21))
    segments = (torch.arange(21) >= 11).long().expand(3, -1)
    mask = torch.ones(3, 21, dtype=torch.long)
    mask[1, 15:] = 0  # a padded row
    with torch.no_grad():
        theirs = reference(input_ids=ids, token_type_ids=segments, attention_mask=mask, output_hidden_states=True)
        out = ours(ids, segments, mask.bool())
    torch.testing.assert_close(out.hidden_states, theirs.hidden_states[-1], atol=1e-5, rtol=0)
    torch.testing.assert_close(out.logits, theirs.prediction_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.nsp_logits, theirs.seq_relationship_logits, atol=1e-5, rtol=0)
    # MLM logits at chosen positions only are the same numbers
    chosen = torch.rand(3, 21) < 0.3
    with torch.no_grad():
        at_positions = ours(ids, segments, mask.bool(), mlm_positions=chosen).logits
    torch.testing.assert_close(at_positions, theirs.prediction_logits[chosen], atol=1e-5, rtol=0)


def test_padded_positions_lists_each_rows_chosen_positions_in_order():
    from transformer_lab.models.bert import padded_positions

    chosen = torch.tensor([[False, True, False, True, True], [False, False, False, False, False],
                           [True, False, False, False, True]])
    order, real = padded_positions(chosen)
    assert order.shape == (3, 3)
    assert order[0].tolist() == [1, 3, 4] and order[2, :2].tolist() == [0, 4]
    assert real.tolist() == [[True, True, True], [False, False, False], [True, True, False]]
    torch.testing.assert_close(order[real], chosen.nonzero()[:, 1])  # a boolean index's order
    assert padded_positions(torch.zeros(2, 4, dtype=torch.bool))[0].shape == (2, 0)


def test_last_layer_at_the_chosen_positions_gives_the_same_loss_and_gradients():
    """With mlm_positions the last layer computes only those rows and [CLS]: the same logits,
    NSP logits, loss and gradient of every weight as the whole last layer."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(vocab_size=120, size="tiny", d_model=32, n_heads=4, n_layers=3,
                                          dropout=0.0, max_len=40)).train()
    ids = torch.randint(5, 120, (4, 17))
    mask = torch.ones(4, 17, dtype=torch.bool)
    mask[1, 11:] = False
    chosen = (torch.rand(4, 17) < 0.2) & mask
    chosen[0, 0] = True  # [CLS] itself chosen: computed twice, alike
    chosen[2] = False  # a row with nothing to predict
    targets = torch.randint(5, 120, (int(chosen.sum()),))
    is_next = torch.tensor([0, 1, 1, 0])

    hidden, pooled, _ = model.bert(ids, None, mask)
    full_logits, full_nsp = model.mlm(hidden[chosen]), model.nsp(pooled)
    loss = F.cross_entropy(full_logits, targets) + F.cross_entropy(full_nsp, is_next)
    full_grads = torch.autograd.grad(loss, list(model.parameters()))

    out = model(ids, None, mask, mlm_positions=chosen)
    torch.testing.assert_close(out.logits, full_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(out.nsp_logits, full_nsp, rtol=0, atol=1e-5)
    torch.testing.assert_close(out.hidden_states, hidden[chosen], rtol=0, atol=1e-5)
    loss = F.cross_entropy(out.logits, targets) + F.cross_entropy(out.nsp_logits, is_next)
    for (name, _), expected, got in zip(model.named_parameters(), full_grads,
                                        torch.autograd.grad(loss, list(model.parameters()))):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6, msg=name)

def test_attention_weights_match_transformers_per_layer():
    reference, ours = hf_pair(attn_implementation="eager")  # transformers' fused kernel returns no weights
    ids = torch.randint(5, 120, (2, 13))
    mask = torch.ones(2, 13, dtype=torch.long)
    mask[1, 9:] = 0
    with torch.no_grad():
        theirs = reference(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        out = ours(ids, None, mask.bool(), return_weights=True)
    assert len(out.attentions) == len(theirs) == 2
    for layer, (weights, expected) in enumerate(zip(out.attentions, theirs)):
        torch.testing.assert_close(weights, expected, atol=1e-6, rtol=0, msg=f"layer {layer}")
    assert ours(ids, None, mask.bool()).attentions is None  # only when asked: the fused kernel otherwise


def test_conversion_back_to_transformers_names_round_trips():
    reference, ours = hf_pair(seed=1)
    back = to_hf_state_dict(ours.state_dict())
    expected = reference.state_dict()
    assert set(back) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(back[name], tensor, atol=0, rtol=0, msg=name)


def test_mlm_decoder_is_tied_to_the_token_embedding():
    model = BertForPreTraining(BertConfig(vocab_size=50, size="tiny"))
    assert model.mlm.decoder.weight is model.bert.embeddings.token.weight
    with torch.no_grad():
        model.bert.embeddings.token.weight[7, 0] = 123.0
    assert model.mlm.decoder.weight[7, 0].item() == 123.0
    assert sum(p.numel() for p in model.parameters()) < sum(t.numel() for t in model.state_dict().values())


def test_named_sizes_and_overrides():
    base = BertConfig(size="base")
    assert (base.n_layers, base.d_model, base.n_heads, base.d_ff) == (12, 768, 12, 3072)
    assert (BertConfig(size="large").n_layers, BertConfig(size="large").d_model) == (24, 1024)
    assert set(SIZES) == {"tiny", "mini", "small", "base", "large"}
    assert BertConfig(size="tiny", n_layers=3).n_layers == 3
    with pytest.raises(ValueError, match="size='huge'"):
        BertConfig(size="huge")


def test_published_weights_offline_are_a_clear_error(offline_hub):
    with pytest.raises(WeightsUnavailable, match="could not load BERT weights 'bert-base-uncased'.*offline"):
        BertForPreTraining.from_pretrained("bert-base-uncased")


# ------------------------------------------------------------------ inputs
def test_segment_ids_mark_a_and_b():
    ids, segments = encode_pair([10, 11, 12], [20, 21], SPECIALS)
    assert ids == [2, 10, 11, 12, 3, 20, 21, 3]
    assert segments == [0, 0, 0, 0, 0, 1, 1, 1]
    ids, segments = encode_pair([10], None, SPECIALS)
    assert ids == [2, 10, 3] and segments == [0, 0, 0]


@pytest.mark.parametrize("strategy, expected", [
    ("head", list(range(510))),
    ("tail", list(range(190, 700))),
    ("head_tail", list(range(128)) + list(range(700 - 382, 700))),
])
def test_truncation_strategies_keep_510_tokens(strategy, expected):
    kept = truncate(list(range(700)), 510, strategy)
    assert len(kept) == 510 and kept == expected
    assert truncate(list(range(100)), 510, strategy) == list(range(100))  # short inputs untouched


def test_pair_truncation_trims_the_longer_segment():
    a, b = truncate_pair(list(range(10)), list(range(100, 104)), 8)
    assert (len(a), len(b)) == (4, 4) and a == [0, 1, 2, 3] and b == [100, 101, 102, 103]


def test_masking_statistics_follow_15_80_10_10_and_spare_specials():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (400, 128), generator=generator)
    ids[:, 0], ids[:, 64], ids[:, 100:] = SPECIALS["cls"], SPECIALS["sep"], SPECIALS["pad"]
    maskable = (ids != SPECIALS["cls"]) & (ids != SPECIALS["sep"]) & (ids != SPECIALS["pad"])
    corrupted, labels = mask_tokens(ids, maskable, SPECIALS["mask"], 1000, 5, generator=generator)
    chosen = labels != IGNORE_INDEX
    assert not chosen[~maskable].any()  # specials and padding are never chosen
    assert torch.equal(corrupted[~maskable], ids[~maskable])
    assert torch.equal(labels[chosen], ids[chosen])  # labels are the original tokens
    assert chosen.sum() / maskable.sum() == pytest.approx(0.15, abs=0.005)
    n = chosen.sum().item()
    to_mask = (corrupted == SPECIALS["mask"]) & chosen
    kept = (corrupted == ids) & chosen
    assert to_mask.sum().item() / n == pytest.approx(0.8, abs=0.01)
    # the random 10% may draw the original token (1 in 995); count it with "unchanged"
    assert kept.sum().item() / n == pytest.approx(0.1 + 0.1 / 995, abs=0.01)
    randomised = chosen & ~to_mask & ~kept
    assert randomised.sum().item() / n == pytest.approx(0.1, abs=0.01)
    assert corrupted[randomised].min() >= 5  # random tokens are never specials
    assert torch.equal(corrupted[~chosen], ids[~chosen])


@pytest.mark.parametrize("masking", [{"mask": 1.0, "random": 0.0, "keep": 0.0}, {"mask": 0.8, "random": 0.2, "keep": 0.0}])
def test_masking_shares_are_the_configured_ones(masking):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 1000, (400, 128), generator=generator)
    maskable = torch.ones_like(ids, dtype=torch.bool)
    corrupted, labels = mask_tokens(ids, maskable, SPECIALS["mask"], 1000, 5, generator=generator, masking=masking)
    chosen = labels != IGNORE_INDEX
    n = chosen.sum().item()
    to_mask = ((corrupted == SPECIALS["mask"]) & chosen).sum().item() / n
    changed = ((corrupted != ids) & (corrupted != SPECIALS["mask"]) & chosen).sum().item() / n
    assert to_mask == pytest.approx(masking["mask"], abs=0.01)
    assert changed == pytest.approx(masking["random"] * 994 / 995, abs=0.01)


def test_masking_shares_that_do_not_sum_to_one_are_one_line():
    with pytest.raises(DataError, match=r"data.datamodule.masking=.*summing to 1"):
        BertPretrainingDataModule("unused", "unused", masking={"mask": 0.8, "random": 0.1, "keep": 0.2})


def test_single_sentence_pretraining_has_no_next_sentence_label_and_learns_the_masked_lm(corpus_and_tokenizer, tmp_path):
    corpus, tokenizer = corpus_and_tokenizer
    L.seed_everything(0)
    dm = BertPretrainingDataModule(str(corpus), str(tokenizer), max_len=48, batch_size=32, max_documents=120,
                                   next_sentence=False)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert "is_next" not in batch and not batch["segment_ids"].any()
    for row, real in zip(batch["input_ids"], batch["attention_mask"]):
        sep = torch.nonzero(row == dm.specials["sep"]).flatten()
        assert row[0] == dm.specials["cls"] and len(sep) == 1 and real.sum() == sep[0] + 1
    config = BertConfig(size="tiny", n_layers=1, d_model=64, n_heads=2, **dm.model_kwargs())
    task = BertPretrainingTask(config.to_dict(), dm.preprocessor.to_state(), lr=2e-3)
    trainer = L.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, num_sanity_val_steps=0)
    trainer.fit(task, dm)
    metrics = trainer.callback_metrics
    assert "val/nsp_loss" not in metrics and "val/nsp_acc" not in metrics
    assert metrics["val/loss"] == metrics["val/mlm_loss"] < np.log(config.vocab_size) - 1.0


def test_next_sentence_pairs_are_balanced_and_notnext_crosses_documents():
    # Each sentence is [document, position] so that a pair says where its halves came from.
    documents = [[[d, s] for s in range(12)] for d in range(40)]
    pairs = next_sentence_pairs(documents, np.random.default_rng(0))
    assert len(pairs) == 40 * 11  # every sentence with a successor
    is_next = np.array([p[2] for p in pairs])
    assert is_next.mean() == pytest.approx(0.5, abs=0.05)
    for a, b, label in pairs:
        if label == 1:
            assert b == [a[0], a[1] + 1]  # the true next sentence
        else:
            assert b[0] != a[0]  # from another document


def test_pretraining_batches(corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    dm = BertPretrainingDataModule(str(corpus), str(tokenizer), max_len=48, batch_size=8)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[1] <= 48
    assert (batch["input_ids"][:, 0] == dm.specials["cls"]).all()
    for row, segments, real in zip(batch["input_ids"], batch["segment_ids"], batch["attention_mask"]):
        sep = torch.nonzero(row == dm.specials["sep"]).flatten()
        assert len(sep) == 2 and real.sum() == sep[1] + 1
        assert (segments[: sep[0] + 1] == 0).all() and (segments[sep[0] + 1 : sep[1] + 1] == 1).all()
    # validation masks are the same every time, so epochs compare
    first, second = next(iter(dm.val_dataloader())), next(iter(dm.val_dataloader()))
    assert torch.equal(first["input_ids"], second["input_ids"]) and torch.equal(first["mlm_labels"], second["mlm_labels"])


def test_tiny_pretraining_learns_and_its_encoder_loads_for_fine_tuning(corpus_and_tokenizer, tmp_path):
    corpus, tokenizer = corpus_and_tokenizer
    L.seed_everything(0)
    dm = BertPretrainingDataModule(str(corpus), str(tokenizer), max_len=48, batch_size=32, max_documents=120)
    config = BertConfig(size="tiny", n_layers=1, d_model=64, n_heads=2, **dm.model_kwargs())
    task = BertPretrainingTask(config.to_dict(), dm.preprocessor.to_state(), lr=2e-3)
    trainer = L.Trainer(max_epochs=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, num_sanity_val_steps=0)
    trainer.fit(task, dm)
    history = trainer.callback_metrics
    assert history["val/mlm_loss"] < np.log(config.vocab_size) - 1.0  # well below a uniform guess
    checkpoint = tmp_path / "pretrained.ckpt"
    trainer.save_checkpoint(checkpoint)

    fresh = BertForPreTraining(config).bert
    load_pretrained_bert(fresh, str(checkpoint))
    for name, tensor in task.model.bert.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    wrong_size = BertForPreTraining(BertConfig(size="tiny", **dm.model_kwargs())).bert
    with pytest.raises(TransformerLabError, match="does not fit this model"):
        load_pretrained_bert(wrong_size, str(checkpoint))
    with pytest.raises(TransformerLabError, match="checkpoint not found"):
        load_pretrained_bert(fresh, str(tmp_path / "missing.ckpt"))


# ------------------------------------------------------------------ the left-to-right objective (task.objective=causal)
def tiny_preprocessor_state(vocab_size: int = 60) -> dict:
    """A WordPiece tokenizer with BERT's specials and filler words, as a task's preprocessor state."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordPiece

    from transformer_lab.data.bert import BertPreprocessor

    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])}
    vocab.update({f"w{i}": len(vocab) for i in range(vocab_size - len(vocab))})
    return BertPreprocessor(Tokenizer(WordPiece(vocab, unk_token="[UNK]")), max_len=32).to_state()


def causal_task(seed: int = 0) -> BertPretrainingTask:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=60, size="tiny", d_model=32, n_heads=4, n_layers=2, dropout=0.0, max_len=32)
    return BertPretrainingTask(config.to_dict(), tiny_preprocessor_state(), objective="causal").eval()


def sentences_batch(generator: torch.Generator) -> dict:
    """[CLS] words [SEP] [PAD]... rows of different lengths."""
    ids = torch.randint(5, 60, (3, 12), generator=generator)
    lengths = [12, 7, 9]
    mask = torch.arange(12)[None] < torch.tensor(lengths)[:, None]
    ids[:, 0] = SPECIALS["cls"]
    for row, length in enumerate(lengths):
        ids[row, length - 1] = SPECIALS["sep"]
    return {"input_ids": ids.masked_fill(~mask, SPECIALS["pad"]), "segment_ids": torch.zeros_like(ids),
            "attention_mask": mask}


def test_causal_objective_is_the_cross_entropy_of_the_shifted_logits_of_the_text_as_written():
    """The loss is the mean cross-entropy of the logits at position i against token i + 1 over every
    real next token, from causal logits of the uncorrupted sentence (the masked LM's corruption undone)."""
    import torch.nn.functional as F

    task = causal_task()
    generator = torch.Generator().manual_seed(0)
    batch = sentences_batch(generator)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    maskable = mask & (ids != SPECIALS["cls"]) & (ids != SPECIALS["sep"])
    corrupted, labels = mask_tokens(ids, maskable, SPECIALS["mask"], 60, 5, probability=0.5, generator=generator)
    assert (corrupted != ids).any()
    with torch.no_grad():
        logits = task.model(ids, None, mask, is_causal=True).logits  # (batch, length, vocab): every position
        out = task({**batch, "input_ids": corrupted, "mlm_labels": labels})
    shifted, targets = logits[:, :-1], ids[:, 1:].masked_fill(~mask[:, 1:], IGNORE_INDEX)
    expected = F.cross_entropy(shifted.reshape(-1, 60), targets.reshape(-1), ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(out["lm_loss"], expected, rtol=0, atol=1e-6)
    assert len(out["lm_target"]) == int(mask.sum()) - 3  # every real token but each row's first ([CLS])
    # by hand: every row, every position i before the row's last real token, against token i + 1
    terms = [-logits[row, i].log_softmax(-1)[ids[row, i + 1]] for row in range(3) for i in range(int(mask[row].sum()) - 1)]
    torch.testing.assert_close(out["lm_loss"], torch.stack(terms).mean(), rtol=0, atol=1e-6)
    with torch.no_grad():
        plain = task(batch)  # no mlm_labels: the batch is the text as written
    torch.testing.assert_close(plain["lm_loss"], expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("fast_path", [True, False])
def test_causal_pretraining_never_lets_a_position_see_a_later_one(fast_path, monkeypatch):
    """Changing the token at position j leaves the causal logits before j as they were, on the CPU
    fast path and the reading path alike (and the two agree); bidirectionally they change."""
    from transformer_lab.models.attention import MultiHeadAttention

    monkeypatch.setattr(MultiHeadAttention, "fast_path", fast_path)
    model = causal_task().model
    batch = sentences_batch(torch.Generator().manual_seed(1))
    ids, mask = batch["input_ids"], batch["attention_mask"]
    changed = ids.clone()
    changed[:, 5] = (changed[:, 5] + 1 - 5) % 55 + 5  # another word at position 5 of every row
    with torch.no_grad():
        before = model(ids, None, mask, is_causal=True).logits
        after = model(changed, None, mask, is_causal=True).logits
        bidirectional = model(ids, None, mask).logits, model(changed, None, mask).logits
    torch.testing.assert_close(after[:, :5], before[:, :5], rtol=0, atol=1e-6)
    assert not torch.allclose(after[:, 5], before[:, 5], atol=1e-4)
    assert not torch.allclose(bidirectional[1][:, :5], bidirectional[0][:, :5], atol=1e-4)
    monkeypatch.setattr(MultiHeadAttention, "fast_path", not fast_path)
    with torch.no_grad():
        other_path = model(ids, None, mask, is_causal=True).logits
    torch.testing.assert_close(other_path, before, rtol=0, atol=1e-5)


def test_a_causal_training_step_sends_no_gradient_from_a_position_to_earlier_predictions():
    """In a training step (dropout on), the loss of the predictions up to position i has no gradient
    with respect to the embedding of any later input."""
    task = causal_task().train()
    batch = sentences_batch(torch.Generator().manual_seed(2))
    model = task.model
    embedded = {}

    def keep(module, inputs, output):
        output.retain_grad()
        embedded["x"] = output

    handle = model.bert.embeddings.register_forward_hook(keep)
    out = model(batch["input_ids"], None, batch["attention_mask"], is_causal=True)
    handle.remove()
    out.logits[:, :4].sum().backward()  # the predictions of positions 0..3
    assert embedded["x"].grad[:, 4:].abs().max() == 0
    assert embedded["x"].grad[:, :4].abs().max() > 0


def test_causal_objective_wants_single_sentences_and_known_objectives_only():
    task = causal_task()
    batch = sentences_batch(torch.Generator().manual_seed(3))
    with pytest.raises(TransformerLabError, match="next_sentence=false"):
        task({**batch, "is_next": torch.tensor([0, 1, 0])})
    with pytest.raises(TransformerLabError, match="task.objective='prefix'"):
        BertPretrainingTask(task.hparams.model_config, tiny_preprocessor_state(), objective="prefix")


def pretrain_tiny(corpus_and_tokenizer, tmp_path, objective: str) -> tuple[dict, BertConfig]:
    """Two epochs of a one-block BERT on single sentences of the tiny corpus: its metrics and config."""
    corpus, tokenizer = corpus_and_tokenizer
    L.seed_everything(0)
    dm = BertPretrainingDataModule(str(corpus), str(tokenizer), max_len=48, batch_size=32, max_documents=120,
                                   next_sentence=False)
    config = BertConfig(size="tiny", n_layers=1, d_model=64, n_heads=2, **dm.model_kwargs())
    task = BertPretrainingTask(config.to_dict(), dm.preprocessor.to_state(), lr=2e-3, objective=objective)
    trainer = L.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, num_sanity_val_steps=0)
    trainer.fit(task, dm)
    return trainer.callback_metrics, config


@pytest.mark.slow  # 10 s of training
def test_tiny_causal_pretraining_learns_the_next_word_and_logs_lm_metrics(corpus_and_tokenizer, tmp_path):
    metrics, config = pretrain_tiny(corpus_and_tokenizer, tmp_path, "causal")
    assert "val/mlm_loss" not in metrics and "val/lm_acc" in metrics
    assert metrics["val/loss"] == metrics["val/lm_loss"] < np.log(config.vocab_size) - 1.0


# ------------------------------------------------------------------ replaced-token detection (task.objective=electra)
def electra_task(seed: int = 0) -> BertPretrainingTask:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=60, size="tiny", d_model=32, n_heads=4, n_layers=2, dropout=0.0, max_len=32)
    return BertPretrainingTask(config.to_dict(), tiny_preprocessor_state(), objective="electra").eval()


def masked(batch: dict, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    maskable = mask & (ids != SPECIALS["cls"]) & (ids != SPECIALS["sep"])
    corrupted, labels = mask_tokens(ids, maskable, SPECIALS["mask"], 60, 5, probability=0.5, generator=generator)
    return {**batch, "input_ids": corrupted, "mlm_labels": labels}


def test_electra_generator_is_smaller_and_shares_the_encoders_embeddings():
    model = electra_task().model
    assert model.generator.bert.embeddings is model.bert.embeddings
    assert model.generator.mlm.decoder.weight is model.bert.embeddings.token.weight
    assert len(model.generator.bert.blocks) == 1 and len(model.bert.blocks) == 2
    # fine-tuning reads model.bert.*: the discriminator's body, under BertModel's own names
    assert {k.removeprefix("bert.") for k in model.state_dict() if k.startswith("bert.")} == set(BertModel(
        model.config).state_dict())


def test_electra_replaces_only_masked_positions_and_labels_a_correct_sample_as_original():
    task = electra_task()
    batch = sentences_batch(torch.Generator().manual_seed(4))
    inputs = masked(batch, 4)
    chosen = inputs["mlm_labels"] != IGNORE_INDEX
    original = torch.where(chosen, inputs["mlm_labels"], inputs["input_ids"])
    torch.manual_seed(0)
    with torch.no_grad():
        out = task.model(inputs["input_ids"], None, inputs["attention_mask"], chosen, original)
    assert out.logits.shape == original.shape and out.generator_logits.shape == (int(chosen.sum()), 60)
    assert not out.replaced[~chosen].any()
    # a generator sure of one word (7) puts it at every masked position: a replacement wherever the
    # sentence had another word, and "original" where it had 7 already (the paper's labelling)
    original[chosen.nonzero()[0].tolist()] = 7
    with torch.no_grad():
        task.model.generator.mlm.bias.fill_(-1e4)
        task.model.generator.mlm.bias[7] = 1e4
        out = task.model(inputs["input_ids"], None, inputs["attention_mask"], chosen, original)
    assert torch.equal(out.replaced, chosen & (original != 7))
    assert out.replaced.any() and (chosen & ~out.replaced).any()


def test_electra_loss_is_the_generators_masked_lm_plus_fifty_times_the_discriminators_over_real_tokens():
    import torch.nn.functional as F

    task = electra_task()
    batch = masked(sentences_batch(torch.Generator().manual_seed(5)), 5)
    chosen = batch["mlm_labels"] != IGNORE_INDEX
    original = torch.where(chosen, batch["mlm_labels"], batch["input_ids"])
    with torch.no_grad():
        torch.manual_seed(1)
        out = task(batch)
        torch.manual_seed(1)  # the same samples
        model_out = task.model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"], chosen, original)
    real = batch["attention_mask"].bool()
    expected = F.binary_cross_entropy_with_logits(model_out.logits[real], model_out.replaced[real].float())
    torch.testing.assert_close(out["rtd_loss"], expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(out["lm_loss"], F.cross_entropy(model_out.generator_logits, batch["mlm_labels"][chosen]),
                               rtol=0, atol=1e-6)
    task.log_dict = task.log = lambda *args, **kwargs: None
    torch.manual_seed(1)
    with torch.no_grad():
        total = task._step(batch, "train")
    torch.testing.assert_close(total, out["lm_loss"] + 50.0 * out["rtd_loss"], rtol=0, atol=1e-5)


def test_electra_discriminator_loss_trains_no_generator_block():
    """Sampling is not differentiated: the generator's blocks learn from its masked LM alone, while
    the shared embeddings learn from both."""
    task = electra_task().train()
    batch = masked(sentences_batch(torch.Generator().manual_seed(6)), 6)
    task(batch)["rtd_loss"].backward()
    generator_blocks = [p.grad for p in task.model.generator.bert.blocks.parameters()]
    assert all(g is None or g.abs().max() == 0 for g in generator_blocks)
    assert task.model.bert.embeddings.token.weight.grad.abs().max() > 0
    assert all(p.grad is not None for p in task.model.bert.blocks.parameters())


def test_electra_wants_single_sentences():
    task = electra_task()
    batch = masked(sentences_batch(torch.Generator().manual_seed(7)), 7)
    with pytest.raises(TransformerLabError, match="next_sentence=false"):
        task({**batch, "is_next": torch.tensor([0, 1, 0])})


@pytest.mark.slow  # 10 s of training
def test_tiny_electra_pretraining_logs_the_generator_and_the_discriminator_and_their_weighted_sum(
        corpus_and_tokenizer, tmp_path):
    metrics, _ = pretrain_tiny(corpus_and_tokenizer, tmp_path, "electra")
    assert {"val/mlm_acc", "val/rtd_acc", "val/rtd_loss", "val/mlm_loss"} <= set(metrics)
    torch.testing.assert_close(metrics["val/loss"], metrics["val/mlm_loss"] + 50 * metrics["val/rtd_loss"])
    # about 15 % x (1 - the generator's hit rate) of the tokens are replaced: most labels are "original"
    assert 0.8 < metrics["val/rtd_acc"] <= 1 and metrics["val/mlm_acc"] > 0
