import json
import random

import lightning as L
import numpy as np
import pytest
import torch
from conftest import PYTHON, ROOT, run

from transformer_lab.data.corpus import prepare
from transformer_lab.data.gpt import (
    GPTClassificationDataModule,
    GPTClassificationPreprocessor,
    GPTPreprocessor,
    LanguageModelDataModule,
    TokenBlocks,
)
from transformer_lab.data.tokenizers import END_OF_TEXT, GPT_SPECIAL, prepare_tokenizers, train_tokenizer
from transformer_lab.errors import DataError, TransformerLabError
from transformer_lab.models.attention import MultiHeadAttention
from transformer_lab.models.blocks import MixtureOfExperts
from transformer_lab.models.gpt import (
    SIZES,
    GPTClassifierConfig,
    GPTConfig,
    GPTForSequenceClassification,
    GPTLMHeadModel,
    config_from_hf,
    from_hf_state_dict,
    to_hf_state_dict,
)
from transformer_lab.models.interop import WeightsUnavailable
from transformer_lab.models.positional import RotaryEmbedding
from transformer_lab.tasks.gpt import GPTClassificationTask, GPTPretrainingTask
from transformer_lab.runtime.config import compose_config


def tiny(**overrides) -> GPTLMHeadModel:
    torch.manual_seed(0)
    settings = {"vocab_size": 50, "n_layers": 2, "d_model": 32, "n_heads": 4, "max_len": 48, "dropout": 0.0}
    return GPTLMHeadModel(GPTConfig(**{**settings, **overrides})).eval()


VARIANTS = [{}, {"norm_first": False}, {"position": "rope"}, {"position": "sinusoidal"}, {"ffn": "moe"},
            {"ffn": "moe", "moe_top_k": 1}]


# ------------------------------------------------------------------ model
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()) or "gpt2")
def test_a_later_token_never_changes_earlier_logits(variant):
    model = tiny(**variant)
    ids = torch.randint(0, 50, (2, 20))
    changed = ids.clone()
    changed[:, 12:] = (ids[:, 12:] + 7) % 50
    with torch.no_grad():
        before, after = model(ids).logits, model(changed).logits
    torch.testing.assert_close(before[:, :12], after[:, :12], atol=1e-6, rtol=0)
    assert not torch.allclose(before[:, 12:], after[:, 12:])


def gpt2_pair(seed: int = 0, **hf_options):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    hf_config = GPT2Config(vocab_size=120, n_positions=40, n_embd=32, n_layer=2, n_head=4, bos_token_id=0,
                           eos_token_id=0, **hf_options)
    reference = GPT2LMHeadModel(hf_config).eval()
    ours = GPTLMHeadModel(config_from_hf(hf_config)).eval()
    ours.load_state_dict(from_hf_state_dict(reference.state_dict()), strict=True)
    return reference, ours


def test_converted_transformers_gpt2_gives_the_same_logits():
    reference, ours = gpt2_pair()
    ids = torch.randint(0, 120, (3, 25))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, reference(ids).logits, atol=1e-5, rtol=0)


def test_causal_attention_weights_match_transformers_per_layer():
    reference, ours = gpt2_pair(attn_implementation="eager")  # transformers' fused kernel returns no weights
    ids = torch.randint(0, 120, (2, 11))
    with torch.no_grad():
        theirs = reference(ids, output_attentions=True).attentions
        out = ours(ids, return_weights=True)
    assert len(out.attentions) == len(theirs) == 2
    for layer, (weights, expected) in enumerate(zip(out.attentions, theirs)):
        torch.testing.assert_close(weights, expected, atol=1e-6, rtol=0, msg=f"layer {layer}")
    assert (out.attentions[0].triu(1) == 0).all()  # no query sees a later key


def test_conversion_back_to_transformers_names_round_trips():
    reference, ours = gpt2_pair(seed=1)
    back = to_hf_state_dict(ours.state_dict())
    missing, unexpected = reference.load_state_dict(back, strict=False)
    assert not unexpected and all(name.endswith(".attn.bias") for name in missing)  # mask buffers, if any
    for name, tensor in back.items():
        torch.testing.assert_close(tensor, reference.state_dict()[name], atol=0, rtol=0, msg=name)


