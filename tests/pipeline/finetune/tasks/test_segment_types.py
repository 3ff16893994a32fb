"""Segment types and [SEP] layout as the tasks feed them, on the real DBs of the synthetic world.

VCR: the second pretraining stage and fine-tuning lay out the same text identically (one
formatter, ``pipeline.stores.vcr_views.vcr_sequence``): the gold choice's fine-tuning row is,
token for token and type for type, the second stage's example, ``[CLS] q [SEP] a [SEP] (r [SEP])``
with types 0 / 2 / 3 as the reference's data/vcr.py gives them. NLVR2: the left image's regions type 1, the right image's 2.
"""

from __future__ import annotations

import pytest
import torch

from helpers.finetune_world import budget, ft_params, world
from pipeline.finetune.tasks import task_class
from pipeline.finetune.tasks.base import TaskContext
from pipeline.pretrain.datasets import PretrainDataset
from pipeline.stores.text_sources import TextSource, open_sources

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

VIEWS = {"qa": ("vcr_qa_train", "gold_answer"), "qar": ("vcr_qar_train", "gold_rationale")}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return world(tmp_path_factory)


def make_task(data, name: str, *overrides: str):
    params = ft_params(data, budget(name), *overrides)
    ctx = TaskContext(name=name, data=data, cfg=params.finetune, task_cfg=params.finetune.per_task[name],
                      seed=params.seed)
    return task_class(name)(ctx)


def expected_types(ids: list[int], sep: int, part_types: list[int]) -> list[int]:
    """The reference layout written out: [CLS] and the question 0; each [SEP] takes the type of the
    part after it, the last [SEP] that of the last part."""
    out, part = [0], 0
    for k, tok in enumerate(ids[1:], start=1):
        if tok == sep:
            part = min(part + 1, len(part_types) - 1) if k < len(ids) - 1 else part
        out.append(part_types[part])
    return out


@pytest.mark.parametrize("view", ["qa", "qar"])
def test_vcr_second_stage_and_finetuning_rows_are_laid_out_alike(data, view):
    task = make_task(data, "vcr")
    finetune = task.dataset(view, "train")
    db_name, view_name = VIEWS[view]
    txt_dbs, img_dbs = open_sources([TextSource(data / "db" / "txt" / db_name, view_name)], data / "db" / "img")
    second = PretrainDataset(txt_dbs, img_dbs, task="mrfr")  # MRFR masks regions only: the text is as laid out
    position = {eid: i for i, eid in enumerate(txt_dbs[0].ids)}
    sep = task.special["sep"]
    part_types = [0, 2] if view == "qa" else [0, 2, 3]
    checked = 0
    for i, eid in enumerate(finetune.ids):
        item = finetune[i]
        gold = item["rows"][item["target"]]
        example = second[position[eid]]
        assert torch.equal(gold["input_ids"], example["input_ids"]), eid
        assert torch.equal(gold["txt_type_ids"], example["txt_type_ids"]), eid
        ids = gold["input_ids"].tolist()
        assert ids[0] == task.special["cls"] and ids[-1] == sep and ids.count(sep) == len(part_types)
        assert gold["txt_type_ids"].tolist() == expected_types(ids, sep, part_types)
        assert txt_dbs[0].id2len[eid] == len(ids) - 2  # what the token budget counts, as for a plain DB
        checked += 1
    assert checked == len(txt_dbs[0].ids) > 0
    batch = task.collate([finetune[0], finetune[1]])
    assert batch["txt_type_ids"].shape == batch["input_ids"].shape
    assert batch["txt_type_ids"][~batch["txt_mask"]].eq(0).all()


@pytest.mark.parametrize("variant", ["pair", "pair_biattn", "triplet"])
def test_nlvr2_rows_give_the_right_image_type_2(data, variant):
    task = make_task(data, "nlvr2", f"finetune.nlvr2_variant={variant}")
    item = task.dataset("train")[0]
    types = [r["img_type_ids"] for r in item["rows"]]
    if variant == "triplet":
        n_left = len(types[0]) - types[0].count(2)
        assert types[0] == [1] * n_left + [2] * (len(types[0]) - n_left) and 0 < n_left < len(types[0])
    else:
        assert set(types[0]) == {1} and set(types[1]) == {2}
    batch = task.collate([item])
    assert batch["img_type_ids"][:, : len(types[0])].tolist()[0] == types[0]
    off = make_task(data, "nlvr2", f"finetune.nlvr2_variant={variant}", "finetune.nlvr2_image_types=false")
    assert all("img_type_ids" not in r for r in off.dataset("train")[0]["rows"])

