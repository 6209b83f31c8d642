"""The cheap CPU dropout masks: the rate, the scale, the gradient and the seed behave like
torch's dropout, and every model's blocks use them unless a config says otherwise."""

import pytest
import torch
from torch import nn

from transformer_lab.models.attention import MultiHeadAttention
from transformer_lab.models.dropout import Dropout, dropout, keep_mask
from transformer_lab.models.gpt import GPTConfig, GPTLMHeadModel


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_mask_drops_at_the_asked_rate(p):
    torch.manual_seed(0)
    keep, scale = keep_mask((1000, 1000), p, torch.device("cpu"))
    assert keep.dtype == torch.bool and keep.shape == (1000, 1000)
    # 1e6 Bernoulli draws: the standard error of the kept share is below 5e-4
    assert keep.float().mean().item() == pytest.approx(1 - p, abs=2e-3)
    assert scale == pytest.approx(1 / (1 - p), rel=1e-4)
    # no stripes: every one of the four 16-bit slices of a draw keeps at the same rate
    by_slice = keep.flatten()[: 4 * 250_000].view(-1, 4).float().mean(0)
    assert torch.allclose(by_slice, torch.full((4,), 1 - p), atol=4e-3)


def test_float_masks_are_the_boolean_ones():
    torch.manual_seed(7)
    as_bool, scale = keep_mask((5, 77), 0.3, torch.device("cpu"))
    torch.manual_seed(7)
    as_float, same_scale = keep_mask((5, 77), 0.3, torch.device("cpu"), torch.float32)
    assert as_float.dtype == torch.float32 and torch.equal(as_float, as_bool.float()) and scale == same_scale


def test_bf16_is_dropped_and_scaled_like_fp32():
    x = torch.randn(50, 40)
    torch.manual_seed(2)
    expected = dropout(x, 0.1)
    torch.manual_seed(2)
    low = dropout(x.bfloat16(), 0.1)
    assert low.dtype == torch.bfloat16
    assert torch.equal(low == 0, expected == 0)
    assert torch.allclose(low.float(), expected, rtol=1e-2, atol=1e-2)


def test_odd_sizes_and_expected_value():
    torch.manual_seed(0)
    x = torch.ones(3, 7, 5)  # 105 elements: not a multiple of the four masks per draw
    y = dropout(x, 0.3)
    assert y.shape == x.shape
    kept = y != 0
    assert torch.allclose(y[kept], torch.full_like(y[kept], 65536 / (65536 - round(65536 * 0.3))))
    means = torch.stack([dropout(torch.ones(100_000), 0.3).mean() for _ in range(5)])
    assert means.mean().item() == pytest.approx(1.0, abs=5e-3)  # the scale keeps the expected value


def test_gradient_is_masked_and_scaled_like_the_output():
    torch.manual_seed(1)
    x = torch.randn(64, 33, requires_grad=True)
    y = dropout(x, 0.2)
    upstream = torch.randn_like(y)
    y.backward(upstream)
    kept = y.detach() != 0
    scale = 65536 / (65536 - round(65536 * 0.2))
    assert torch.allclose(y.detach(), x.detach() * kept * scale)
    assert torch.allclose(x.grad, upstream * kept * scale)


def test_seeded_repeatable_and_off_in_eval():
    layer = Dropout(0.5)
    x = torch.randn(4, 100)
    torch.manual_seed(3)
    first = layer(x)
    torch.manual_seed(3)
    assert torch.equal(layer(x), first)
    assert not torch.equal(layer(x), first)  # the generator moved on: a new mask
    layer.eval()
    assert layer(x) is x
    assert Dropout(0.5).state_dict() == nn.Dropout(0.5).state_dict() == {}


def test_fast_false_is_torchs_own_stream():
    x = torch.randn(8, 50)
    torch.manual_seed(5)
    ours = Dropout(0.25, fast=False)(x)
    torch.manual_seed(5)
    assert torch.equal(ours, nn.functional.dropout(x, 0.25))


def test_attention_with_cheap_masks_matches_torchs_in_eval_and_drops_in_training():
    torch.manual_seed(0)
    fast = MultiHeadAttention(32, 4, dropout=0.3)
    slow = MultiHeadAttention(32, 4, dropout=0.3, fast_dropout=False)
    slow.load_state_dict(fast.state_dict())
    x = torch.randn(2, 9, 32)
    padding = torch.ones(2, 9, dtype=torch.bool)
    padding[1, 6:] = False
    fast.eval(), slow.eval()
    for causal in (False, True):
        a, _ = fast(x, key_padding_mask=padding, is_causal=causal)
        b, _ = slow(x, key_padding_mask=padding, is_causal=causal)
        assert torch.allclose(a, b, atol=1e-6)
    fast.train()
    # causal with dropout: position 0 attends only to itself, so its output is either the value
    # of token 0 scaled up, or (dropped) the output bias alone
    out, _ = fast(x, is_causal=True)
    values = fast.v(x)[:, 0].view(2, 4, 8)
    first = (out[:, 0] - fast.out.bias) @ torch.linalg.pinv(fast.out.weight).T
    per_head = first.view(2, 4, 8)
    scale = 65536 / (65536 - round(65536 * 0.3))
    for b in range(2):
        for h in range(4):
            dropped = torch.allclose(per_head[b, h], torch.zeros(8), atol=1e-4)
            assert dropped or torch.allclose(per_head[b, h], values[b, h] * scale, atol=1e-4)


def test_models_use_the_config_choice():
    fast = GPTLMHeadModel(GPTConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=8))
    slow = GPTLMHeadModel(GPTConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=8, fast_dropout=False))
    assert {m.fast for m in fast.modules() if isinstance(m, Dropout)} == {True}
    assert {m.fast for m in slow.modules() if isinstance(m, Dropout)} == {False}
    assert all(m.fast_dropout is False for m in slow.modules() if isinstance(m, MultiHeadAttention))
    assert fast.state_dict().keys() == slow.state_dict().keys()