def test_lm_head_is_tied_and_gpt2_scales_residual_projections():
    model = GPTLMHeadModel(GPTConfig(vocab_size=100, size="mini", dropout=0.0))
    assert model.lm_head.weight is model.gpt.token.weight
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in set(model.parameters()))
    residual = torch.cat([b.attn.out.weight.flatten() for b in model.gpt.blocks])
    other = torch.cat([b.attn.q.weight.flatten() for b in model.gpt.blocks])
    assert residual.std().item() == pytest.approx(0.02 / (2 * 4) ** 0.5, rel=0.05)
    assert other.std().item() == pytest.approx(0.02, rel=0.05)


def test_named_sizes_and_gpt1_post_norm():
    assert {name: SIZES[name][:3] for name in ("gpt1", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl")} == {
        "gpt1": (12, 768, 12), "gpt2-small": (12, 768, 12), "gpt2-medium": (24, 1024, 16),
        "gpt2-large": (36, 1280, 20), "gpt2-xl": (48, 1600, 25)}
    gpt1 = GPTConfig(size="gpt1", n_layers=1)
    assert gpt1.norm_first is False and GPTLMHeadModel(gpt1).gpt.final_norm is None
    assert GPTLMHeadModel(GPTConfig(size="tiny")).gpt.final_norm is not None
    with pytest.raises(ValueError, match="position"):
        GPTConfig(position="alibi")


def test_published_weights_offline_are_a_clear_error(offline_hub):
    with pytest.raises(WeightsUnavailable, match="could not load GPT-2 weights 'gpt2'"):
        GPTLMHeadModel.from_pretrained("gpt2")


def test_rope_scores_depend_only_on_the_relative_position():
    rotary = RotaryEmbedding(16)
    q, k = torch.randn(16), torch.randn(16)

    def score(m: int, n: int) -> float:
        rotated_q = rotary(q.expand(1, 1, 1, 16), offset=m)
        rotated_k = rotary(k.expand(1, 1, 1, 16), offset=n)
        return float((rotated_q * rotated_k).sum())

    for gap in (0, 1, 5, 17):
        scores = [score(m, m + gap) for m in (0, 3, 40, 250)]
        assert max(scores) - min(scores) < 1e-4, (gap, scores)
    assert abs(score(0, 1) - score(0, 9)) > 1e-3  # and it does depend on the gap
    torch.testing.assert_close(rotary(q.expand(1, 1, 1, 16), 0).norm(), q.norm())  # a rotation


# ------------------------------------------------------------------ generation
@pytest.mark.parametrize("position", ["learned", "rope"])
def test_cached_and_uncached_greedy_generation_are_identical(position):
    model = tiny(position=position)
    prompt = torch.randint(0, 50, (2, 6))
    cached = model.generate(prompt, 30, "greedy", use_cache=True)
    assert torch.equal(cached, model.generate(prompt, 30, "greedy", use_cache=False))
    assert cached.shape == (2, 30)


def test_incremental_forward_with_a_cache_equals_the_full_forward():
    from transformer_lab.models.attention import KVCache

    model = tiny(position="rope")
    ids = torch.randint(0, 50, (1, 12))
    caches = [KVCache() for _ in model.gpt.blocks]
    with torch.no_grad():
        pieces = [model(ids[:, :5], caches).logits] + [model(ids[:, i:i + 1], caches).logits for i in range(5, 12)]
        full = model(ids).logits
    assert caches[0].length == 12
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=0)


def test_seeded_sampling_is_reproducible_and_respects_top_k():
    model = tiny()
    prompt = torch.randint(0, 50, (3, 4))

    def sample(seed: int, **kwargs) -> torch.Tensor:
        return model.generate(prompt, 25, "sample", generator=torch.Generator().manual_seed(seed), **kwargs)

    assert torch.equal(sample(1, top_k=10, top_p=0.9), sample(1, top_k=10, top_p=0.9))
    assert not torch.equal(sample(1), sample(2))
    # with top_k=1 sampling is greedy
    assert torch.equal(sample(3, top_k=1), model.generate(prompt, 25, "greedy"))
    # a tiny top_p keeps only the most likely token too
    assert torch.equal(sample(4, top_p=1e-6), model.generate(prompt, 25, "greedy"))


