import functools

import pytest
import torch

from transformer_lab.models.blocks import TransformerBlock
from transformer_lab.models.encoder import (
    EncoderConfig,
    JointIntentSlotConfig,
    JointIntentSlotModel,
    TransformerEncoder,
)
from transformer_lab.models.positional import SinusoidalPositionalEncoding


def tiny_config(**kw) -> JointIntentSlotConfig:
    return JointIntentSlotConfig(vocab_size=50, max_len=16, d_model=32, n_heads=4, n_layers=2, n_intents=5, n_slots=7,
                                 dropout=0.0, **kw)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope"])
def test_joint_model_shapes(norm_first, positional):
    model = JointIntentSlotModel(tiny_config(norm_first=norm_first, positional=positional)).eval()
    ids = torch.randint(3, 50, (4, 9))
    out = model(ids, torch.ones_like(ids, dtype=torch.bool))
    assert out.logits.shape == (4, 5) and out.slot_logits.shape == (4, 8, 7)


def test_padding_does_not_change_real_positions():
    model = JointIntentSlotModel(tiny_config()).eval()
    ids = torch.randint(3, 50, (1, 6))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    a, b = model(ids, ids != 0), model(padded, padded != 0)
    torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.slot_logits, b.slot_logits[:, :5], atol=1e-5, rtol=1e-5)


def test_positions_matter_and_tokens_are_permutation_equivariant_without_them():
    config = EncoderConfig(vocab_size=50, max_len=16, d_model=32, n_heads=4, n_layers=1, dropout=0.0)
    encoder = TransformerEncoder(config).eval()
    ids = torch.randint(3, 50, (1, 6))
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    states, _ = encoder(ids)
    states_perm, _ = encoder(ids[:, perm])
    assert not torch.allclose(states[:, perm], states_perm, atol=1e-4)  # order is visible through positions
    with torch.no_grad():
        encoder.position.embedding.weight.zero_()
    states, _ = encoder(ids)
    states_perm, _ = encoder(ids[:, perm])
    torch.testing.assert_close(states[:, perm], states_perm, atol=1e-5, rtol=1e-5)  # self-attention alone is a set op


