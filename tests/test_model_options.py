"""The ablation options: attention with fewer projections or unscaled scores, blocks without residual
connections or LayerNorms, models without position information, BERT's mean pooling. Each checked
against a hand computation or an invariant, on both attention paths."""

import math

import pytest
import torch
from torch import nn

from transformer_lab.models.attention import PROJECTIONS, KVCache, MultiHeadAttention
from transformer_lab.models.bert import BertClassifierConfig, BertForSequenceClassification
from transformer_lab.models.blocks import TransformerBlock
from transformer_lab.models.encoder import EncoderConfig, TransformerEncoder
from transformer_lab.models.gpt import GPTConfig, GPTLMHeadModel
from transformer_lab.models.positional import RotaryEmbedding

D_MODEL, N_HEADS = 16, 4


def n_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def by_hand(x: torch.Tensor, w_q, w_k, w_v, out: nn.Linear | None, *, scaled: bool = True, mask=None,
            causal: bool = False) -> torch.Tensor:
    """Multi-head attention one head at a time: w_* are the projections (None: x itself), out the
    output projection (None: the heads side by side as they are)."""
    length = x.shape[1]
    d_head = D_MODEL // N_HEADS
    heads = []
    for h in range(N_HEADS):
        rows = slice(h * d_head, (h + 1) * d_head)
        q, k, v = ((x if w is None else w(x))[..., rows] for w in (w_q, w_k, w_v))
        scores = q @ k.transpose(1, 2)
        if scaled:
            scores = scores / math.sqrt(d_head)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        if causal:
            scores = scores.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v)
    attended = torch.cat(heads, dim=-1)
    return attended if out is None else out(attended)


# ------------------------------------------------------------------ attention: projections and scale
def test_each_choice_has_only_its_own_projections():
    linear = D_MODEL * D_MODEL + D_MODEL  # weight + bias
    counts = {"qkv": 4 * linear, "qv": 3 * linear, "kv": 3 * linear, "v": 2 * linear, "none": 0}
    for choice, count in counts.items():
        attn = MultiHeadAttention(D_MODEL, N_HEADS, projections=choice)
        assert n_parameters(attn) == count, choice
        kept = {role for role in "qkv" if getattr(attn, role) is not None}
        assert kept == set(choice) - set("none"), choice  # what it lacks is None, not created and unused
        assert (attn.out is None) == (choice == "none")
    assert n_parameters(MultiHeadAttention(D_MODEL, N_HEADS, projections="v", bias=False)) == 2 * D_MODEL**2
    assert list(MultiHeadAttention(D_MODEL, N_HEADS).state_dict()) == [  # today's names, in today's order
        f"{role}.{kind}" for role in ("q", "k", "v", "out") for kind in ("weight", "bias")]