def test_generation_stops_at_end_of_text():
    model = tiny()
    prompt = torch.randint(0, 50, (1, 4))
    greedy = model.generate(prompt, 10, "greedy")
    eos = int(greedy[0, 3])  # declare the 4th generated token to be end-of-text
    first = greedy[0].tolist().index(eos)
    stopped = model.generate(prompt, 10, "greedy", eos_id=eos)
    assert torch.equal(stopped, greedy[:, :first + 1])
    # in a batch, a row that ended waits (padded with end-of-text) for the others
    both = model.generate(torch.cat([prompt, torch.randint(0, 50, (1, 4))]), 10, "greedy", eos_id=eos)
    assert torch.equal(both[0, :first + 1], stopped[0]) and (both[0, first:] == eos).all()


# ------------------------------------------------------------------ mixture of experts
def test_each_token_only_uses_its_chosen_experts():
    torch.manual_seed(0)
    moe = MixtureOfExperts(d_model=16, d_ff=32, n_experts=4, top_k=2).eval()
    x = torch.randn(1, 10, 16)
    with torch.no_grad():
        before = moe(x)
        chosen = moe.last_choice.clone()
        for expert in range(4):
            saved = [p.clone() for p in moe.experts[expert].parameters()]
            for p in moe.experts[expert].parameters():
                p.add_(torch.randn_like(p))  # change one expert
            after = moe(x)
            uses = (chosen == expert).any(dim=1)
            torch.testing.assert_close(after[0, ~uses], before[0, ~uses], atol=1e-6, rtol=0)
            assert (after[0, uses] - before[0, uses]).abs().amax(dim=-1).min() > 1e-4
            for p, value in zip(moe.experts[expert].parameters(), saved):
                p.copy_(value)
    assert set(chosen.flatten().tolist()) > {0}  # tokens went to several experts


def test_load_balancing_loss_is_one_for_a_uniform_router_and_is_logged():
    moe = MixtureOfExperts(d_model=8, d_ff=16, n_experts=4, top_k=1)
    torch.nn.init.zeros_(moe.router.weight)
    moe(torch.randn(2, 5, 8))
    assert moe.aux_loss.item() == pytest.approx(1.0)
    model = tiny(ffn="moe").train()
    task = GPTPretrainingTask(model.config.to_dict(), GPTPreprocessor(train_tokenizer("bpe", ["a b c"] * 3, 300)).to_state())
    out = task.model(torch.randint(0, 50, (2, 8)))
    assert out.logits.shape == (2, 8, 50) and out.aux_loss.item() >= 2 * 1.0 - 1e-6  # >= 1 per layer
    assert out.aux_loss.item() == task.model.gpt.moe_aux_loss().item()
    assert tiny().train()(torch.randint(0, 50, (2, 8))).aux_loss is None  # dense blocks have none


# ------------------------------------------------------------------ data
def test_language_model_blocks_are_shifted_by_one(tmp_path):
    blocks = TokenBlocks(torch.arange(100), 8)
    item = blocks[37]
    assert item["input_ids"].tolist() == list(range(37, 45)) and item["labels"].tolist() == list(range(38, 46))
    assert len(blocks) == 92
    with pytest.raises(DataError, match="cannot fill one block"):
        TokenBlocks(torch.arange(8), 8)


@pytest.fixture(scope="module")
def gpt_tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt")
    prepare("builtin", str(root / "corpus"))
    prepare_tokenizers(str(root / "corpus"), str(root / "tokenizers"), {
        "bpe": {"kind": "bpe", "vocab_size": 600, "document_separator": END_OF_TEXT},
        "char": {"kind": "char", "vocab_size": 200, "document_separator": END_OF_TEXT}})
    return root


