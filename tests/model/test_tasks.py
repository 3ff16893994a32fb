"""Downstream task models: hand-checked losses, gradient reach, training on random tensors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from model.config import UniterConfig
from model.pretraining import UniterForPretraining
from model.tasks import (
    UniterForNlvr2,
    UniterForRefExp,
    UniterForRetrieval,
    UniterForSnliVe,
    UniterForVcr,
    UniterForVqa,
)
from model.tasks.common import grouped_choice_loss, grouped_choice_output

VOCAB, D = 100, 12


def _cfg() -> UniterConfig:
    return UniterConfig.from_preset("tiny", vocab_size=VOCAB, dropout=0.0)


def rows(n: int, seed: int = 0, lt: int = 8, li: int = 6) -> dict:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (n, lt), generator=gen)
    txt_mask = torch.ones(n, lt, dtype=torch.bool)
    txt_mask[0, 5:] = False
    ids[~txt_mask] = 0
    img_mask = torch.ones(n, li, dtype=torch.bool)
    img_mask[-1, 3:] = False
    return {
        "input_ids": ids,
        "txt_mask": txt_mask,
        "img_feat": torch.randn(n, li, D, generator=gen),
        "img_pos": torch.rand(n, li, 7, generator=gen),
        "img_mask": img_mask,
    }


def _case(name: str):
    """(model, batch with targets, expected logits shape, parameters that must not train)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    if name == "vqa":
        batch = rows(4)
        targets = torch.zeros(4, 10)
        targets[0, 3], targets[1, 2], targets[1, 7], targets[2, 0], targets[3, 9] = 1.0, 0.3, 1.0, 0.6, 1.0
        return UniterForVqa(_cfg(), img_dim=D, num_answers=10), dict(batch, targets=targets), (4, 10), ()
    if name.startswith("vcr"):
        batch = dict(rows(8), targets=torch.tensor([2, 0]), txt_type_ids=torch.tensor([[0, 0, 0, 2, 2, 2, 3, 3]] * 8))
        model = UniterForVcr(_cfg(), img_dim=D, loss="softmax" if name == "vcr_softmax" else "row")
        return model, batch, (2, 4), ()
    if name.startswith("snli_ve"):
        model = UniterForSnliVe(_cfg(), img_dim=D, loss="ce" if name == "snli_ve_ce" else "bce")
        return model, dict(rows(4), targets=torch.tensor([0, 1, 2, 1])), (4, 3), ()
    if name.startswith("retrieval"):
        model = UniterForRetrieval(_cfg(), img_dim=D, loss="softmax" if name == "retrieval_softmax" else "hinge")
        return model, dict(rows(6), targets=torch.tensor([0, 0])), (2, 3), ()
    if name == "refexp":
        batch = rows(3)
        return (
            UniterForRefExp(_cfg(), img_dim=D),
            dict(batch, targets=torch.tensor([4, 0, 2])),
            (3, 6),
            ("uniter.pooler",),
        )
    if name == "nlvr2_triplet":
        batch = rows(4)
        batch["img_type_ids"] = torch.tensor([[1, 1, 1, 2, 2, 2]] * 4)
        model = UniterForNlvr2(_cfg(), img_dim=D, variant="triplet")
        return model, dict(batch, targets=torch.randint(0, 2, (4,), generator=gen)), (4, 2), ()
    variant = name.removeprefix("nlvr2_")
    model = UniterForNlvr2(_cfg(), img_dim=D, variant=variant)
    frozen = ("uniter.pooler",) if variant == "pair_biattn" else ()
    batch = dict(rows(8), targets=torch.tensor([1, 0, 0, 1]), img_type_ids=torch.tensor([[1] * 6, [2] * 6] * 4))
    return model, batch, (4, 2), frozen


CASES = ["vqa", "vcr", "vcr_softmax", "snli_ve", "snli_ve_ce", "retrieval", "retrieval_softmax", "refexp",
         "nlvr2_triplet", "nlvr2_pair", "nlvr2_pair_biattn"]


@pytest.mark.parametrize("name", CASES)
def test_gradients_reach_encoder_and_head(name):
    model, batch, shape, unused = _case(name)
    out = model(batch)
    assert out.logits.shape == shape and out.metrics["n_examples"] == shape[0]
    out.loss.backward()
    for pname, p in model.named_parameters():
        if name in ("retrieval_softmax", "vcr_softmax", "refexp") and pname in ("scorer.bias", "head.3.bias"):
            # a bias shared by every candidate cancels in the softmax over a group (RefCOCO+: over the
            # regions): its gradient is zero here up to float rounding (VCR's "wrong" logit is not
            # used by the softmax at all)
            assert p.grad is not None and p.grad.abs().sum() < 1e-6
        elif pname.startswith(unused) or pname.endswith("img_embeddings.mask_embedding"):
            # (the mask vector is MRM's: fine-tuning masks no region; it stays in the encoder, as in UNITER)
            assert p.grad is None or p.grad.abs().sum() == 0, f"{name}: {pname} should not train"
        else:
            assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}: no gradient for {pname}"


