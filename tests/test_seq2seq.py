"""The encoder-decoder Transformer: cross-attention against a naive reference, masks,
causality, decoding (cache, beam search) and parity with `transformers`' MarianMTModel."""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lab.models.attention import KVCache, MultiHeadAttention
from transformer_lab.models.blocks import TransformerBlock
from transformer_lab.models.seq2seq import (
    SIZES,
    Seq2SeqConfig,
    TransformerSeq2Seq,
    config_from_hf,
    from_hf_state_dict,
    to_hf_state_dict,
)


def tiny(**overrides) -> TransformerSeq2Seq:
    torch.manual_seed(0)
    options = dict(vocab_size=40, n_encoder_layers=2, n_decoder_layers=2, d_model=32, n_heads=4, d_ff=64,
                   max_len=48, dropout=0.0)
    return TransformerSeq2Seq(Seq2SeqConfig(**{**options, **overrides})).eval()


def naive_cross_attention(attn: MultiHeadAttention, queries_from, keys_from, source_mask):
    """softmax(Q K^T / sqrt(d)) V per head: Q from the decoder's states, K and V from the encoder's."""
    heads = []
    for h in range(attn.n_heads):
        rows = slice(h * attn.d_head, (h + 1) * attn.d_head)
        q = queries_from @ attn.q.weight[rows].T + attn.q.bias[rows]
        k = keys_from @ attn.k.weight[rows].T + attn.k.bias[rows]
        v = keys_from @ attn.v.weight[rows].T + attn.v.bias[rows]
        scores = (q @ k.transpose(1, 2) / math.sqrt(attn.d_head)).masked_fill(~source_mask[:, None, :], -math.inf)
        heads.append(scores.softmax(-1) @ v)
    return attn.out(torch.cat(heads, dim=-1))


def test_cross_attention_matches_the_naive_formula_and_ignores_source_padding():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4).eval()
    decoder_states, encoder_states = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    source_mask = torch.ones(2, 7, dtype=torch.bool)
    source_mask[1, 4:] = False
    expected = naive_cross_attention(attn, decoder_states, encoder_states, source_mask)
    fused, _ = attn(decoder_states, context=encoder_states, key_padding_mask=source_mask)
    explicit, weights = attn(decoder_states, context=encoder_states, key_padding_mask=source_mask,
                             return_weights=True)
    torch.testing.assert_close(fused, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(explicit, expected, atol=1e-5, rtol=1e-5)
    assert weights.shape == (2, 4, 5, 7)
    assert torch.all(weights[1, :, :, 4:] == 0)  # padded source positions get no weight
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))
    noisy = encoder_states.clone()
    noisy[1, 4:] = 100 * torch.randn(3, 16)  # whatever sits in the padding does not reach the output
    torch.testing.assert_close(attn(decoder_states, context=noisy, key_padding_mask=source_mask)[0], fused)


def test_cross_attention_cache_computes_the_source_once():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2).eval()
    memory, cache = torch.randn(1, 6, 16), KVCache()
    first, _ = attn(torch.randn(1, 1, 16), context=memory, cache=cache)
    keys = cache.keys
    query = torch.randn(1, 1, 16)
    with_cache, _ = attn(query, context=memory, cache=cache)
    assert cache.keys is keys and cache.length == 6  # reused, not appended to
    torch.testing.assert_close(with_cache, attn(query, context=memory)[0])


def test_a_block_refuses_a_context_it_has_no_cross_attention_for():
    with pytest.raises(ValueError, match="context"):
        TransformerBlock(16, 2, 32)(torch.randn(1, 3, 16), context=torch.randn(1, 4, 16))
    with pytest.raises(ValueError, match="context"):
        TransformerBlock(16, 2, 32, cross_attention=True)(torch.randn(1, 3, 16))


@pytest.mark.parametrize("norm_first", [False, True])
def test_a_later_target_token_never_changes_an_earlier_position(norm_first):
    model = tiny(norm_first=norm_first)
    source = torch.randint(3, 40, (2, 9))
    target = torch.randint(3, 40, (2, 8))
    changed = target.clone()
    changed[:, 5:] = torch.randint(3, 40, (2, 3))
    before, after = model(source, target).logits, model(source, changed).logits
    torch.testing.assert_close(before[:, :5], after[:, :5])
    assert not torch.allclose(before[:, 5:], after[:, 5:])


def test_source_padding_does_not_reach_the_translation():
    model = tiny()
    source = torch.randint(3, 40, (1, 6))
    padded = torch.cat([source, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    target = torch.randint(3, 40, (1, 5))
    torch.testing.assert_close(model(source, target).logits, model(padded, target).logits, atol=1e-5, rtol=1e-5)


def test_attention_weights_come_back_per_layer():
    model = tiny()
    out = model(torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 5)), return_weights=True)
    assert [w.shape for w in out.encoder_attentions] == [(2, 4, 7, 7)] * 2
    assert [w.shape for w in out.attentions] == [(2, 4, 5, 5)] * 2
    assert [w.shape for w in out.cross_attentions] == [(2, 4, 5, 7)] * 2
    assert out.logits.shape == (2, 5, 40) and out.encoder_hidden_states.shape == (2, 7, 32)


def test_tied_embeddings_are_one_parameter_and_untied_are_three():
    tied, untied = tiny(), tiny(tie_embeddings=False)
    assert tied.lm_head.weight is tied.source_embedding.weight is tied.target_embedding.weight
    assert len({id(untied.lm_head.weight), id(untied.source_embedding.weight),
                id(untied.target_embedding.weight)}) == 3