def test_language_model_datamodule_streams_the_encoded_corpus(gpt_tokenizers):
    dm = LanguageModelDataModule(str(gpt_tokenizers / "tokenizers" / "char"), block_size=16, batch_size=4,
                                 samples_per_epoch=40, seed=3)
    dm.setup()
    assert dm.model_kwargs()["eos_id"] == dm.preprocessor.tokenizer.token_to_id(END_OF_TEXT)
    stream = np.load(gpt_tokenizers / "tokenizers" / "char" / "validation.npy")
    assert len(dm.val_set) == len(range(0, len(stream) - 16, 16))  # non-overlapping blocks
    first = [b["input_ids"] for b in dm.train_dataloader()]
    assert len(first) == 10 and torch.equal(torch.cat(first), torch.cat([b["input_ids"] for b in dm.train_dataloader()]))
    assert set(GPT_SPECIAL) <= set(dm.preprocessor.tokenizer.get_vocab())


def test_mixture_of_experts_pretraining_logs_the_balance_loss(gpt_tokenizers, tmp_path):
    dm = LanguageModelDataModule(str(gpt_tokenizers / "tokenizers" / "char"), block_size=16, batch_size=4,
                                 samples_per_epoch=16, max_eval_blocks=4)
    config = GPTConfig(n_layers=1, d_model=32, n_heads=2, max_len=16, ffn="moe", moe_top_k=1, **dm.model_kwargs())
    task = GPTPretrainingTask(config.to_dict(), dm.preprocessor.to_state(), warmup_steps=1)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(task, dm)
    metrics = trainer.callback_metrics
    assert metrics["train/moe_balance_loss_epoch"] >= 1.0 - 1e-6  # 1 = perfectly balanced
    assert metrics["train/loss_epoch"] > metrics["train/lm_loss_epoch"]


def test_tiny_gpt_pretraining_lowers_the_loss_and_generates(gpt_tokenizers, tmp_path):
    from transformer_lab.inference.generate import generate
    from transformer_lab.training.train import train

    overrides = ["experiment=gpt/pretrain", "logger=none", "data.tokenizer=char", "model.max_len=32",
                 f"data.datamodule.tokenizer_dir={gpt_tokenizers}/tokenizers/char", "data.datamodule.samples_per_epoch=640",
                 "data.datamodule.max_eval_blocks=40", "task.warmup_steps=5", "trainer.max_epochs=2",
                 "callbacks.rich_progress_bar=null", "+trainer.num_sanity_val_steps=0"]
    metrics = train(compose_config("train", overrides, tmp_path / "train"))
    history = (tmp_path / "train" / "history.csv").read_text().splitlines()
    assert len(history) == 3 and metrics["val/loss"] < np.log(200)  # well below a uniform guess
    assert metrics["val/perplexity"] == pytest.approx(np.exp(metrics["val/loss"]), rel=1e-4)

    def sample(seed: int) -> dict:
        cfg = compose_config("generate", ["logger=none", f"train_dir={tmp_path}/train", "prompt=The ",
                                          "max_new_tokens=20", "num_samples=2", f"seed={seed}",
                                          f"output={tmp_path}/samples.json"], tmp_path / "gen")
        return generate(cfg)

    first, again = sample(1), sample(1)
    assert first["samples"] == again["samples"] and len(first["samples"]) == 2
    assert json.loads((tmp_path / "samples.json").read_text())["samples"] == first["samples"]
    assert (tmp_path / "samples.txt").read_text().startswith("--- sample 0 ---\nThe ")

    # the checkpoint holds its tokenizer: generation needs no tokenizer file (moved away here)
    tokenizer_file = gpt_tokenizers / "tokenizers" / "char" / "tokenizer.json"
    tokenizer_file.rename(tmp_path / "moved.json")
    try:
        assert sample(1)["samples"] == first["samples"]
    finally:
        (tmp_path / "moved.json").rename(tokenizer_file)

    # pre-trained body -> GPT-1 fine-tuning model
    pretrained = GPTPretrainingTask.load_from_checkpoint(tmp_path / "train/checkpoints/best.ckpt", weights_only=True)
    preprocessor = GPTClassificationPreprocessor(pretrained.preprocessor.tokenizer, ["a", "b"]).to_state()
    task = GPTClassificationTask(GPTClassifierConfig(**{**torch.load(
        tmp_path / "train/checkpoints/best.ckpt", weights_only=True)["hyper_parameters"]["model_config"],
        "n_classes": 2}).to_dict(), preprocessor, pretrained=str(tmp_path / "train/checkpoints/best.ckpt"))
    torch.testing.assert_close(task.model.gpt.token.weight, pretrained.model.gpt.token.weight)


