"""The Q→A view of VCR for second-stage pretraining, read from the ``vcr_qa_<split>`` text DB.

UNITER pretrains on VCR with two views of every training question, kept as separate datasets:
Q→A (question + gold answer) and QA→R (question + gold answer + gold rationale). build_dbs
writes the QA→R text as ``pretrain_vcr_<split>``; the Q→A text is the question plus the gold
choice of ``vcr_qa_<split>``, which this view presents with the interface PretrainDataset reads
from a TextDb (``meta``, ``name``, ``ids``, ``id2len``, ``txt2img``, ``db[id]["input_ids"]``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.stores import TextDb


class GoldAnswerView:
    """``vcr_qa_<split>`` records as pretraining text: ``input_ids`` = question + gold answer.

    Examples without a gold answer (label -1: the test split) are left out.
    """

    def __init__(self, db: TextDb) -> None:
        self.db = db
        self.path: Path = db.path
        self.meta = db.meta
        self.name = f"{db.name}:gold_answer"
        self.txt2img = db.txt2img
        self.id2len: dict[str, int] = {}
        for eid in db.ids:
            record = db[eid]
            label = int(record.get("label", -1))
            if label < 0:
                continue
            choices = record.get("choices")
            if choices is None or label >= len(choices):
                raise ValueError(f"{db.path}: example {eid} has label {label} but "
                                 f"{0 if choices is None else len(choices)} answer choices")
            self.id2len[eid] = len(record["input_ids"]) + len(choices[label])
        self.ids = sorted(self.id2len)

    @property
    def img_db_names(self) -> list[str]:
        return self.db.img_db_names

    def __getitem__(self, example_id: str) -> dict[str, Any]:
        record = self.db[example_id]
        gold = np.asarray(record["choices"][int(record["label"])])
        return {**record, "input_ids": np.concatenate([np.asarray(record["input_ids"]), gold])}

    def __len__(self) -> int:
        return len(self.ids)
