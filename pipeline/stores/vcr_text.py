"""VCR text DBs: token lists with object references -> ids with one tag token per object index.

VCR questions, answers and rationales are token lists mixing words and object-index lists
(``["Why", "is", [0], "smiling", "?"]``). Words are WordPiece-tokenized; each referenced object
index k becomes the tag id ``tok.object_tag_id(k)``, which points at region k of the example's
given-box image (``vcr_gt``; regions of the detected image ``vcr`` follow, layout ``concat``).

Views (separate DBs, so neither overwrites the other):
- ``vcr_qa_<split>``: ``input_ids`` = question, ``choices`` = 4 answers, ``label`` = answer_label
- ``vcr_qar_<split>``: ``input_ids`` = question, ``answer_choices``, ``answer_label``,
  ``choices`` = 4 rationales, ``label`` = rationale_label (-1 where unknown, i.e. test)
Second-stage pretraining reads the same DBs (its gold-choice views, pipeline/stores/vcr_views.py),
as UNITER's VCR pretraining reads its fine-tuning text DB.
Truncation to ``max_len`` is longest-part-first over the parts a view concatenates, so every
question+choice (+rationale) combination fits; truncated records are counted.

How a model input is laid out from these parts (one formatter for both stages that read them):
``pipeline.stores.vcr_views.vcr_sequence``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from pipeline.stores.text_db_builder import DB_PREFIXES, TextDbSpec, map_splits, read_manifest
from pipeline.stores.tokenization import WordPieceTokenizer

QA, QAR = DB_PREFIXES["vcr"]  # the two views' DB name prefixes

GT_IMG_DB = "vcr_gt"
DET_IMG_DB = "vcr"


def _load_tokens(value: Any, path: Path, example_id: str, column: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: example {example_id} column {column} is not valid JSON: {err}") from None
    return value


def _segments(tokens: Sequence[Any]) -> list[str | list[int]]:
    """Merge runs of words into one string; keep object-index lists as they are."""
    out: list[str | list[int]] = []
    for tok in tokens:
        if isinstance(tok, list):
            out.append([int(k) for k in tok])
        elif out and isinstance(out[-1], str):
            out[-1] = f"{out[-1]} {tok}"
        else:
            out.append(str(tok))
    return out


class _SegmentEncoder:
    """Collects the word runs of many token lists, encodes them in one batch, rebuilds the ids."""

    def __init__(self, tok: WordPieceTokenizer) -> None:
        self.tok = tok
        self.texts: list[str] = []
        self.ids: list[list[int]] = []
        self.max_object = -1

    def add(self, tokens: Sequence[Any]) -> list[str | int]:
        plan: list[str | int] = []
        for seg in _segments(tokens):
            if isinstance(seg, str):
                plan.append(len(self.texts))
                self.texts.append(seg)
            else:
                plan.extend(f"tag:{k}" for k in seg)
                self.max_object = max([self.max_object, *seg])
        return plan

    def encode(self) -> None:
        self.ids = self.tok.encode_batch(self.texts)

    def build(self, plan: list[str | int]) -> list[int]:
        out: list[int] = []
        for step in plan:
            if isinstance(step, int):
                out.extend(self.ids[step])
            else:
                out.append(self.tok.object_tag_id(int(step.split(":")[1])))
        return out


def fit_lengths(lengths: Sequence[int], limit: int) -> list[int]:
    """Shorten the longest part one token at a time until the parts sum to at most ``limit``."""
    out = list(lengths)
    while sum(out) > limit:
        i = max(range(len(out)), key=lambda j: (out[j], -j))
        out[i] -= 1
    return out


def _arr(ids: Sequence[int], n: int | None = None) -> np.ndarray:
    return np.asarray(list(ids)[: n if n is not None else len(ids)], dtype=np.int32)


def _label(value: Any) -> int:
    return -1 if value is None or pd.isna(value) else int(value)


def vcr_specs(manifest: Path, tok: WordPieceTokenizer, *, max_len: int) -> list[TextDbSpec]:
    """All VCR text DBs (qa and qar views per split)."""
    frame = read_manifest(manifest)
    split = map_splits(frame, "vcr", manifest)
    enc = _SegmentEncoder(tok)
    plans = []
    for row in frame.itertuples(index=False):
        q = _load_tokens(row.question, manifest, row.example_id, "question")
        answers = _load_tokens(row.answer_choices, manifest, row.example_id, "answer_choices")
        rationales = _load_tokens(row.rationale_choices, manifest, row.example_id, "rationale_choices")
        plans.append((enc.add(q), [enc.add(a) for a in answers], [enc.add(r) for r in rationales]))
    enc.encode()

    views: dict[str, dict[str, list]] = {}
    truncated: dict[str, int] = {}
    for row, (q_plan, a_plans, r_plans), name in zip(frame.itertuples(index=False), plans, split):
        q, answers, rationales = enc.build(q_plan), [enc.build(p) for p in a_plans], [enc.build(p) for p in r_plans]
        a_label, r_label = _label(row.answer_label), _label(row.rationale_label)
        if a_label >= len(answers) or r_label >= len(rationales):
            raise ValueError(f"{manifest}: example {row.example_id} has labels ({a_label}, {r_label}) for "
                             f"{len(answers)} answers / {len(rationales)} rationales")
        images = [f"{GT_IMG_DB}/{row.image_id}", f"{DET_IMG_DB}/{row.image_id}"]
        base = {"example_id": row.example_id, "image_ids": images,
                "objects": [str(o) for o in _load_tokens(row.objects, manifest, row.example_id, "objects")]}
        a_max, r_max = max(map(len, answers)), max(map(len, rationales))

        nq, na = fit_lengths([len(q), a_max], max_len)
        qa = {**base, "input_ids": _arr(q, nq), "choices": [_arr(a, na) for a in answers], "label": a_label}
        _add(views, truncated, f"{QA}_{name}", qa, (nq, na) != (len(q), a_max))

        nq, na, nr = fit_lengths([len(q), a_max, r_max], max_len)
        qar = {**base, "input_ids": _arr(q, nq), "answer_choices": [_arr(a, na) for a in answers],
               "answer_label": a_label, "choices": [_arr(r, nr) for r in rationales], "label": r_label}
        _add(views, truncated, f"{QAR}_{name}", qar, (nq, na, nr) != (len(q), a_max, r_max))

    specs = []
    for db_name in sorted(views):
        task, db_split = db_name.rsplit("_", 1)
        specs.append(TextDbSpec(db_name, task, db_split, ["vcr"], "concat", max_len, views[db_name]["records"],
                                truncated[db_name], meta={"obj_tags": _tag_meta(tok, enc.max_object)}))
    return specs


def _add(views: dict, truncated: dict, name: str, record: dict, was_truncated: bool) -> None:
    views.setdefault(name, {"records": []})["records"].append(record)
    truncated[name] = truncated.get(name, 0) + int(was_truncated)


def _tag_meta(tok: WordPieceTokenizer, max_object: int) -> dict[str, Any]:
    """How object indices map to ids: ``[unused<k>]`` (in-vocab) or ``vocab_size + k`` (extra)."""
    return {"scheme": "extra_vocab" if tok.uses_extra_vocab else "unused_tokens",
            "extra_vocab": max_object + 1 if tok.uses_extra_vocab else 0,
            "ids": [tok.object_tag_id(k) for k in range(max_object + 1)]}
