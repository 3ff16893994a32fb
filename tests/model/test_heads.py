"""Each pretraining loss against a hand computation (plain Python/NumPy) on a tiny example."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from model.heads import ItmHead, MlmHead, MrcHead, MrfrHead, word_region_alignment
from model.heads.wra import word_positions

H = 4


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def _transform_ref(head, x: np.ndarray) -> np.ndarray:
    """Linear -> exact GELU -> LayerNorm(eps=1e-12), written out by hand."""
    z = x @ _np(head.transform.dense.weight).T + _np(head.transform.dense.bias)
    z = 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    mu, var = z.mean(-1, keepdims=True), z.var(-1, keepdims=True)
    return (z - mu) / np.sqrt(var + 1e-12) * _np(head.transform.norm.weight) + _np(head.transform.norm.bias)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _randomize(module: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def test_mlm_loss_and_accuracy_by_hand():
    torch.manual_seed(0)
    vocab = 7
    head = MlmHead(H, vocab)
    _randomize(head, 1)
    emb = torch.randn(vocab, H)
    text = torch.randn(2, 3, H)
    labels = torch.tensor([[-100, 3, -100], [5, -100, 6]])
    out = head(text, labels, emb)
    rows = _transform_ref(head, _np(text)[[0, 1, 1], [1, 0, 2]])
    logits = rows @ _np(emb).T + _np(head.bias)
    targets = [3, 5, 6]
    expected = -np.mean([_log_softmax(logits)[i, t] for i, t in enumerate(targets)])
    assert out.n_tokens == 3 and out.logits.shape == (3, vocab)
    assert out.loss.item() == pytest.approx(expected, rel=1e-5)
    assert out.accuracy.item() == pytest.approx(np.mean(logits.argmax(-1) == targets))
    with pytest.raises(ValueError, match="no masked token"):
        head(text, torch.full((2, 3), -100), emb)


def test_mrfr_loss_by_hand_with_tied_projection():
    torch.manual_seed(1)
    d = 5
    head = MrfrHead(H, d)
    _randomize(head, 2)
    proj = torch.randn(H, d)  # the image embedder's feat_proj.weight: [H, D]
    regions = torch.randn(2, 3, H)
    masked = torch.tensor([[False, True, False], [True, False, False]])
    target = torch.randn(2, 3, d)
    out = head(regions, masked, target, proj)
    pred = _transform_ref(head, _np(regions)[[0, 1], [1, 0]]) @ _np(proj) + _np(head.bias)
    err = pred - _np(target)[[0, 1], [1, 0]]
    assert out.loss.item() == pytest.approx((err**2).sum() / (2 * d), rel=1e-5)
    assert out.prediction.shape == (2, d) and out.n_regions == 2


def _mrc_case():
    torch.manual_seed(2)
    head = MrcHead(H, 4)
    _randomize(head, 3)
    regions = torch.randn(1, 3, H)
    masked = torch.tensor([[True, False, True]])
    # region 0: background most likely, class 2 the top object; region 2: class 3, one zero prob
    soft = torch.tensor([[[0.6, 0.1, 0.25, 0.05], [0.25, 0.25, 0.25, 0.25], [0.0, 0.2, 0.1, 0.7]]])
    logits = _transform_ref(head, _np(regions)[0, [0, 2]]) @ _np(head.classifier.weight).T + _np(head.classifier.bias)
    return head, regions, masked, soft, logits


def test_mrc_hard_label_excludes_background():
    head, regions, masked, soft, logits = _mrc_case()
    out = head(regions, masked, soft, kl=False)
    logp = _log_softmax(logits)
    assert out.loss.item() == pytest.approx(-(logp[0, 2] + logp[1, 3]) / 2, rel=1e-5)
    predicted = logits[:, 1:].argmax(-1) + 1
    assert out.accuracy.item() == pytest.approx(np.mean(predicted == [2, 3]))


def test_mrc_kl_by_hand():
    """Default: UNITER's scale, the mean of the N x (C+1) elementwise terms p (log p - log q)
    (``kl_div(reduction="none")`` then ``.mean()``); ``region_sum``: the KL per region, averaged."""
    head, regions, masked, soft, logits = _mrc_case()
    out = head(regions, masked, soft, kl=True)
    logp, p = _log_softmax(logits), _np(soft)[0, [0, 2]]
    terms = [[pi * (math.log(pi) - lq) if pi > 0 else 0.0 for pi, lq in zip(p[r], logp[r])] for r in range(2)]
    n_elements = 2 * p.shape[1]
    assert out.loss.item() == pytest.approx(sum(map(sum, terms)) / n_elements, rel=1e-5)
    head.kl_reduction = "region_sum"
    assert head(regions, masked, soft, kl=True).loss.item() == pytest.approx(np.mean([sum(t) for t in terms]), rel=1e-5)
    with pytest.raises(ValueError, match="kl_reduction"):
        MrcHead(H, 5, kl_reduction="sum")
    with pytest.raises(ValueError, match="5 classes"):
        head(regions, masked, torch.rand(1, 3, 5), kl=True)
    with pytest.raises(ValueError, match="no masked region"):
        head(regions, torch.zeros(1, 3, dtype=torch.bool), soft, kl=True)


def test_itm_loss_by_hand():
    torch.manual_seed(3)
    head = ItmHead(H)
    pooled = torch.randn(3, H)
    targets = torch.tensor([1, 0, 1])
    out = head(pooled, targets)
    logits = _np(pooled) @ _np(head.classifier.weight).T + _np(head.classifier.bias)
    expected = -np.mean(_log_softmax(logits)[[0, 1, 2], [1, 0, 1]])
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    assert out.accuracy.item() == pytest.approx(np.mean(logits.argmax(-1) == [1, 0, 1]))


def _cos(a, b) -> float:
    a, b = _np(a), _np(b)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_wra_one_word_spreads_mass_over_regions():
    # With a single word the marginals force the plan: the word sends 1/K to each region, so the
    # OT distance is the mean cosine distance. With words="content", [CLS], [SEP] and padding carry no mass.
    gen = torch.Generator().manual_seed(4)
    text = torch.randn(2, 4, H, generator=gen)  # [CLS] w [SEP] <pad> for both pairs
    regions = torch.randn(2, 3, H, generator=gen)
    txt_mask = torch.tensor([[True, True, True, False]] * 2)
    img_mask = torch.tensor([[True, True, True], [True, True, False]])
    targets = torch.tensor([1, 0])
    out = word_region_alignment(text, regions, txt_mask, img_mask, targets, words="content", return_plan=True)
    d_pos = np.mean([1 - _cos(text[0, 1], regions[0, j]) for j in range(3)])
    d_neg = np.mean([1 - _cos(text[1, 1], regions[1, j]) for j in range(2)])
    assert out.distances.tolist() == pytest.approx([d_pos, d_neg], rel=1e-4)
    assert out.loss.item() == pytest.approx((d_pos - d_neg) / 2, rel=1e-4)
    assert out.mean_pos.item() == pytest.approx(d_pos, rel=1e-4)
    assert out.plan.shape == (2, 4, 3)
    assert out.plan[0, 1].tolist() == pytest.approx([1 / 3] * 3, abs=1e-5)
    assert out.plan[:, [0, 2, 3]].abs().sum() == 0 and out.plan[1, :, 2].abs().sum() == 0


def test_wra_perfect_alignment_has_zero_distance():
    e = torch.eye(H)
    text = torch.stack([e[0], e[1], e[2], e[3]])[None]  # [CLS] w1 w2 [SEP]
    regions = torch.stack([e[2], e[1]])[None]  # w1 == region 1, w2 == region 0
    out = word_region_alignment(text, regions, torch.ones(1, 4, dtype=torch.bool), torch.ones(1, 2, dtype=torch.bool),
                                torch.tensor([1]), words="content", return_plan=True)  # fmt: skip
    assert out.distances.item() == pytest.approx(0.0, abs=1e-6)
    torch.testing.assert_close(out.plan[0, 1:3], torch.tensor([[0.0, 0.5], [0.5, 0.0]]), atol=1e-6, rtol=0)


def test_word_positions_all_or_without_cls_sep_never_padding():
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert word_positions(mask, "content").tolist() == [[False, True, True, False, False],
                                                        [False, True, True, True, False]]
    assert word_positions(mask).tolist() == mask.tolist()  # UNITER: [CLS] and [SEP] are words too
    with pytest.raises(ValueError, match="words"):
        word_positions(mask, "tokens")


def test_wra_default_words_include_cls_and_sep():
    """UNITER's words are every real text position: with one region, each of the T words sends its
    1/T to it, so the distance is the mean cosine distance over [CLS], w and [SEP]."""
    gen = torch.Generator().manual_seed(5)
    text, regions = torch.randn(1, 3, H, generator=gen), torch.randn(1, 1, H, generator=gen)
    out = word_region_alignment(text, regions, torch.ones(1, 3, dtype=torch.bool), torch.ones(1, 1, dtype=torch.bool),
                                torch.tensor([1]))
    expected = np.mean([1 - _cos(text[0, i], regions[0, 0]) for i in range(3)])
    assert out.distances.item() == pytest.approx(expected, rel=1e-4)
