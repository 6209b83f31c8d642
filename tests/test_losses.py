"""The cheaper cross-entropy gives F.cross_entropy's loss and gradient."""

import pytest
import torch
import torch.nn.functional as F

from transformer_lab.tasks.losses import IGNORE_INDEX, cross_entropy


def loss_and_grad(loss_fn, logits, targets):
    leaf = logits.detach().clone().requires_grad_()
    loss = loss_fn(leaf, targets)
    (loss * 3.0).backward()  # a scale other than 1 reaches the gradient
    return loss.detach(), leaf.grad


def test_loss_and_gradient_equal_torchs_with_ignored_targets():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=generator, dtype=torch.float64) * 4
    targets = torch.randint(0, 50, (64,), generator=generator)
    targets[::5] = IGNORE_INDEX
    ours = loss_and_grad(cross_entropy, logits, targets)
    theirs = loss_and_grad(lambda x, t: F.cross_entropy(x, t, ignore_index=IGNORE_INDEX), logits, targets)
    torch.testing.assert_close(ours[0], theirs[0])
    torch.testing.assert_close(ours[1], theirs[1])
    assert ours[1][::5].abs().max() == 0  # ignored rows get no gradient


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_target_too_unlikely_for_its_probability_to_be_represented_keeps_its_exact_loss(dtype):
    """The loss reads log p at the targets from the softmax; where p is below the dtype's normal range
    (about 87 nats in float32, 708 in float64) that row's log-probability comes from log-softmax."""
    logits = torch.zeros(3, 10, dtype=dtype)
    logits[:, 0] = torch.tensor([5.0, 150.0, 1000.0], dtype=dtype)  # the targets trail by 5, 150 and 1000
    targets = torch.tensor([1, 1, 1])
    ours = loss_and_grad(cross_entropy, logits, targets)
    theirs = loss_and_grad(F.cross_entropy, logits, targets)
    assert torch.isfinite(ours[0])
    torch.testing.assert_close(ours[0], theirs[0])
    torch.testing.assert_close(ours[1], theirs[1])


def test_every_target_ignored_gives_nan_as_torch():
    logits, targets = torch.randn(4, 6), torch.full((4,), IGNORE_INDEX)
    assert torch.isnan(cross_entropy(logits, targets)) and torch.isnan(F.cross_entropy(logits, targets))


def test_bf16_logits_get_a_bf16_gradient_from_an_fp32_loss():
    logits = torch.randn(8, 30).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 30, (8,))
    loss = cross_entropy(logits, targets)
    loss.backward()
    assert loss.dtype == torch.float32 and logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss, F.cross_entropy(logits.float(), targets))


def test_a_second_backward_through_the_same_graph_fails_instead_of_using_the_spent_buffer():
    logits = torch.randn(8, 30, requires_grad=True)
    loss = cross_entropy(logits, torch.randint(0, 30, (8,)))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_shapes_other_than_rows_of_logits_are_refused():
    with pytest.raises(ValueError, match=r"\(n, classes\)"):
        cross_entropy(torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.long))


@pytest.mark.parametrize("kind", ["bert", "gpt"])
def test_same_weights_and_batch_give_transformers_loss_and_gradients(kind):
    """The training losses the speed benchmark races (ours through the project's loss, `transformers`'
    through F.cross_entropy) are the same number, with the same gradients, without dropout."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import hf_parity

    config = (hf_parity.reference_config if kind == "bert" else hf_parity.reference_gpt_config)("tiny", 0.0)
    torch.manual_seed(0)
    ours, theirs = hf_parity.paired_models(config, hf_parity.hf_class(kind)(config).state_dict(), kind)
    generator = torch.Generator().manual_seed(1)
    batch = (hf_parity.random_batch(generator, 4, 32, padded=True) if kind == "bert"
             else hf_parity.random_gpt_batch(generator, 4, 32))
    losses = {}
    for name, model in (("ours", ours), ("hf", theirs)):
        model.train()  # dropout is 0: training mode with nothing random
        losses[name] = hf_parity.RUNNERS[kind][name](model, batch)
        losses[name].backward()
    torch.testing.assert_close(losses["ours"], losses["hf"], rtol=1e-5, atol=1e-5)
    ours_embedding = ours.get_input_embeddings().weight.grad
    theirs_embedding = theirs.get_input_embeddings().weight.grad
    torch.testing.assert_close(ours_embedding, theirs_embedding, rtol=1e-4, atol=1e-6)
