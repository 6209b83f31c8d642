import math

import pytest
import torch

from transformer_lab.models import attention_fast
from transformer_lab.models.attention import KVCache, MultiHeadAttention
from transformer_lab.models.positional import RotaryEmbedding

torch.manual_seed(0)


def naive_attention(attn: MultiHeadAttention, x: torch.Tensor, key_padding_mask=None, causal=False):
    """softmax(Q K^T / sqrt(d_k)) V, one head at a time, straight from the weights."""
    d_head, heads = attn.d_head, []
    length = x.shape[1]
    for h in range(attn.n_heads):
        rows = slice(h * d_head, (h + 1) * d_head)
        q = x @ attn.q.weight[rows].T + attn.q.bias[rows]
        k = x @ attn.k.weight[rows].T + attn.k.bias[rows]
        v = x @ attn.v.weight[rows].T + attn.v.bias[rows]
        scores = q @ k.transpose(1, 2) / math.sqrt(d_head)
        if key_padding_mask is not None:
            scores = scores.masked_fill(~key_padding_mask[:, None, :], float("-inf"))
        if causal:
            scores = scores.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v)
    return attn.out(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("n_heads", [1, 2, 4])
def test_matches_naive_attention_per_head(n_heads):
    attn = MultiHeadAttention(16, n_heads).eval()
    x = torch.randn(3, 7, 16)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 5:] = False
    mask[2, 2:] = False
    fused, _ = attn(x, key_padding_mask=mask)
    explicit, weights = attn(x, key_padding_mask=mask, return_weights=True)
    attn.fast_path = False
    reading, _ = attn(x, key_padding_mask=mask)
    expected = naive_attention(attn, x, mask)
    real = mask[:, :, None]
    torch.testing.assert_close(fused * real, expected * real, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(explicit * real, expected * real, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(reading * real, expected * real, atol=1e-5, rtol=1e-5)
    assert weights.shape == (3, n_heads, 7, 7)


def test_padded_keys_get_zero_weight_and_do_not_leak():
    attn = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 6, 16)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    out, weights = attn(x, key_padding_mask=mask, return_weights=True)
    assert torch.all(weights[0, :, :, 4:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 6))
    changed = x.clone()
    changed[0, 4:] = torch.randn(2, 16) * 100  # whatever sits in the padding
    out_changed, _ = attn(changed, key_padding_mask=mask)
    torch.testing.assert_close(out[0, :4], out_changed[0, :4])


def test_causal_mask_blocks_the_future():
    attn = MultiHeadAttention(16, 2).eval()
    x = torch.randn(1, 8, 16)
    out, _ = attn(x, is_causal=True)
    torch.testing.assert_close(out, naive_attention(attn, x, causal=True), atol=1e-5, rtol=1e-5)
    changed = x.clone()
    changed[0, 5:] = torch.randn(3, 16)
    out_changed, _ = attn(changed, is_causal=True)
    torch.testing.assert_close(out[0, :5], out_changed[0, :5])
    assert not torch.allclose(out[0, 5:], out_changed[0, 5:])


def test_heads_have_independent_parameters():
    attn = MultiHeadAttention(16, 4).eval()
    with torch.no_grad():  # expose the per-head outputs directly
        attn.out.weight.copy_(torch.eye(16))
        attn.out.bias.zero_()
    x = torch.randn(2, 5, 16)
    before, _ = attn(x)
    with torch.no_grad():  # change only head 1's query, key and value projections
        for proj in (attn.q, attn.k, attn.v):
            proj.weight[4:8] += torch.randn(4, 16)
    after, _ = attn(x)
    torch.testing.assert_close(before[..., :4], after[..., :4])
    torch.testing.assert_close(before[..., 8:], after[..., 8:])
    assert not torch.allclose(before[..., 4:8], after[..., 4:8])


def test_d_model_must_split_into_heads():
    with pytest.raises(ValueError, match="not divisible"):
        MultiHeadAttention(10, 3)


def test_options_after_the_input_are_keyword_only():
    """A positional mask would silently become another option once one is inserted before it."""
    from transformer_lab.models.blocks import TransformerBlock

    x, mask = torch.randn(1, 4, 16), torch.ones(1, 4, dtype=torch.bool)
    with pytest.raises(TypeError):
        MultiHeadAttention(16, 2)(x, mask)
    with pytest.raises(TypeError):
        TransformerBlock(16, 2, 32)(x, mask)
    with pytest.raises(TypeError):  # the block's options after its three sizes, too
        TransformerBlock(16, 2, 32, 0.0)


def test_an_all_real_padding_mask_is_left_out_with_the_same_result():
    attn = MultiHeadAttention(16, 4, dropout=0.1).train()
    x = torch.randn(3, 7, 16)
    outputs = []
    for mask in (None, torch.ones(3, 7, dtype=torch.bool), torch.ones(3, 7, dtype=torch.long)):
        torch.manual_seed(5)  # the same dropout draws
        outputs.append(attn(x, key_padding_mask=mask)[0])
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)
    torch.testing.assert_close(outputs[2], outputs[0], rtol=0, atol=0)
    padded = torch.ones(3, 7, dtype=torch.bool)
    padded[0, -1] = False
    torch.manual_seed(5)
    assert not torch.equal(attn(x, key_padding_mask=padded)[0][0], outputs[0][0])  # a real mask still masks