# ------------------------------------------------------------------ GPT-1 fine-tuning
FORMAT_WORDS = ["good", "bad", "the", "film", "was", "plot", "a", "very", "story"]


@pytest.mark.slow  # trains a model first: make test-all (CI) runs it, make test stays under 5 minutes
def test_compiled_training_gives_the_same_model(gpt_tokenizers, tmp_path):
    """compile.enabled=true runs training through torch.compile (the eager backend: graph capture
    without code generation, so the numbers must not move) and keeps the parameter names."""
    from torch._dynamo.utils import counters

    from transformer_lab.training.train import train

    overrides = ["experiment=gpt/pretrain", "logger=none", "data.tokenizer=char", "model.max_len=16",
                 f"data.datamodule.tokenizer_dir={gpt_tokenizers}/tokenizers/char", "data.datamodule.batch_size=8",
                 "data.datamodule.samples_per_epoch=48", "data.datamodule.max_eval_blocks=8", "trainer.max_epochs=1",
                 "callbacks.rich_progress_bar=null", "+trainer.num_sanity_val_steps=0"]
    plain = train(compose_config("train", overrides, tmp_path / "plain"))
    counters.clear()
    compiled = train(compose_config("train", [*overrides, "compile.enabled=true", "compile.backend=eager"],
                                    tmp_path / "compiled"))
    assert counters["stats"]["unique_graphs"] >= 1
    assert compiled["val/loss"] == pytest.approx(plain["val/loss"], abs=1e-5)
    weights = torch.load(tmp_path / "compiled" / "checkpoints" / "best.ckpt", weights_only=True)["state_dict"]
    assert not any("_orig_mod" in name for name in weights)


@pytest.fixture(scope="module")
def bpe_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    train_tokenizer("bpe", [" ".join(FORMAT_WORDS)] * 20, 300).save(str(path))
    return path


@pytest.fixture(scope="module")
def pairs_csv(tmp_path_factory):
    rng = random.Random(0)
    lines = ["a,b,label"] + [f"{' '.join(rng.sample(FORMAT_WORDS, 3))},{' '.join(rng.sample(FORMAT_WORDS, 4))},"
                             f"{['x', 'y'][i % 2]}" for i in range(40)]
    path = tmp_path_factory.mktemp("pairs") / "pairs.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("format, sequences", [("classification", 1), ("entailment", 1), ("similarity", 2)])
def test_gpt1_input_formats(bpe_path, pairs_csv, format, sequences):
    columns = {"text_a": "a", "text_b": None if format == "classification" else "b", "label": "label"}
    dm = GPTClassificationDataModule("local", str(bpe_path), format=format, max_len=12, batch_size=8,
                                     local_path=str(pairs_csv), columns=columns)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[:2] == (8, sequences) and batch["input_ids"].shape[2] <= 12
    p = dm.preprocessor
    example = dm.features["train"][0]["sequences"]
    for sequence in example:
        assert sequence[0] == p.start_id and sequence[-1] == p.extract_id and len(sequence) <= 12
        assert sequence.count(p.delimiter_id) == (0 if format == "classification" else 1)
    if format == "similarity":  # both orders
        a, b = (example[0][1:-1][:example[0].index(p.delimiter_id) - 1], example[0][example[0].index(p.delimiter_id) + 1:-1])
        assert example[1] == [p.start_id, *b, p.delimiter_id, *a, p.extract_id]
    rows, columns_ = torch.arange(8)[:, None], torch.arange(sequences)[None, :]
    assert (batch["input_ids"][rows, columns_, batch["last"]] == p.extract_id).all()
    # the LM targets are the next tokens, nothing after the extract token
    ids, labels, last = batch["input_ids"][0, 0], batch["lm_labels"][0, 0], int(batch["last"][0, 0])
    assert torch.equal(labels[:last], ids[1:last + 1]) and (labels[last:] == -100).all()
    assert dm.model_kwargs()["combine"] == {"classification": "single", "entailment": "single", "similarity": "sum"}[format]