def test_an_unknown_choice_is_refused_by_name():
    with pytest.raises(ValueError, match="projections='qk'.*qkv, qv, kv, v, none"):
        MultiHeadAttention(D_MODEL, N_HEADS, projections="qk")


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("choice, shared", [("qv", {"k": "q"}), ("kv", {"q": "k"}), ("v", {"q": "v", "k": "v"})])
def test_a_shared_projection_equals_qkv_with_the_weights_copied(choice, shared, fast_path):
    """"qv" is "qkv" whose key projection is a copy of the query one, and so on."""
    torch.manual_seed(0)
    ablated = MultiHeadAttention(D_MODEL, N_HEADS, projections=choice).eval()
    full = MultiHeadAttention(D_MODEL, N_HEADS).eval()
    with torch.no_grad():
        for role in "qkv":
            source = getattr(ablated, shared.get(role, role))
            getattr(full, role).load_state_dict(source.state_dict())
        full.out.load_state_dict(ablated.out.state_dict())
    ablated.fast_path = full.fast_path = fast_path
    x = torch.randn(3, 7, D_MODEL)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 4:] = False
    real = mask[..., None]
    for options in ({}, {"key_padding_mask": mask}, {"is_causal": True}):
        expected = full(x, **options)[0]
        got = ablated(x, **options)[0]
        if "key_padding_mask" in options:
            expected, got = expected * real, got * real
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("choice", list(PROJECTIONS))
@pytest.mark.parametrize("scaled", [True, False])
def test_each_choice_computes_the_formula_by_hand(choice, scaled, fast_path):
    torch.manual_seed(0)
    attn = MultiHeadAttention(D_MODEL, N_HEADS, projections=choice, scaled=scaled).eval()
    attn.fast_path = fast_path
    projection = {role: getattr(attn, name) if name else None for role, name in zip("qkv", PROJECTIONS[choice])}
    x = torch.randn(2, 6, D_MODEL) * 2  # scores large enough that the scale matters
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    real = mask[..., None]
    for return_weights in (False, True):  # the fused kernel, then the explicit scores
        out, _ = attn(x, key_padding_mask=mask, return_weights=return_weights)
        expected = by_hand(x, projection["q"], projection["k"], projection["v"], attn.out, scaled=scaled, mask=mask)
        torch.testing.assert_close(out * real, expected * real, rtol=1e-5, atol=1e-5)
        out, _ = attn(x, is_causal=True, return_weights=return_weights)
        expected = by_hand(x, projection["q"], projection["k"], projection["v"], attn.out, scaled=scaled, causal=True)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_unscaled_scores_are_q_k_transposed_by_hand_with_torch_softmax():
    """scaled=False: softmax(Q K^T) V, nothing divided; the weights returned are those softmax values."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, D_MODEL)
    for fast_path in (True, False):
        attn = MultiHeadAttention(D_MODEL, N_HEADS, scaled=False).eval()
        attn.fast_path = fast_path
        _, weights = attn(x, return_weights=True)
        q, k = (attn._split_heads(projection(x)) for projection in (attn.q, attn.k))
        torch.testing.assert_close(weights, torch.softmax(q @ k.transpose(-2, -1), dim=-1), rtol=1e-5, atol=1e-6)
        scaled = MultiHeadAttention(D_MODEL, N_HEADS).eval()
        scaled.load_state_dict(attn.state_dict())
        assert not torch.allclose(scaled(x, return_weights=True)[1], weights, atol=1e-3)  # the option changes them


@pytest.mark.parametrize("fast_path", [True, False])
def test_the_returned_weights_are_in_the_autograd_graph(fast_path):
    """A probe keeps the weights' gradient: they must be the softmax the output was computed from."""
    for choice in ("qkv", "none"):
        attn = MultiHeadAttention(D_MODEL, N_HEADS, projections=choice, scaled=False)
        attn.fast_path = fast_path
        x = torch.randn(2, 5, D_MODEL, requires_grad=True)  # "none" has no parameters: the graph starts at x
        out, weights = attn(x, return_weights=True)
        weights.retain_grad()
        out.square().sum().backward()
        assert weights.grad is not None and weights.grad.abs().sum() > 0


# the reading path and the fast path, outputs and gradients, as tests/test_attention.py compares them
def run_both_paths(attn: MultiHeadAttention, x: torch.Tensor, options: dict, context: torch.Tensor | None = None,
                   steps: int = 1):
    results = []
    for fast in (True, False):
        attn.fast_path = fast
        leaves = [x.clone().requires_grad_()] + ([] if context is None else [context.clone().requires_grad_()])
        pieces = leaves[0].split([x.shape[1] - steps + 1] + [1] * (steps - 1), dim=1)
        cache = KVCache() if steps > 1 else None
        outs, weights = zip(*(attn(piece, cache=cache, context=None if context is None else leaves[1], **options)
                              for piece in pieces))
        out = torch.cat(outs, dim=1)
        out.square().sum().backward()
        grads = [leaf.grad for leaf in leaves] + [p.grad.clone() for p in attn.parameters()]
        attn.zero_grad()
        results.append((out, weights, grads))
    del attn.fast_path
    (fast_out, fast_weights, fast_grads), (reading_out, reading_weights, reading_grads) = results
    tight = {"rtol": 1e-10, "atol": 1e-12}  # float64
    torch.testing.assert_close(reading_out, fast_out, **tight)
    for reading, fast in zip(reading_weights, fast_weights, strict=True):
        assert (reading is None) == (fast is None)
        if reading is not None:
            torch.testing.assert_close(reading, fast, **tight)
    for reading, fast in zip(reading_grads, fast_grads, strict=True):
        torch.testing.assert_close(reading, fast, **tight)