@pytest.mark.parametrize("norm_first", [False, True])
def test_a_block_computes_chosen_rows_alone_with_keys_from_the_whole_sequence(norm_first):
    from transformer_lab.models.blocks import TransformerBlock

    block = TransformerBlock(16, 4, 32, dropout=0.0, activation="gelu", norm_first=norm_first)
    x = torch.randn(2, 9, 16, requires_grad=True)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    rows = torch.tensor([[0, 2, 5], [0, 1, 1]])  # a repeated row is computed twice, alike
    full = block(x, key_padding_mask=mask)[0]
    expected = full.gather(1, rows[..., None].expand(-1, -1, 16))
    chosen = block(x.gather(1, rows[..., None].expand(-1, -1, 16)), key_padding_mask=mask, keys_from=x)[0]
    torch.testing.assert_close(chosen, expected, rtol=0, atol=1e-6)
    (grad_full,) = torch.autograd.grad(expected.sum(), x)
    (grad_chosen,) = torch.autograd.grad(chosen.sum(), x)
    torch.testing.assert_close(grad_chosen, grad_full, rtol=0, atol=1e-5)  # the keys' gradient reaches every position


@pytest.mark.parametrize("masks", ["causal", "causal+padding", "shared", "per_row", "per_head", "per_key_column"])
def test_masks_added_inside_the_product_match_the_fused_kernel(masks):
    """The explicit path adds each mask to the scores as a 0/-inf bias inside their product; outputs and
    gradients equal the fused kernel's, whatever the mask's broadcast shape."""
    attn = MultiHeadAttention(16, 4).eval()
    x = torch.randn(3, 6, 16)
    padding = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    shapes = {"shared": (6, 6), "per_row": (3, 1, 6, 6), "per_head": (3, 4, 6, 6), "per_key_column": (3, 1, 1, 6)}
    options = {"is_causal": "causal" in masks, "key_padding_mask": padding if "padding" in masks else None}
    if masks in shapes:
        attn_mask = torch.rand(shapes[masks]) > 0.4
        attn_mask[..., 0] = True  # every query sees a key: no row is all -inf
        options["attn_mask"] = attn_mask
    results = []
    for return_weights in (True, False):  # the explicit path, then the fused kernel
        x_copy = x.clone().requires_grad_()
        out, _ = attn(x_copy, return_weights=return_weights, **options)
        out.square().sum().backward()
        results.append((out, x_copy.grad, attn.q.weight.grad.clone()))
        attn.zero_grad()
    for explicit, fused in zip(*results):
        torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length", [64, 65])