def test_multiple_choice_scores_every_answer(bpe_path, tmp_path):
    rows = [{"context": "the film was", "choices": ["good", "bad", "a plot"], "label": i % 3} for i in range(30)]
    path = tmp_path / "choices.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    dm = GPTClassificationDataModule("local", str(bpe_path), format="multiple_choice", local_path=str(path),
                                     batch_size=4)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[:2] == (4, 3) and dm.preprocessor.labels == ["0", "1", "2"]
    model = GPTForSequenceClassification(GPTClassifierConfig(vocab_size=dm.preprocessor.tokenizer.get_vocab_size(), n_layers=1,
                                                             d_model=32, n_heads=2, **{k: v for k, v in dm.model_kwargs().items() if k != "vocab_size"}))
    out = model(batch["input_ids"], batch["last"])
    assert out.logits.shape == (4, 3) and out.lm_logits.shape[:3] == batch["input_ids"].shape
    path.write_text('{"context": "x", "choices": ["a"], "label": 3}\n')
    with pytest.raises(DataError, match=r"choices.jsonl:1: label 3"):
        GPTClassificationDataModule("local", str(bpe_path), format="multiple_choice", local_path=str(path))


def test_wordpiece_tokenizer_is_refused_for_gpt(tmp_path):
    path = tmp_path / "wp.json"
    train_tokenizer("wordpiece", ["some text here"] * 3, 100).save(str(path))
    with pytest.raises(DataError, match="lacks GPT's special tokens"):
        GPTClassificationDataModule("sentiment", str(path))


def test_gpt_fine_tuning_learns_and_the_lm_loss_is_optional(bpe_path, tmp_path):
    """A task that needs the text: the label is the polarity word somewhere in the sentence."""
    rng = random.Random(0)
    lines = ["review,label"]
    for i in range(200):
        label = ["neg", "pos"][i % 2]
        words = rng.sample(FORMAT_WORDS[2:], 5)
        words.insert(rng.randrange(6), "good" if label == "pos" else "bad")
        lines.append(f"{' '.join(words)},{label}")
    (tmp_path / "reviews.csv").write_text("\n".join(lines) + "\n")
    L.seed_everything(0)
    dm = GPTClassificationDataModule("local", str(bpe_path), max_len=16, batch_size=16,
                                     local_path=str(tmp_path / "reviews.csv"),
                                     columns={"text_a": "review", "text_b": None, "label": "label"})
    config = GPTClassifierConfig(n_layers=1, d_model=64, n_heads=2, max_len=16, dropout=0.0, **dm.model_kwargs())
    task = GPTClassificationTask(config.to_dict(), dm.preprocessor.to_state(), lm_weight=0.5, lr=3e-3)
    trainer = L.Trainer(max_epochs=8, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, num_sanity_val_steps=0)
    trainer.fit(task, dm)
    assert "train/aux_loss_epoch" in trainer.callback_metrics
    assert trainer.test(task, dm, verbose=False)[0]["test/acc"] >= 0.9
    dm.setup()
    batch = dm.preprocessor.collate(dm.features["train"][:4])
    silent = GPTClassificationTask(config.to_dict(), dm.preprocessor.to_state(), lm_weight=0.0).train()
    assert silent.classify(batch)[1] is None and task.train().classify(batch)[1] > 0


def test_attention_cache_appends_keys_and_values():
    attention = MultiHeadAttention(16, 2).eval()
    from transformer_lab.models.attention import KVCache

    cache = KVCache()
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        full, _ = attention(x, is_causal=True)
        first, _ = attention(x[:, :3], is_causal=True, cache=cache)
        rest, _ = attention(x[:, 3:], is_causal=True, cache=cache)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, atol=1e-6, rtol=0)