@pytest.mark.parametrize("return_weights", [False, True])
@pytest.mark.parametrize("training", [False, True])  # training: where "qkv" fuses its three projections
@pytest.mark.parametrize("case", ["plain", "padding", "causal", "causal+padding", "rotary"])
@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("choice", list(PROJECTIONS))
def test_the_reading_path_equals_the_fast_path_for_every_choice(choice, scaled, case, training, return_weights):
    torch.manual_seed(0)
    attn = MultiHeadAttention(D_MODEL, N_HEADS, projections=choice, scaled=scaled).double().train(training)
    x = torch.randn(3, 7, D_MODEL, dtype=torch.float64)
    options = {"return_weights": return_weights, "is_causal": case.startswith("causal") or case == "rotary"}
    if "padding" in case:
        padding = torch.ones(3, 7, dtype=torch.bool)
        padding[1, -2:] = False
        padding[2, 1:] = False
        options["key_padding_mask"] = padding
    if case == "rotary":
        options["rotary"] = RotaryEmbedding(D_MODEL // N_HEADS)
    run_both_paths(attn, x, options)


@pytest.mark.parametrize("choice", list(PROJECTIONS))
def test_the_reading_path_equals_the_fast_path_decoding_with_a_cache_and_across(choice):
    """Through a KV cache one position a call, and as cross-attention (keys and values from a
    context by the projections that stand in for the key and value ones)."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(D_MODEL, N_HEADS, projections=choice).double().eval()
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    run_both_paths(attn, x, {"is_causal": True}, steps=5)
    context = torch.randn(2, 5, D_MODEL, dtype=torch.float64)
    padding = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    run_both_paths(attn, x, {"key_padding_mask": padding}, context=context)


@pytest.mark.parametrize("choice", ["qv", "none"])
def test_a_block_with_fewer_projections_computes_chosen_rows_alone(choice):
    """keys_from (BERT's last layer) passes the whole sequence as a context: with a shared projection
    the chosen rows still equal those of the whole self-attention."""
    torch.manual_seed(0)
    block = TransformerBlock(D_MODEL, N_HEADS, 32, dropout=0.0, attention_projections=choice).eval()
    x = torch.randn(2, 9, D_MODEL)
    rows = torch.tensor([[0, 2, 5], [0, 1, 8]])[..., None].expand(-1, -1, D_MODEL)
    whole = block(x)[0].gather(1, rows)
    chosen = block(x.gather(1, rows), keys_from=x)[0]
    torch.testing.assert_close(chosen, whole, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ block: residual and layer_norm
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("residual, layer_norm", [(True, False), (False, True), (False, False)])
def test_a_block_without_residuals_or_layer_norms_computes_by_hand(norm_first, residual, layer_norm):
    torch.manual_seed(0)
    block = TransformerBlock(D_MODEL, N_HEADS, 32, dropout=0.0, norm_first=norm_first, residual=residual,
                             layer_norm=layer_norm).eval()
    x = torch.randn(2, 5, D_MODEL)
    mlp = block.mlp

    def attend(h):
        return block.attn(h)[0]

    ln1, ln2 = ((lambda h: h) if not layer_norm else norm for norm in (block.ln1, block.ln2))
    if not layer_norm:
        assert isinstance(block.ln1, nn.Identity) and isinstance(block.ln2, nn.Identity)
        assert not any("ln" in name for name, _ in block.named_parameters())

    def add(h, update):
        return h + update if residual else update

    if norm_first:
        h = add(x, attend(ln1(x)))
        expected = add(h, mlp(ln2(h)))
    else:
        h = ln1(add(x, attend(x)))
        expected = ln2(add(h, mlp(h)))
    torch.testing.assert_close(block(x)[0], expected)
    if residual is False and layer_norm is False:  # the plainest case, spelt out: mlp(attn(x))
        torch.testing.assert_close(block(x)[0], mlp(attend(x)))


def test_a_post_norm_block_without_layer_norms_adds_attention_then_the_feed_forward():
    """The brief's example: layer_norm=False, residual=True: x + attn(x), then + mlp of that."""
    torch.manual_seed(0)
    block = TransformerBlock(D_MODEL, N_HEADS, 32, dropout=0.0, layer_norm=False).eval()
    x = torch.randn(2, 5, D_MODEL)
    h = x + block.attn(x)[0]
    torch.testing.assert_close(block(x)[0], h + block.mlp(h))
    with_norms = TransformerBlock(D_MODEL, N_HEADS, 32, dropout=0.0).eval()
    with_norms.load_state_dict(block.state_dict(), strict=False)
    assert not torch.allclose(with_norms(x)[0], block(x)[0])  # the default still normalises


def test_a_cross_attention_block_passes_the_options_to_both_attentions():
    block = TransformerBlock(D_MODEL, N_HEADS, 32, cross_attention=True, attention_projections="v",
                             attention_scaled=False, layer_norm=False)
    for attn in (block.attn, block.cross_attn):
        assert attn.projections == "v" and attn.scaled is False and attn.q is None
    assert isinstance(block.ln_cross, nn.Identity)


# ------------------------------------------------------------------ model configs
def small_encoder(**options) -> TransformerEncoder:
    config = EncoderConfig(vocab_size=30, max_len=16, d_model=D_MODEL, n_heads=N_HEADS, n_layers=2, d_ff=32,
                           dropout=0.0, **options)
    return TransformerEncoder(config).eval()


def small_gpt(**options) -> GPTLMHeadModel:
    return GPTLMHeadModel(GPTConfig(vocab_size=30, d_model=D_MODEL, n_heads=N_HEADS, n_layers=2, d_ff=32,
                                    max_len=16, dropout=0.0, **options)).eval()


@pytest.mark.parametrize("build", [small_encoder, small_gpt])
def test_the_model_configs_reach_every_block(build):
    model = build(attention_projections="kv", attention_scaled=False, residual=False, layer_norm=False,
                  norm_first=True)
    blocks = model.blocks if isinstance(model, TransformerEncoder) else model.gpt.blocks
    final_norm = model.final_norm if isinstance(model, TransformerEncoder) else model.gpt.final_norm
    for block in blocks:
        assert block.attn.projections == "kv" and block.attn.q is None and block.attn.scaled is False
        assert block.residual is False and isinstance(block.ln1, nn.Identity)
    assert isinstance(final_norm, nn.Identity)
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())


@pytest.mark.parametrize("config", [EncoderConfig, GPTConfig])
@pytest.mark.parametrize("field, value, allowed", [
    ("attention_projections", "qk", "qkv, qv, kv, v, none"), ("attention_scaled", "no", "true or false"),
    ("residual", "yes", "true or false"), ("layer_norm", 0, "true or false")])
def test_the_configs_refuse_a_bad_value_naming_the_field(config, field, value, allowed):
    with pytest.raises(ValueError, match=f"{field}=.*{allowed}"):
        config(**{field: value})


def test_the_configs_refuse_an_unknown_position_naming_the_choices():
    with pytest.raises(ValueError, match="positional='absolute'.*learned, sinusoidal, rope, none"):
        EncoderConfig(positional="absolute")
    with pytest.raises(ValueError, match="position='absolute'.*learned, sinusoidal, rope, none"):
        GPTConfig(position="absolute")


# ------------------------------------------------------------------ no position information
def test_an_encoder_without_positions_is_permutation_equivariant():
    torch.manual_seed(0)
    model = small_encoder(positional="none")
    assert model.position is None and model.rotary is None
    ids = torch.randint(1, 30, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    order = torch.randperm(9)
    states, _ = model(ids, mask)
    permuted, _ = model(ids[:, order], mask[:, order])
    torch.testing.assert_close(permuted, states[:, order], rtol=1e-5, atol=1e-5)
    with_positions = small_encoder(positional="learned")
    states, _ = with_positions(ids)
    assert not torch.allclose(with_positions(ids[:, order])[0], states[:, order], atol=1e-3)  # the invariant bites


def test_a_gpt_without_positions_builds_runs_and_generates():
    torch.manual_seed(0)
    model = small_gpt(position="none")
    assert model.gpt.position is None and model.gpt.rotary is None
    assert n_parameters(model) == n_parameters(small_gpt()) - 16 * D_MODEL  # no position table
    ids = torch.randint(0, 30, (2, 10))
    logits = model(ids).logits
    assert logits.shape == (2, 10, 30) and torch.isfinite(logits).all()
    # one token repeated: with nothing to tell the positions apart, every position predicts the same
    repeated = model(torch.full((1, 10), 7)).logits[0]
    torch.testing.assert_close(repeated, repeated[:1].expand(10, -1), rtol=1e-5, atol=1e-5)
    learned = small_gpt()(torch.full((1, 10), 7)).logits[0]
    assert not torch.allclose(learned, learned[:1].expand(10, -1), atol=1e-3)
    new = model.generate(ids, 20)  # past max_len=16: no table bounds the length
    assert new.shape == (2, 20)


# ------------------------------------------------------------------ BERT: mean pooling
def small_bert(pool: str) -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertClassifierConfig(vocab_size=40, n_layers=2, d_model=D_MODEL, n_heads=N_HEADS, d_ff=32, max_len=32,
                                  dropout=0.0, n_classes=3, pool=pool)
    return BertForSequenceClassification(config).eval()


def test_bert_mean_pooling_differs_from_cls_with_the_same_parameters():
    cls, mean = small_bert("cls"), small_bert("mean")
    assert cls.state_dict().keys() == mean.state_dict().keys()
    assert n_parameters(cls) == n_parameters(mean)
    mean.load_state_dict(cls.state_dict())  # the same weights load either way
    ids = torch.randint(5, 40, (2, 8))
    assert not torch.allclose(mean(ids).logits, cls(ids).logits, atol=1e-4)
    hidden, _, _ = mean.bert(ids)
    expected = mean.classifier(torch.tanh(mean.bert.pooler(hidden.mean(dim=1))))
    torch.testing.assert_close(mean(ids).logits, expected)


def test_bert_mean_pooling_ignores_padding():
    model = small_bert("mean")
    ids = torch.randint(5, 40, (2, 6))
    logits = model(ids, attention_mask=torch.ones(2, 6, dtype=torch.long)).logits
    for extra in (1, 5):
        padded = torch.cat([ids, torch.zeros(2, extra, dtype=torch.long)], dim=1)
        mask = torch.cat([torch.ones(2, 6), torch.zeros(2, extra)], dim=1).long()
        torch.testing.assert_close(model(padded, attention_mask=mask).logits, logits, rtol=1e-5, atol=1e-5)
    # and padding counted as real would change them: the mask is what is averaged over
    padded = torch.cat([ids, torch.zeros(2, 5, dtype=torch.long)], dim=1)
    assert not torch.allclose(model(padded).logits, logits, atol=1e-4)


def test_bert_pool_refuses_an_unknown_choice():
    with pytest.raises(ValueError, match="pool='max'.*cls, mean"):
        BertClassifierConfig(pool="max")