@pytest.mark.parametrize("padded", [False, True])
def test_causal_halves_give_the_whole_products_output_and_gradients(length, padded):
    """Training's causal attention computes its first half of queries against the first half of keys
    only; the output and every gradient equal the whole product's."""
    attn = MultiHeadAttention(16, 4)
    x = torch.randn(2, length, 16)
    mask = torch.ones(length, length, dtype=torch.bool).tril()
    if padded:
        padding = torch.ones(2, length, dtype=torch.bool)
        padding[1, -5:] = False
        mask = padding[:, None, None, :] & mask
    results = []
    for causal_halves in (True, False):
        x_copy = x.clone().requires_grad_()
        q, k, v = (attn._split_heads(part) for part in attention_fast.project_qkv(attn, x_copy))
        out, weights = attention_fast.explicit_attention(attn, q, k, v, mask, 0.0, causal_halves=causal_halves)
        assert (weights is None) == causal_halves
        out.square().sum().backward()
        results.append((out, x_copy.grad, attn.k.weight.grad.clone()))
        attn.zero_grad()
    for halves, whole in zip(*results):
        torch.testing.assert_close(halves, whole, atol=1e-5, rtol=1e-5)


def test_the_causal_halves_benchmark_times_both_ways_and_restores_the_limit(tmp_path, monkeypatch):
    import json
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    sys.modules.pop("causal_halves", None)
    import causal_halves

    out = tmp_path / "halves.json"
    assert causal_halves.main(["--out", str(out), "--lengths", "8,64", "--tokens", "128", "--width", "16",
                               "--iterations", "2", "--warmup", "1"]) == 0
    result = json.loads(out.read_text())
    for length in (8, 64):
        assert result[f"{length}_whole_ms"] > 0 and result[f"{length}_halves_ms"] > 0
        assert result[f"{length}_halves_speedup"] == pytest.approx(
            result[f"{length}_whole_ms"] / result[f"{length}_halves_ms"], rel=0.01)
    assert attention_fast.CAUSAL_HALVES_MIN_LENGTH == 64  # the module's own limit, back after the timing


# ------------------------------------------------------------------ the reading path and the fast path
def run_both_paths(attn: MultiHeadAttention, inputs: dict[str, torch.Tensor], options: dict, *, steps: int = 1):
    """Outputs, weights and gradients (the inputs' and the parameters') of the fast path and of the
    reading path. inputs: the leaves x (and context for cross-attention); options: forward's other
    arguments. steps > 1: x's first positions in one call, then one position a call, through a KV cache."""
    results = {}
    for fast in (True, False):
        attn.fast_path = fast  # this instance only: the class default stays as it is
        leaves = {name: t.clone().requires_grad_() for name, t in inputs.items()}
        x, context = leaves["x"], leaves.get("context")
        pieces = x.split([x.shape[1] - steps + 1] + [1] * (steps - 1), dim=1)
        cache = KVCache() if steps > 1 else None
        outs, weights = zip(*(attn(piece, context=context, cache=cache, **options) for piece in pieces))
        out = torch.cat(outs, dim=1)
        out.square().sum().backward()
        grads = [leaf.grad for leaf in leaves.values()] + [p.grad.clone() for p in attn.parameters()]
        attn.zero_grad()
        results[fast] = (out, weights, grads)
    del attn.fast_path
    return results[True], results[False]


def assert_paths_equal(fast, reading):
    (fast_out, fast_weights, fast_grads), (reading_out, reading_weights, reading_grads) = fast, reading
    tight = {"rtol": 1e-10, "atol": 1e-12}  # in float64: far below any real difference in what is computed
    torch.testing.assert_close(reading_out, fast_out, **tight)
    for r, f in zip(reading_weights, fast_weights, strict=True):
        assert (r is None) == (f is None)
        if r is not None:
            torch.testing.assert_close(r, f, **tight)
    for r, f in zip(reading_grads, fast_grads, strict=True):
        torch.testing.assert_close(r, f, **tight)


CASES = ["plain", "padding", "all_real_padding", "causal", "causal_long", "causal+padding", "attn_mask",
         "causal+attn_mask", "rotary", "cross", "cross+padding"]


