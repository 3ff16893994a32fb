"""The two views of VCR for second-stage pretraining, read from the fine-tuning text DBs.

UNITER pretrains on VCR with two views of every training question, kept as separate datasets
(data/pretrain_vcr.py, ``VcrPretrainDataset``): Q→A (question + gold answer) and QA→R (question +
gold answer + gold rationale). Both are read here from the DBs fine-tuning reads
(``vcr_qa_<split>``, ``vcr_qar_<split>``) and laid out by :func:`vcr_sequence`, which lays out the
fine-tuning rows too (pipeline/finetune/tasks/vcr.py): ``[CLS] q [SEP] a [SEP] (r [SEP])`` with segment
types 0 / 2 / 3, so the two stages see the same [SEP] layout and segment types. A view presents the interface PretrainDataset reads from a TextDb (``meta``, ``name``,
``ids``, ``id2len``, ``txt2img``, ``img_db_names``, ``view[id]``); its records carry the laid-out
``input_ids`` ([CLS] and [SEP] included) and ``txt_type_ids``, which PretrainDataset takes as they
are. ``id2len`` counts the tokens between [CLS] and the last [SEP], as for a plain text DB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from model.config import TEXT_TYPE, VCR_ANSWER_TYPE, VCR_RATIONALE_TYPE
from pipeline.stores.readers import TextDb


def vcr_sequence(special: Mapping[str, int], question: Sequence[int], answer: Sequence[int],
                 rationale: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``[CLS] q [SEP] a [SEP]`` (Q→A) or ``[CLS] q [SEP] a [SEP] r [SEP]`` (QA→R) and its segment types.

    Types follow UNITER's VCR fine-tuning data (data/vcr.py ``VcrDataset``): [CLS] and the question
    0, each [SEP] the type of the part after it (the last one: of the last part), the answer
    ``VCR_ANSWER_TYPE`` (2), the rationale ``VCR_RATIONALE_TYPE`` (3).
    Returns: (input_ids i64 [L], txt_type_ids i64 [L]), L = len(q) + len(a) (+ len(r)) + 3 (+ 1).
    """
    parts = [(question, TEXT_TYPE), (answer, VCR_ANSWER_TYPE)]
    if rationale is not None:
        parts.append((rationale, VCR_RATIONALE_TYPE))
    ids, types = [special["cls"]], [TEXT_TYPE]
    for k, (part, seg) in enumerate(parts):
        if k:
            ids.append(special["sep"])
            types.append(seg)
        ids.extend(int(i) for i in part)
        types.extend([seg] * len(part))
    ids.append(special["sep"])
    types.append(parts[-1][1])
    return torch.tensor(ids, dtype=torch.long), torch.tensor(types, dtype=torch.long)


def _gold(db: TextDb, eid: str, record: dict[str, Any], choices_key: str, label_key: str) -> np.ndarray | None:
    """The gold choice of ``record`` (None when unlabelled: label -1, the test split)."""
    label = int(record.get(label_key, -1))
    if label < 0:
        return None
    choices = record.get(choices_key)
    if choices is None or label >= len(choices):
        raise ValueError(f"{db.path}: example {eid} has {label_key} {label} but "
                         f"{0 if choices is None else len(choices)} {choices_key}")
    return np.asarray(choices[label])


class _GoldView:
    """Base of the views: the labelled examples of ``db``, laid out by ``parts(eid, record)``."""

    suffix = ""

    def __init__(self, db: TextDb) -> None:
        self.db = db
        self.path: Path = db.path
        self.meta = db.meta
        self.name = f"{db.name}:{self.suffix}"
        self.txt2img = db.txt2img
        self.special = db.meta["special_ids"]
        self.id2len: dict[str, int] = {}
        for eid in db.ids:
            parts = self.parts(eid, db[eid])
            if parts is not None:
                self.id2len[eid] = sum(len(p) for p in parts) + len(parts) - 1  # the inner [SEP]s
        self.ids = sorted(self.id2len)

    def parts(self, eid: str, record: dict[str, Any]) -> list[np.ndarray] | None:
        raise NotImplementedError

    @property
    def img_db_names(self) -> list[str]:
        return self.db.img_db_names

    def __getitem__(self, example_id: str) -> dict[str, Any]:
        record = self.db[example_id]
        parts = self.parts(example_id, record)
        if parts is None:
            raise KeyError(f"{self.db.path}: example {example_id} has no gold label")
        ids, types = vcr_sequence(self.special, *parts)
        return {**record, "input_ids": ids, "txt_type_ids": types}

    def __len__(self) -> int:
        return len(self.ids)


class GoldAnswerView(_GoldView):
    """``vcr_qa_<split>`` as Q→A pretraining text: question + gold answer (unlabelled examples left out)."""

    suffix = "gold_answer"

    def parts(self, eid: str, record: dict[str, Any]) -> list[np.ndarray] | None:
        answer = _gold(self.db, eid, record, "choices", "label")
        return None if answer is None else [np.asarray(record["input_ids"]), answer]


class GoldRationaleView(_GoldView):
    """``vcr_qar_<split>`` as QA→R pretraining text: question + gold answer + gold rationale."""

    suffix = "gold_rationale"

    def parts(self, eid: str, record: dict[str, Any]) -> list[np.ndarray] | None:
        answer = _gold(self.db, eid, record, "answer_choices", "answer_label")
        rationale = _gold(self.db, eid, record, "choices", "label")
        if answer is None or rationale is None:
            return None
        return [np.asarray(record["input_ids"]), answer, rationale]