@pytest.mark.parametrize("name", CASES)
def test_loss_decreases_on_random_tensors(name):
    model, batch, _, _ = _case(name)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        out = model(batch)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        first = first if first is not None else out.metrics["loss"]
    assert out.metrics["loss"] < 0.5 * first, (name, first, out.metrics["loss"])


def test_vqa_loss_by_hand():
    model, batch, _, _ = _case("vqa")
    out = model(batch)
    x, t = out.logits.detach().double().tolist(), batch["targets"].double().tolist()
    bce = sum(
        -(t[i][j] * math.log(1 / (1 + math.exp(-x[i][j]))) + (1 - t[i][j]) * math.log(1 - 1 / (1 + math.exp(-x[i][j]))))
        for i in range(4)
        for j in range(10)
    )
    assert out.loss.item() == pytest.approx(bce / 4, rel=1e-5)
    top = [max(range(10), key=row.__getitem__) for row in x]
    assert out.metrics["vqa_score"] == pytest.approx(sum(t[i][top[i]] for i in range(4)) / 4, rel=1e-6)


def test_grouped_choice_loss_by_hand():
    scores = torch.tensor([0.5, 2.0, -1.0, 0.0, 1.0, 3.0])
    loss, acc, logits = grouped_choice_loss(scores, torch.tensor([1, 0]))
    lse = [math.log(sum(math.exp(s) for s in g)) for g in ([0.5, 2.0, -1.0], [0.0, 1.0, 3.0])]
    assert loss.item() == pytest.approx(((lse[0] - 2.0) + (lse[1] - 0.0)) / 2, rel=1e-6)
    assert acc.item() == 0.5 and logits.shape == (2, 3)
    with pytest.raises(ValueError, match="cannot be split"):
        grouped_choice_loss(torch.zeros(5), torch.tensor([0, 1]))


def test_grouped_choice_output_ranks_without_targets_and_scores_groups_with_them():
    scores = torch.tensor([0.5, 2.0, -1.0, 0.0, 1.0, 3.0])
    assert grouped_choice_output(scores, None).logits is scores and grouped_choice_output(scores, None).loss is None
    out = grouped_choice_output(scores, torch.tensor([1, 2]))
    loss, _, _ = grouped_choice_loss(scores, torch.tensor([1, 2]))
    assert out.logits.tolist() == [[0.5, 2.0, -1.0], [0.0, 1.0, 3.0]] and out.loss.item() == loss.item()
    assert out.metrics == {"loss": pytest.approx(loss.item()), "accuracy": 1.0, "n_examples": 2.0}


def test_refexp_masks_padded_regions_before_ce():
    model, batch, _, _ = _case("refexp")
    out = model(batch)
    assert torch.isinf(out.logits[2, 3:]).all() and (out.logits[2, 3:] < 0).all()
    assert torch.isfinite(out.logits[:2]).all() and torch.isfinite(out.logits[2, :3]).all()
    real = out.logits[2, :3].detach().double()
    assert out.logits.argmax(-1)[2] < 3
    by_hand = [
        math.log(sum(math.exp(v) for v in row)) - row[t]
        for row, t in ((out.logits[0].tolist(), 4), (out.logits[1].tolist(), 0), (real.tolist(), 2))
    ]
    assert out.loss.item() == pytest.approx(sum(by_hand), rel=1e-5)  # summed, as UNITER's train_re.py
    with pytest.raises(ValueError, match="padded region"):
        model(dict(batch, targets=torch.tensor([0, 0, 5])))


def test_nlvr2_batch_shape_errors():
    model, batch, _, _ = _case("nlvr2_triplet")
    with pytest.raises(KeyError, match="img_type_ids"):
        model({k: v for k, v in batch.items() if k != "img_type_ids"})
    pair = _case("nlvr2_pair")[0]
    with pytest.raises(KeyError, match="img_type_ids"):
        pair(rows(4))
    with pytest.raises(ValueError, match="even number of rows"):
        pair(dict(rows(3), img_type_ids=torch.ones(3, 6, dtype=torch.long)))
    with pytest.raises(ValueError, match="unknown NLVR2 variant"):
        UniterForNlvr2(_cfg(), img_dim=D, variant="quad")


def test_retrieval_zero_shot_from_itm_ranks_like_itm_probability():
    torch.manual_seed(3)
    pretrain = UniterForPretraining(_cfg(), img_dim=D, num_classes=5).eval()
    retrieval = UniterForRetrieval(_cfg(), img_dim=D).eval()
    retrieval.init_from_pretraining(pretrain.state_dict())
    batch = rows(6, seed=4)
    with torch.no_grad():
        scores = retrieval(batch).logits
        seq = pretrain.uniter(
            batch["input_ids"], batch["txt_mask"], batch["img_feat"], batch["img_pos"], batch["img_mask"]
        )
        p_match = F.softmax(pretrain.itm.classifier(pretrain.uniter.pool(seq)), -1)[:, 1]
    torch.testing.assert_close(torch.sigmoid(scores), p_match, atol=1e-6, rtol=1e-5)
