"""The shared NLVR2 / SNLI-VE evaluation: DB names, accuracy of a constant answer against the labels
counted straight from the text DBs, and the chance level = the majority training label's share."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from torch import nn

from helpers.finetune_world import budget, ft_params, world
from model.tasks import TaskOutput
from helpers.stores import write_lmdb
from pipeline.finetune.tasks import task_class
from pipeline.finetune.tasks.base import TaskContext
from pipeline.stores.lmdb_store import encode_value
from pipeline.stores.readers import TextDb

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

TASKS = ("nlvr2", "snli_ve")


class ConstantAnswer(nn.Module):
    """Always picks class ``answer`` of ``classes``: logits [items, classes]."""

    def __init__(self, answer: int, classes: int) -> None:
        super().__init__()
        self.answer, self.classes = answer, classes

    def forward(self, batch: dict) -> TaskOutput:
        logits = torch.zeros(len(batch["ids"]), self.classes)
        logits[:, self.answer] = 1.0
        return TaskOutput(logits=logits)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return world(tmp_path_factory)


def make_task(data, name: str):
    params = ft_params(data, budget(name))
    ctx = TaskContext(name=name, data=data, cfg=params.finetune, task_cfg=params.finetune.per_task[name],
                      seed=params.seed)
    return task_class(name)(ctx)


def label_counts(data, db_name: str) -> dict[int, int]:
    """Labelled examples per label, read from the DB records (unlabeled = -1 left out)."""
    db, counts = TextDb(data / "db" / "txt" / db_name), defaultdict(int)
    for eid in db.ids:
        if int(db[eid]["label"]) >= 0:
            counts[int(db[eid]["label"])] += 1
    return dict(counts)


@pytest.mark.parametrize("name", TASKS)
def test_dbs_are_named_after_the_task(data, name):
    assert make_task(data, name).text_dbs() == [f"{name}_train", f"{name}_dev", f"{name}_test"]


@pytest.mark.parametrize("name", TASKS)
def test_accuracy_of_a_constant_answer_is_that_labels_share(data, name):
    task = make_task(data, name)
    classes = 2 if name == "nlvr2" else 3
    counts = {split: label_counts(data, f"{name}_{split}") for split in ("dev", "test")}
    for answer in range(classes):
        metrics = task.evaluate(ConstantAnswer(answer, classes), torch.device("cpu")).metrics
        for split, c in counts.items():
            total = sum(c.values())
            expected = round(100.0 * c.get(answer, 0) / total, 4) if total else 0.0
            assert metrics[split] == {"accuracy": expected, "examples": total}


def relabel(db_dir, labels: list[int]) -> None:
    """Rewrite a text DB's records with these labels (in sorted id order), keeping the rest."""
    db = TextDb(db_dir)
    assert len(db.ids) == len(labels)
    records = [(eid, encode_value({**db[eid], "label": label})) for eid, label in zip(db.ids, labels)]
    (db_dir / "data.mdb").unlink()
    write_lmdb(db_dir, records, commit_every=100)


def test_chance_is_the_majority_training_labels_accuracy(tmp_path_factory):
    data = world(tmp_path_factory)  # a copy of its own: the training labels are rewritten
    relabel(data / "db" / "txt" / "snli_ve_train", [2, 0, 2])  # majority 2, and 0 is there too
    task = make_task(data, "snli_ve")
    expected = {f"{split}/accuracy": m["accuracy"] for split, m in
                task.evaluate(ConstantAnswer(2, 3), torch.device("cpu")).metrics.items()}
    counts = {split: label_counts(data, f"snli_ve_{split}") for split in ("dev", "test")}
    assert expected == {f"{s}/accuracy": round(100.0 * c.get(2, 0) / sum(c.values()), 4) for s, c in counts.items()}
    assert task.chance() == expected