def test_named_sizes_are_the_papers():
    base, big = Seq2SeqConfig(size="base"), Seq2SeqConfig(size="big")
    assert (base.n_encoder_layers, base.n_decoder_layers, base.d_model, base.n_heads, base.d_ff) == (6, 6, 512, 8, 2048)
    assert (big.d_model, big.n_heads, big.d_ff) == (1024, 16, 4096)
    assert set(SIZES) >= {"tiny", "base", "big"}
    with pytest.raises(ValueError, match="size"):
        Seq2SeqConfig(size="huge")


def test_cached_and_uncached_decoding_give_identical_tokens():
    model = tiny()
    source = torch.randint(3, 40, (3, 8))
    source[1, 5:] = 0
    greedy = model.generate(source, 20)
    torch.testing.assert_close(greedy, model.generate(source, 20, use_cache=False), rtol=0, atol=0)
    beams = model.generate(source, 20, num_beams=3)
    torch.testing.assert_close(beams, model.generate(source, 20, num_beams=3, use_cache=False), rtol=0, atol=0)


def test_beam_size_one_is_greedy():
    model = tiny()
    source = torch.randint(3, 40, (4, 8))
    greedy = model.generate(source, 16)
    beam = model._beam_search(source, 16, num_beams=1, length_penalty=1.0, use_cache=True)
    torch.testing.assert_close(beam, greedy, rtol=0, atol=0)


def sequence_log_prob(model, source, tokens, pad_id=0):
    """sum log p(tokens | source) under teacher forcing, up to and including the end token, over
    the tokens decoding may choose (padding and start token excluded, as in `generate`)."""
    start = torch.full((len(tokens), 1), model.config.bos_id)
    logits = model(source, torch.cat([start, tokens[:, :-1]], dim=1)).logits
    logits[..., [model.config.pad_id, model.config.bos_id]] = -math.inf
    log_probs = F.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
    return log_probs.masked_fill(tokens == pad_id, 0.0).sum(-1)


def test_beam_search_finds_translations_at_least_as_likely_as_greedy():
    # a small vocabulary and untied embeddings: the random model ends its translations often
    model = tiny(vocab_size=8, tie_embeddings=False)
    source = torch.randint(3, 8, (12, 8))
    greedy = model.generate(source, 12)
    beam = model.generate(source, 12, num_beams=5, length_penalty=0.0)  # no length penalty: plain log p
    ended = (greedy == model.config.eos_id).any(1) & (beam == model.config.eos_id).any(1)
    assert ended.sum() >= 3
    with torch.no_grad():
        greedy_score = sequence_log_prob(model, source[ended], greedy[ended])
        beam_score = sequence_log_prob(model, source[ended], beam[ended])
    assert torch.all(beam_score >= greedy_score - 1e-4)
    assert torch.any(beam_score > greedy_score + 1e-3)  # and it does search: somewhere it beats greedy


def test_teacher_forced_loss_falls_and_the_model_learns_to_copy():
    """The copy task: the target is the source. A working encoder-decoder learns it in a few
    hundred steps; a broken cross-attention cannot (the decoder never sees the source)."""
    model = tiny(vocab_size=16, d_model=64, d_ff=128, n_heads=4, max_len=16).train()
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(250):
        source = torch.randint(3, 16, (32, 6), generator=generator)
        target = torch.cat([source, torch.full((32, 1), 2)], dim=1)  # then the end token
        decoder_input = torch.cat([torch.full((32, 1), 1), target[:, :-1]], dim=1)
        loss = F.cross_entropy(model(source, decoder_input).logits.flatten(0, 1), target.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-20:]) / 20 < 0.2 * sum(losses[:20]) / 20
    model.eval()
    source = torch.randint(3, 16, (8, 6), generator=generator)
    decoded = model.generate(source, 10)
    assert (decoded[:, :6] == source).float().mean() > 0.9


@pytest.fixture(scope="module")
def marian():
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(vocab_size=61, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                          max_position_embeddings=64, activation_function="relu", pad_token_id=0, eos_token_id=2,
                          decoder_start_token_id=0, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    torch.manual_seed(0)
    reference = MarianMTModel(config).eval()
    with torch.no_grad():  # weights of unit scale: the default 0.02 would leave every logit near zero
        for name, parameter in reference.named_parameters():
            if "embed_positions" not in name:
                parameter.normal_(0, 0.3)
    return reference


def test_same_logits_as_transformers_marian(marian):
    model = TransformerSeq2Seq(config_from_hf(marian.config)).eval()
    model.load_state_dict(from_hf_state_dict(marian.state_dict()))
    torch.manual_seed(1)
    source = torch.randint(3, 61, (3, 9))
    source[1, 6:] = 0  # padded source
    target = torch.randint(3, 61, (3, 7))
    target[:, 0] = marian.config.decoder_start_token_id
    with torch.no_grad():
        expected = marian(input_ids=source, attention_mask=(source != 0).long(), decoder_input_ids=target).logits
        ours = model(source, target).logits
    assert expected.abs().mean() > 0.1
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    # and back: our weights in a fresh Marian give the same logits again
    from transformers import MarianMTModel

    again = MarianMTModel(marian.config).eval()
    again.load_state_dict(to_hf_state_dict(model.state_dict(), max_len=model.config.max_len))
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=source, attention_mask=(source != 0).long(),
                                         decoder_input_ids=target).logits, expected, atol=1e-5, rtol=1e-5)
