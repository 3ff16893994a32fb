"""Pretraining datasets over DBs built from a synthetic world: batch shapes per docs/design.md §10,
conditional/joint masking invariants, ITM negatives, determinism, and DataLoader workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.dbs_synthetic import built_world
from pipeline.training.batching import TokenBucketSampler, collate_pretrain
from helpers.pretrain import pretrain_loader
from pipeline.pretrain.datasets import PretrainDataset, open_pretrain_dataset

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

CLS, SEP, PAD, MASK, UNK = 101, 102, 0, 103, 100


@pytest.fixture(scope="module")
def dbs(tmp_path_factory):
    return built_world(tmp_path_factory.mktemp("world") / "data", "build_dbs.vqa_min_answer_count=1") / "db"


def dataset(dbs, task, names=("pretrain_indomain_train",), **kw) -> PretrainDataset:
    return open_pretrain_dataset(task, [dbs / "txt" / n for n in names], dbs / "img", seed=11, **kw)


def original_ids(ds: PretrainDataset, i: int) -> list[int]:
    d, eid = ds.example(i)
    return [CLS, *ds.txt_dbs[d][eid]["input_ids"].tolist(), SEP]


def batch_of(ds: PretrainDataset, n: int = 8) -> dict:
    return collate_pretrain([ds[i] for i in range(n)])


def test_lengths_come_from_side_files_and_cover_both_text_dbs(dbs):
    ds = dataset(dbs, "mlm", ("pretrain_indomain_train", "pretrain_outdomain_train"))
    assert len(ds) == 34 + 16
    for i in (0, 20, 49):
        d, eid = ds.example(i)
        rec = ds.txt_dbs[d][eid]
        assert ds.txt_lens[i] == len(rec["input_ids"]) + 2
        assert ds.img_lens[i] == len(ds.img_dbs[rec["image_ids"][0]]["features"])


def test_mlm_masks_text_only_and_labels_the_original_tokens(dbs):
    ds = dataset(dbs, "mlm")
    b = batch_of(ds, len(ds))
    assert b["task"] == "mlm" and set(b) >= {"input_ids", "txt_mask", "img_feat", "img_pos", "img_mask", "txt_labels"}
    assert "img_masked" not in b and "itm_targets" not in b
    B, lt = b["input_ids"].shape
    assert b["txt_labels"].shape == (B, lt) and b["img_feat"].shape[2] == 16 and b["img_pos"].shape[2] == 7
    for i in range(B):
        orig = torch.tensor(original_ids(ds, i))
        n = len(orig)
        labels, ids = b["txt_labels"][i], b["input_ids"][i]
        assert b["txt_mask"][i].sum() == n and labels[n:].eq(-100).all()
        picked = labels[:n] != -100
        assert picked.any() and not picked[0] and not picked[n - 1]  # [CLS]/[SEP] never masked
        assert torch.equal(labels[:n][picked], orig[picked])
        assert torch.equal(ids[:n][~picked], orig[~picked])
        assert ids[0] == CLS and ids[n - 1] == SEP
    changed = (b["input_ids"] == MASK) & (b["txt_labels"] != -100)
    assert changed.sum() / (b["txt_labels"] != -100).sum() > 0.5  # ~80% become [MASK]


@pytest.mark.parametrize("task", ["mrfr", "mrc", "mrc_kl"])
def test_region_tasks_mask_regions_only_and_keep_targets(dbs, task):
    ds = dataset(dbs, task)
    b = batch_of(ds, 12)
    assert "txt_labels" not in b
    for i in range(12):
        orig = original_ids(ds, i)
        assert b["input_ids"][i, : len(orig)].tolist() == orig
    n_regions = b["img_mask"].sum(1)
    assert (b["img_masked"].sum(1) >= 1).all() and not (b["img_masked"] & ~b["img_mask"]).any()
    assert torch.equal(b["img_feat_target"], b["img_feat"])
    assert b["img_soft_labels"].shape == (12, b["img_feat"].shape[1], 6)
    d, eid = ds.example(3)
    image = ds.img_dbs[ds.txt_dbs[d][eid]["image_ids"][0]]
    np.testing.assert_array_equal(b["img_feat"][3, : n_regions[3]].numpy(), image["features"].astype(np.float32))
    np.testing.assert_array_equal(b["img_soft_labels"][3, : n_regions[3]].numpy(),
                                  image["soft_labels"].astype(np.float32))


def test_joint_masking_masks_both_modalities(dbs):
    for task in ("mlm", "mrfr"):
        b = batch_of(dataset(dbs, task, masking="joint"), 10)
        assert ((b["txt_labels"] != -100).sum(1) >= 1).all() and (b["img_masked"].sum(1) >= 1).all()


def test_itm_swaps_in_another_image_for_about_half_the_examples(dbs):
    ds = dataset(dbs, "itm", ("pretrain_indomain_train", "pretrain_indomain_val"))
    targets, swapped_ok = [], []
    for epoch in range(6):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            ex = ds[i]
            own = ds.img_dbs[ds.image_ids(i)[0]]["features"]
            same = ex["img_feat"].shape == own.shape and np.array_equal(ex["img_feat"], own)
            targets.append(ex["itm_target"])
            swapped_ok.append(same == (ex["itm_target"] == 1))
    assert all(swapped_ok)
    assert 0.4 < 1 - np.mean(targets) < 0.6  # 50% negatives over ~250 draws
    b = collate_pretrain([ds[i] for i in range(6)])
    assert b["itm_targets"].dtype == torch.long and "txt_labels" not in b and "img_masked" not in b


def test_examples_are_a_function_of_seed_epoch_and_index(dbs):
    ds = dataset(dbs, "mlm")
    a = [ds[i]["input_ids"] for i in range(10)]
    assert all(torch.equal(x, ds[i]["input_ids"]) for i, x in enumerate(a))
    ds.set_epoch(1)
    assert any(not torch.equal(x, ds[i]["input_ids"]) for i, x in enumerate(a))
    other = dataset(dbs, "mlm")
    assert all(torch.equal(x, other[i]["input_ids"]) for i, x in enumerate(a))


def test_vcr_concatenates_given_and_detected_regions(dbs):
    ds = dataset(dbs, "mrc_kl", ("vcr_qa_train",))
    d, eid = ds.example(0)
    gt, det = (ds.img_dbs[q] for q in ds.txt_dbs[d][eid]["image_ids"])
    ex = ds[0]
    assert ds.img_lens[0] == len(gt["features"]) + len(det["features"]) == len(ex["img_feat"])
    np.testing.assert_array_equal(ex["img_feat"][: len(gt["features"])], gt["features"])


def test_loader_with_workers_gives_the_same_batches_and_respects_the_budget(dbs):
    ds = dataset(dbs, "mrfr", ("pretrain_indomain_train", "pretrain_outdomain_train"))
    ds[0]  # open the LMDBs in the parent first: workers must reopen their own handles
    batches = {}
    for workers in (0, 2):
        loader, sampler = pretrain_loader(ds, batch_tokens=200, seed=4, num_workers=workers)
        batches[workers] = list(loader)
        for batch in batches[workers]:
            assert batch["input_ids"].shape[0] * (batch["input_ids"].shape[1] + batch["img_feat"].shape[1]) <= 200
    assert len(batches[0]) == len(batches[2]) > 3
    for x, y in zip(batches[0], batches[2]):
        assert all(torch.equal(x[k], y[k]) for k in x if k != "task")
    assert sum(b["input_ids"].shape[0] for b in batches[0]) == len(ds)
    sampler = TokenBucketSampler(ds.txt_lens, ds.img_lens, batch_tokens=200, seed=4)
    assert [len(b) for b in sampler] == [b["input_ids"].shape[0] for b in batches[0]]


def test_a_dataset_stream_keeps_its_own_examples_and_itm_negatives(dbs):
    """One stream per (task, dataset), as UNITER's loaders: only that dataset's examples, and ITM
    negatives drawn from that dataset's images."""
    merged = dataset(dbs, "itm")
    parts = {d: dataset(dbs, "itm", datasets=(d,)) for d in ("coco", "vg")}
    assert sum(len(p) for p in parts.values()) == len(merged)
    for name, part in parts.items():
        assert {part.image_ids(i)[0].split("/")[0] for i in range(len(part))} == {name}
        assert {img[0].split("/")[0] for img in part.image_pool} == {name}
        assert {part[i]["itm_target"] for i in range(len(part))} == {0, 1}
    # the same index in two datasets' streams gets independent masks
    coco, vg = (dataset(dbs, "mlm", datasets=(d,)) for d in ("coco", "vg"))
    assert coco.generator(0).initial_seed() != vg.generator(0).initial_seed()
    with pytest.raises(ValueError, match="no example of dataset"):
        dataset(dbs, "mlm", datasets=("sbu",))
