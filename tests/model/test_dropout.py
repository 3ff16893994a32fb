"""model/dropout.py: the CPU masks have torch.nn.Dropout's distribution, scaling, gradient and seeding,
and the explicit attention equals SDPA where no element is dropped."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import model.dropout
from model.config import UniterConfig
from model.dropout import Dropout, attention, drop_mask, dropout, explicit_attention, keep_multiplier
from model.layers import Encoder


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_drop_rate_is_p_and_masks_are_independent(p):
    torch.manual_seed(0)
    n = 1 << 21
    drop = drop_mask((n,), p).double()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(drop.mean().item() - p) < 5 * sigma
    # neighbours (within one 64-bit word and across words) are dropped together at rate p^2
    both = (drop[:-1] * drop[1:]).mean().item()
    assert abs(both - p * p) < 5 * math.sqrt(p * p * (1 - p * p) / n)
    # every column of a [rows, 384] mask has rate p (no position is favoured)
    cols = drop_mask((8192, 384), p).double().mean(0)
    assert (cols - p).abs().max().item() < 5 * math.sqrt(p * (1 - p) / 8192)


def test_kept_elements_are_scaled_and_the_gradient_is_masked_the_same_way():
    torch.manual_seed(1)
    x = torch.randn(64, 96, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(2)
    y = dropout(x, 0.25, True)
    torch.manual_seed(2)
    kept = ~drop_mask(x.shape, 0.25)
    assert torch.equal(y, torch.where(kept, x * (1 / 0.75), torch.zeros_like(x)))
    grad = torch.randn_like(x)
    y.backward(grad)
    assert torch.equal(x.grad, torch.where(kept, grad * (1 / 0.75), torch.zeros_like(grad)))


def test_seeded_like_torch_and_identity_when_not_training():
    x = torch.randn(32, 128)
    torch.manual_seed(3)
    a = dropout(x, 0.1, True)
    torch.manual_seed(3)
    b = dropout(x, 0.1, True)
    c = dropout(x, 0.1, True)
    assert torch.equal(a, b) and not torch.equal(b, c)
    module = Dropout(0.1)
    assert isinstance(module, torch.nn.Dropout) and module.p == 0.1
    assert module.eval()(x) is x and dropout(x, 0.0, True) is x
    assert torch.equal(dropout(x, 1.0, True), torch.zeros_like(x))


def test_a_mask_takes_one_draw_of_torchs_generator_whatever_its_shape():
    """torch's generator decides each mask (one seed), and what is drawn after a mask does not depend
    on its size: runs stay reproducible from ``torch.manual_seed`` and saved RNG states."""
    after = []
    for shape in ((1,), (7,), (3, 1001)):
        torch.manual_seed(7)
        first = drop_mask(shape, 0.3)
        after.append(torch.rand(4))
        torch.manual_seed(7)
        assert torch.equal(drop_mask(shape, 0.3), first) and first.shape == shape and first.dtype == torch.bool
    torch.manual_seed(7)
    torch.randint(1 << 62, (), dtype=torch.int64)
    expected = torch.rand(4)
    assert all(torch.equal(a, expected) for a in after)
    assert drop_mask((0, 5), 0.1).shape == (0, 5) and not drop_mask((64,), 0.0).any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int32])
def test_keep_multiplier_is_the_complement_of_drop_mask_in_the_given_dtype(dtype):
    torch.manual_seed(8)
    keep = keep_multiplier((5, 999), 0.3, dtype)
    torch.manual_seed(8)
    drop = drop_mask((5, 999), 0.3)
    assert keep.dtype == dtype and keep.shape == (5, 999)
    assert torch.equal(keep, (~drop).to(dtype)) and 0 < int(drop.sum()) < drop.numel()


def _masked_fill_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """The earlier application: zero the dropped elements of :func:`drop_mask`, then scale."""
    if not training or p == 0.0:
        return x
    return x.masked_fill(drop_mask(x.shape, p), 0) * (1.0 / (1.0 - p))


@pytest.mark.parametrize("autocast", [False, True])
def test_multiplying_by_the_kept_mask_gives_the_values_and_gradients_of_zeroing(autocast, monkeypatch):
    """An encoder's training forward + backward (hidden and attention dropout 0.1, fp32 or bf16
    autocast) gives the same output and parameter gradients, to the bit, as zeroing with masked_fill."""
    cfg = UniterConfig.from_preset("tiny", dropout=0.1)
    torch.manual_seed(9)
    encoder = Encoder(cfg).train()
    x = torch.randn(3, 11, cfg.hidden_size)
    key_mask = torch.ones(3, 11, dtype=torch.bool)
    key_mask[1, 7:] = False

    def step():
        torch.manual_seed(10)
        encoder.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = encoder(x, key_mask)
        out.float().square().sum().backward()
        return out.detach(), {n: q.grad.clone() for n, q in encoder.named_parameters()}

    ours, our_grads = step()
    monkeypatch.setattr(model.dropout, "dropout", _masked_fill_dropout)
    ref, ref_grads = step()
    assert torch.equal(ours, ref) and all(torch.equal(our_grads[n], ref_grads[n]) for n in ref_grads)


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_drop_mask_rejects_p_outside_0_to_1(p):
    with pytest.raises(ValueError, match="p must lie in"):
        drop_mask((4,), p)


def test_mean_matches_torch_dropout_over_many_draws():
    x = torch.full((1 << 20,), 2.0)
    torch.manual_seed(4)
    ours, theirs = dropout(x, 0.1, True), F.dropout(x, 0.1, True)
    # both keep each element with probability 0.9 and scale by 1 / 0.9: mean 2.0, sd 2/3 per element
    tol = 5 * (2.0 / 3.0) / math.sqrt(x.numel())
    assert abs(ours.mean().item() - 2.0) < tol and abs(theirs.mean().item() - 2.0) < tol
    values = ours.unique().tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(2.0 / 0.9)


def _qkv_mask(dtype=torch.float32):
    torch.manual_seed(5)
    q, k, v = (torch.randn(3, 4, 10, 8, dtype=dtype) for _ in range(3))
    mask = torch.ones(3, 1, 1, 10, dtype=torch.bool)
    mask[0, ..., 7:] = False
    mask[2, ..., 4:] = False
    return q, k, v, mask


def test_explicit_attention_equals_sdpa_when_nothing_is_dropped():
    q, k, v, mask = _qkv_mask(torch.float64)
    ours = explicit_attention(q, k, v, mask, 0.0)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
    assert torch.equal(attention(q, k, v, mask, 0.0), ref)


def test_attention_dropout_drops_probabilities_with_the_seeded_mask():
    q, k, v, mask = _qkv_mask(torch.float64)
    torch.manual_seed(6)
    ours = attention(q, k, v, mask, 0.2)
    torch.manual_seed(6)
    drop = drop_mask((3, 4, 10, 10), 0.2)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~mask, float("-inf")).softmax(-1)
    expected = scores.masked_fill(drop, 0) / 0.8 @ v
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-10)


def _scale_then_masked_fill_attention(q, k, v, attn_mask, dropout_p):
    """explicit_attention's earlier form: scale the scores, then masked_fill the masked keys."""
    scores = (q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))).masked_fill(~attn_mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(v.dtype)
    return torch.matmul(dropout(probs, dropout_p, True), v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_explicit_attention_masks_by_bias_with_the_values_and_gradients_of_masked_fill(dtype):
    """Adding a 0 / -inf bias to the scaled scores gives the output and q, k, v gradients of scaling
    and then masked_fill, to the bit, with dropout on."""
    q, k, v, mask = _qkv_mask()

    def run(fn):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        torch.manual_seed(12)
        out = fn(*leaves, mask, 0.2)
        (out.float() * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
        return [out.detach()] + [t.grad for t in leaves]

    ours, ref = run(explicit_attention), run(_scale_then_masked_fill_attention)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref))


def test_bf16_training_attention_is_explicit_and_close_to_fp32():
    q, k, v, mask = _qkv_mask()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    low = [t.bfloat16().requires_grad_() for t in (q, k, v)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = attention(*low, mask, 0.0)
    assert "ScaledDotProduct" not in ours.grad_fn.name()  # explicit_attention's, not SDPA's fused backward
    torch.testing.assert_close(ours.float(), ref, rtol=0.05, atol=0.05)
    ours.float().sum().backward()
    q32 = q.clone().requires_grad_()
    F.scaled_dot_product_attention(q32, k, v, attn_mask=mask).sum().backward()
    torch.testing.assert_close(low[0].grad.float(), q32.grad, rtol=0.05, atol=0.05)
    with torch.no_grad():  # inference keeps SDPA's fused kernel
        assert torch.equal(attention(*low, mask, 0.0), F.scaled_dot_product_attention(*low, attn_mask=mask))


@pytest.mark.parametrize("training", [False, True])
def test_nlvr2_cross_attention_is_torchs_multihead_attention_where_nothing_is_dropped(training):
    """NLVR2's bi-attention layers: the same parameters, state dict and outputs as
    ``nn.MultiheadAttention`` (with a key padding mask), with dropout 0 or in eval mode; with dropout
    they drop with the model's masks (seeded like torch's)."""
    from model.tasks.nlvr2 import CrossAttention

    torch.manual_seed(0)
    ours = CrossAttention(64, 4, dropout=0.0)
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(64, 4, dropout=0.0, batch_first=True)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))
    ours.train(training), theirs.train(training)
    query, key = torch.randn(3, 7, 64), torch.randn(3, 9, 64)
    padding = torch.zeros(3, 9, dtype=torch.bool)
    padding[1, 6:] = padding[2, 2:] = True
    got, none = ours(query, key, key, key_padding_mask=padding, need_weights=False)
    want, _ = theirs(query, key, key, key_padding_mask=padding, need_weights=False)
    assert none is None and torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    dropping = CrossAttention(64, 4, dropout=0.5).train()
    torch.manual_seed(1)
    first, _ = dropping(query, key, key, key_padding_mask=padding)
    torch.manual_seed(1)
    again, _ = dropping(query, key, key, key_padding_mask=padding)
    assert torch.equal(first, again) and not torch.allclose(first, dropping.eval()(query, key, key, padding)[0])
