"""UniterForPretraining: gradient reach per task, training on random tensors, the batch contract."""

from __future__ import annotations

import pytest
import torch

from model.config import UniterConfig
from model.pretraining import PRETRAIN_TASKS, UniterForPretraining

VOCAB, D, C = 120, 16, 6


def make_batch(seed: int = 0, b: int = 4, lt: int = 9, li: int = 7) -> dict:
    """A docs/design.md §10 batch with padding in both modalities and targets for every task."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (b, lt), generator=gen)
    txt_mask = torch.ones(b, lt, dtype=torch.bool)
    txt_mask[1, 6:] = False
    ids[:, 0] = 1
    ids[~txt_mask] = 0
    img_mask = torch.ones(b, li, dtype=torch.bool)
    img_mask[2, 4:] = False
    labels = torch.full((b, lt), -100)
    labels[:, 2], labels[0, 4] = ids[:, 2], ids[0, 4]
    img_masked = torch.zeros(b, li, dtype=torch.bool)
    img_masked[:, 1], img_masked[3, 5] = True, True
    feat = torch.randn(b, li, D, generator=gen)
    return {
        "input_ids": ids,
        "txt_mask": txt_mask,
        "img_feat": feat,
        "img_pos": torch.rand(b, li, 7, generator=gen),
        "img_mask": img_mask,
        "txt_labels": labels,
        "img_masked": img_masked,
        "img_feat_target": feat.clone(),
        "img_soft_labels": torch.softmax(3 * torch.randn(b, li, C, generator=gen), -1),
        "itm_targets": torch.tensor([1, 0] * (b // 2)),
    }


def make_model(wra_weight: float = 0.1, seed: int = 0) -> UniterForPretraining:
    torch.manual_seed(seed)
    cfg = UniterConfig.from_preset("tiny", vocab_size=VOCAB, dropout=0.0)
    return UniterForPretraining(cfg, img_dim=D, num_classes=C, wra_weight=wra_weight)


# which top-level modules each task must train; everything else must get no gradient
TRAINED = {
    "mlm": ("uniter.embeddings", "uniter.img_embeddings", "uniter.encoder", "mlm."),
    "mrfr": ("uniter.embeddings", "uniter.img_embeddings", "uniter.encoder", "mrfr."),
    "mrc": ("uniter.embeddings", "uniter.img_embeddings", "uniter.encoder", "mrc."),
    "mrc_kl": ("uniter.embeddings", "uniter.img_embeddings", "uniter.encoder", "mrc."),
    "itm": ("uniter.", "itm."),
}


@pytest.mark.parametrize("task", PRETRAIN_TASKS)
def test_gradients_reach_exactly_the_task_parameters(task):
    model = make_model()
    model(make_batch(), task).loss.backward()
    for name, param in model.named_parameters():
        if name.startswith(TRAINED[task]):
            assert param.grad is not None and param.grad.abs().sum() > 0, f"{task}: no gradient for {name}"
        else:
            assert param.grad is None or param.grad.abs().sum() == 0, f"{task}: unexpected gradient for {name}"


def test_frozen_parameters_get_no_gradient():
    model = make_model()
    model.uniter.embeddings.requires_grad_(False)
    model(make_batch(), "itm").loss.backward()
    assert all(p.grad is None for p in model.uniter.embeddings.parameters())
    assert model.uniter.encoder.layers[0].attention.qkv.weight.grad is not None


@pytest.mark.parametrize("task", PRETRAIN_TASKS)
def test_each_task_loss_decreases_on_random_tensors(task):
    model = make_model()
    batch = make_batch(seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    key = f"{task}_loss"
    losses = []
    for _ in range(40):
        out = model(batch, task)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.metrics[key])
    assert losses[-1] < 0.6 * losses[0], (task, losses[0], losses[-1])
    if task == "itm":  # WRA is trained in the same batches: matched pairs get closer than mismatched ones
        assert out.metrics["ot_pos"] < out.metrics["ot_neg"]


def test_metrics_and_wra_switch():
    batch = make_batch()
    out = make_model(wra_weight=0.5)(batch, "itm", return_plan=True)
    assert set(out.metrics) == {"loss", "itm_loss", "itm_acc", "wra_loss", "ot_dist", "ot_pos", "ot_neg", "n_pairs",
                                "n_pos", "n_neg"}
    assert out.loss.item() == pytest.approx(out.metrics["itm_loss"] + 0.5 * out.metrics["wra_loss"], rel=1e-5)
    assert out.wra.plan.shape == (4, 9, 7) and out.metrics["n_pairs"] == 4
    plain = make_model(wra_weight=0.0)(batch, "itm")
    assert plain.wra is None and "wra_loss" not in plain.metrics
    assert plain.loss.item() == pytest.approx(out.metrics["itm_loss"], rel=1e-5)  # same seed, same weights
    mlm = make_model()(batch, "mlm")
    assert mlm.metrics["n_tokens"] == 5 and 0 <= mlm.metrics["mlm_acc"] <= 1
    assert make_model()(batch, "mrc_kl").metrics["n_regions"] == 5
    assert make_model()(dict(batch, task="mrfr")).metrics.keys() == {"loss", "mrfr_loss", "n_regions"}


def test_bad_batches_are_named():
    model, batch = make_model(), make_batch()
    with pytest.raises(ValueError, match="unknown pretraining task 'vqa'"):
        model(batch, "vqa")
    with pytest.raises(KeyError, match=r"mrfr batch lacks key\(s\) \['img_feat_target'\]"):
        model({k: v for k, v in batch.items() if k != "img_feat_target"}, "mrfr")


def test_itm_init_std_scales_only_the_itm_classifiers_start():
    cfg = UniterConfig.from_preset("tiny", vocab_size=VOCAB, dropout=0.0)
    torch.manual_seed(3)
    reference = UniterForPretraining(cfg, img_dim=D, num_classes=C)  # UNITER: initializer_range 0.02
    torch.manual_seed(3)
    wide = UniterForPretraining(cfg, img_dim=D, num_classes=C, itm_init_std=0.2)
    ref_state, wide_state = reference.state_dict(), wide.state_dict()
    # the same draw, ten times wider: every other start is untouched, so a run with the switch
    # differs from the reference's only through the ITM classifier
    torch.testing.assert_close(wide_state["itm.classifier.weight"], 10 * ref_state["itm.classifier.weight"])
    assert torch.equal(wide_state["itm.classifier.bias"], ref_state["itm.classifier.bias"])
    assert all(torch.equal(value, wide_state[key]) for key, value in ref_state.items() if not key.startswith("itm."))
    assert abs(wide.itm.classifier.weight.std().item() - 0.2) < 0.05
    with pytest.raises(ValueError, match="itm_init_std must be > 0"):
        UniterForPretraining(cfg, img_dim=D, num_classes=C, itm_init_std=0.0)