@pytest.mark.parametrize("return_weights", [False, True])
@pytest.mark.parametrize("training", [False, True])  # training with dropout 0: the fast path's fused projection
@pytest.mark.parametrize("case", CASES)
def test_the_reading_path_equals_the_fast_path(case, training, return_weights):
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, dropout=0.0).double().train(training)
    length = 70 if case == "causal_long" else 7  # 70: the fused kernel's own causal mask
    inputs = {"x": torch.randn(3, length, 16, dtype=torch.float64)}
    options = {"return_weights": return_weights, "is_causal": case.startswith("causal") or case == "rotary"}
    keys = length
    if case.startswith("cross"):
        keys = 5
        inputs["context"] = torch.randn(3, keys, 16, dtype=torch.float64)
    if "padding" in case:
        padding = torch.ones(3, keys, dtype=torch.bool)
        if case != "all_real_padding":
            padding[1, -2:] = False
            padding[2, 1:] = False
        options["key_padding_mask"] = padding
    if "attn_mask" in case:
        attn_mask = torch.rand(3, 4, length, keys) > 0.4
        attn_mask[..., 0] = True  # every query sees a key
        options["attn_mask"] = attn_mask
    if case == "rotary":
        options["rotary"] = RotaryEmbedding(4)
    assert_paths_equal(*run_both_paths(attn, inputs, options))


@pytest.mark.parametrize("rotary", [False, True])
def test_the_reading_path_equals_the_fast_path_decoding_with_a_cache(rotary):
    """A prefix of 5 positions, then one position a call, through a KV cache: every step's output and
    the gradients through the cached keys and values agree; and equal one whole causal call."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4).double().eval()
    options = {"is_causal": True, "rotary": RotaryEmbedding(4) if rotary else None}
    inputs = {"x": torch.randn(2, 9, 16, dtype=torch.float64)}
    fast, reading = run_both_paths(attn, inputs, options, steps=5)
    assert_paths_equal(fast, reading)
    whole, _ = run_both_paths(attn, inputs, options)
    torch.testing.assert_close(reading[0], whole[0], rtol=1e-10, atol=1e-12)


def test_the_reading_path_equals_the_fast_path_for_cross_attention_with_a_cache():
    """A decoder's cross-attention: the context's keys and values computed on the first call, reused after."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4).double().eval()
    padding = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    inputs = {"x": torch.randn(2, 6, 16, dtype=torch.float64), "context": torch.randn(2, 6, 16, dtype=torch.float64)}
    assert_paths_equal(*run_both_paths(attn, inputs, {"key_padding_mask": padding}, steps=4))


def test_the_switch_picks_the_path_for_every_model_at_once(monkeypatch):
    """MultiHeadAttention.fast_path (the class attribute) decides: True runs attention_fast.forward, False
    never touches it. A whole model gives the same logits either way."""
    from transformer_lab.models.gpt import GPTConfig, GPTLMHeadModel

    fast_calls = []
    fast_forward = attention_fast.forward

    def spy(*args, **kwargs):
        fast_calls.append(1)
        return fast_forward(*args, **kwargs)

    monkeypatch.setattr(attention_fast, "forward", spy)
    torch.manual_seed(0)
    model = GPTLMHeadModel(GPTConfig(vocab_size=30, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=16)).eval()
    ids = torch.randint(0, 30, (2, 10))
    assert MultiHeadAttention.fast_path is True  # the default: the path every recorded score came from
    with torch.no_grad():
        fast = model(ids).logits
    assert len(fast_calls) == 2  # one call per layer
    monkeypatch.setattr(MultiHeadAttention, "fast_path", False)
    with torch.no_grad():
        reading = model(ids).logits
    assert len(fast_calls) == 2  # the reading path ran
    torch.testing.assert_close(reading, fast, rtol=1e-5, atol=1e-5)


def test_the_reading_path_draws_torchs_dropout_on_the_weights():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, dropout=0.5).train()
    attn.fast_path = False
    x = torch.randn(2, 6, 16)
    torch.manual_seed(3)
    first, _ = attn(x)
    torch.manual_seed(3)
    assert torch.equal(attn(x)[0], first)  # repeatable by the seed
    assert not torch.allclose(attn.eval()(x)[0], first)  # and it does drop


def test_state_dict_names_are_those_checkpoints_and_weight_conversion_rely_on():
    from transformer_lab.models.blocks import TransformerBlock

    assert list(MultiHeadAttention(16, 4).state_dict()) == [
        f"{role}.{kind}" for role in ("q", "k", "v", "out") for kind in ("weight", "bias")]
    block = TransformerBlock(16, 4, 32, cross_attention=True)
    assert {name for name in block.state_dict() if "attn" in name} == {
        f"{layer}.{role}.{kind}" for layer in ("attn", "cross_attn") for role in ("q", "k", "v", "out")
        for kind in ("weight", "bias")}