def test_sinusoidal_table_follows_the_paper():
    table = SinusoidalPositionalEncoding(50, 16)(50)
    pos, i = 7, 3
    assert table[pos, 2 * i].item() == pytest.approx(torch.sin(torch.tensor(pos / 10000 ** (2 * i / 16))).item(), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(torch.cos(torch.tensor(pos / 10000 ** (2 * i / 16))).item(), abs=1e-6)


def test_post_norm_and_pre_norm_blocks_differ_only_in_order():
    torch.manual_seed(0)
    post = TransformerBlock(16, 2, 64, dropout=0.0, norm_first=False).eval()
    pre = TransformerBlock(16, 2, 64, dropout=0.0, norm_first=True).eval()
    pre.load_state_dict(post.state_dict())
    x = torch.randn(2, 5, 16)
    out_post, _ = post(x)
    out_pre, _ = pre(x)
    # post-norm output is LayerNorm-ed (zero mean per position); pre-norm output is a raw residual stream
    torch.testing.assert_close(out_post.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
    assert out_pre.mean(-1).abs().max() > 1e-3


def test_config_defaults_and_validation():
    assert EncoderConfig(d_model=64).d_ff == 256
    with pytest.raises(ValueError, match="divisible"):
        EncoderConfig(d_model=30, n_heads=4)
    model = TransformerEncoder(EncoderConfig(max_len=8, d_model=16, n_heads=2))
    with pytest.raises(ValueError, match="max_len"):
        model(torch.ones(1, 9, dtype=torch.long))


# ------------------------------------------------------------------ one output type for every family
@functools.cache
def _families():
    """(name, model, inputs, logits shape, attention layers or None) for every family's models, at
    each family's tiny size. Batch 2, 6 tokens, 8x8 images, 3 categorical columns."""
    from transformer_lab.models.bert import (BertClassifierConfig, BertConfig, BertForJointIntentSlot,
                                             BertForPreTraining, BertForQuestionAnswering,
                                             BertForSequenceClassification, BertJointConfig)
    from transformer_lab.models.gpt import (GPTClassifierConfig, GPTConfig, GPTForSequenceClassification,
                                            GPTLMHeadModel)
    from transformer_lab.models.seq2seq import Seq2SeqConfig, TransformerSeq2Seq
    from transformer_lab.models.tab_transformer import TabTransformer, TabTransformerConfig
    from transformer_lab.models.vit import ViTConfig, VisionTransformer
    from transformer_lab.models.word2vec import Word2Vec, Word2VecConfig

    torch.manual_seed(0)
    ids, mask = torch.randint(5, 50, (2, 6)), torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False  # a padded row
    bert = dict(vocab_size=50, size="tiny", max_len=16)
    gpt = dict(vocab_size=50, size="tiny", max_len=16)
    images = torch.randn(2, 1, 8, 8)
    tab = TabTransformerConfig(cardinalities=[4, 3, 5], n_continuous=2, d_model=16, n_layers=2, n_heads=2)
    rows = (torch.tensor([[0, 1, 2], [3, 2, 4]]), torch.randn(2, 2))
    return [
        ("encoder", JointIntentSlotModel(tiny_config()), (ids, mask), (2, 5), 2),
        ("bert_pretraining", BertForPreTraining(BertConfig(**bert)), (ids, None, mask), (2, 6, 50), 2),
        ("bert_classifier", BertForSequenceClassification(BertClassifierConfig(**bert, n_classes=3)), (ids, None, mask),
         (2, 3), 2),
        ("bert_joint", BertForJointIntentSlot(BertJointConfig(**bert, n_intents=4)), (ids, None, mask), (2, 4), 2),
        ("bert_qa", BertForQuestionAnswering(BertConfig(**bert)), (ids, None, mask), (2, 6, 2), 2),
        ("gpt_lm", GPTLMHeadModel(GPTConfig(**gpt)), (ids,), (2, 6, 50), 2),
        ("gpt_moe", GPTLMHeadModel(GPTConfig(**gpt, ffn="moe")), (ids,), (2, 6, 50), 2),
        ("gpt_classifier", GPTForSequenceClassification(GPTClassifierConfig(**gpt, n_classes=3)),
         (ids[:, None], torch.tensor([[5], [3]])), (2, 3), 2),
        ("vit", VisionTransformer(ViTConfig(size="tiny")), (images,), (2, 10), 4),
        ("swin", VisionTransformer(ViTConfig(size="tiny", attention="window", stage_depths=[2, 2])), (images,),
         (2, 10), 4),
        ("tab_transformer", TabTransformer(tab), rows, (2, 2), 2),
        ("tab_mlp", TabTransformer(TabTransformerConfig(**{**tab.to_dict(), "architecture": "mlp"})), rows, (2, 2), 0),
        ("seq2seq", TransformerSeq2Seq(Seq2SeqConfig(vocab_size=50, size="tiny", max_len=16)), (ids, ids[:, :5]),
         (2, 5, 50), 2),  # decoder self-attention per layer (cross-attention: test_seq2seq.py)
        ("word2vec", Word2Vec(Word2VecConfig(vocab_size=50, dim=8), torch.arange(1, 51)),
         (ids, mask, torch.tensor([7, 9])), (2, 6, 6), None),  # centre + 5 noise words per context word
    ]


@pytest.mark.parametrize("index", range(14), ids=lambda i: _families()[i][0])
def test_every_family_returns_one_model_output(index):
    from transformer_lab.models.outputs import ModelOutput

    name, model, inputs, shape, layers = _families()[index]
    model.eval()
    with torch.no_grad():
        out = model(*inputs)
        assert isinstance(out, ModelOutput) and out.logits.shape == shape, name
        if layers is None:  # word2vec: no attention, and the loss is the model's own output
            assert out.loss.shape == (2,)
            return
        assert out.attentions is None  # weights only when asked (they bypass the fused kernel)
        weighed = model(*inputs, return_weights=True)
    assert isinstance(weighed.attentions, list) and len(weighed.attentions) == layers, name
    for weights in weighed.attentions:
        assert weights.dim() == 4  # (batch [x windows], heads, queries, keys)
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    torch.testing.assert_close(weighed.logits, out.logits, atol=1e-5, rtol=1e-5)  # the same model either way
