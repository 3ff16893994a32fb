"""VQA v2: ``v2_OpenEnded_mscoco_<subtype>_questions.json`` + ``v2_mscoco_<subtype>_annotations.json``.

One manifest row per question (locator ``questions[i]``), joined with its annotation by
``question_id`` for train/val. Real test answers are not public (answer columns null); with
``sources.vqa.annotations_test`` (``v2_mscoco_test2015_annotations.json`` in the val format, as an
evaluation server holds it: the mini world writes one) test questions are joined with it too. ``answers``
are the 10 raw human answers; a question whose annotation does not have exactly 10 string
answers is ``bad_label``. Images are COCO images:
``<coco image_root>/<subtype>/COCO_<subtype>_<image_id:012d>.jpg`` with subtype the questions
file's ``data_subtype`` (train2014, val2014, test2015).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import pyarrow as pa

from pipeline.ingest.sources.coco import index_by_id
from pipeline.common.source_records import (
    BAD_LABEL, MISSING_FIELD, NON_UTF8, Problem, ReadContext, Reject, Row, check_int, expect_list, load_json,
    missing_keys, record_has_surrogates,
)

DATASET = "vqa"
IMAGE_SOURCE = "coco"
COLUMNS = (
    pa.field("question_id", pa.int64(), nullable=False),
    pa.field("answers", pa.list_(pa.string())),
    pa.field("multiple_choice_answer", pa.string()),
    pa.field("answer_type", pa.string()),
    pa.field("question_type", pa.string()),
)
IMAGES_REPEAT = True
N_ANSWERS = 10
DEFAULT_SUBTYPES = {"train": "train2014", "val": "val2014", "test": "test2015"}


def input_files(sources) -> dict[str, Path]:
    src = sources.vqa
    files = {"questions_train": src.questions_train, "questions_val": src.questions_val,
             "questions_test": src.questions_test, "annotations_train": src.annotations_train,
             "annotations_val": src.annotations_val, "annotations_test": src.annotations_test}
    return {k: v for k, v in files.items() if v is not None}


def _answers(ann: Mapping) -> Problem | dict:
    """The annotation's answer columns, or bad_label / missing_field."""
    problem = missing_keys(ann, ("answers", "multiple_choice_answer"))
    if problem:
        return problem[0], f"annotation: {problem[1]}"
    answers = ann["answers"]
    if not isinstance(answers, list) or len(answers) != N_ANSWERS:
        n = len(answers) if isinstance(answers, list) else type(answers).__name__
        return BAD_LABEL, f"expected {N_ANSWERS} answers, got {n}"
    texts = [a.get("answer") if isinstance(a, Mapping) else None for a in answers]
    if not all(isinstance(t, str) for t in texts) or not isinstance(ann["multiple_choice_answer"], str):
        return BAD_LABEL, "answers and multiple_choice_answer should be strings"
    return {"answers": texts, "multiple_choice_answer": ann["multiple_choice_answer"],
            "answer_type": ann.get("answer_type"), "question_type": ann.get("question_type")}


def _question(q: Any, clean: bool, annotations: Mapping | None, ctx: ReadContext) -> Problem | dict:
    if not clean and record_has_surrogates(q):
        return NON_UTF8, "question holds bytes that are not UTF-8"
    problem = (missing_keys(q, ("question_id", "image_id", "question")) or check_int(q, "question_id")
               or check_int(q, "image_id") or ctx.check_text(q["question"], "question"))
    if problem:
        return problem
    if annotations is None:
        return {"answers": None, "multiple_choice_answer": None, "answer_type": None, "question_type": None}
    ann = annotations.get(q["question_id"])
    if ann is None:
        return MISSING_FIELD, f"question_id {q['question_id']} has no annotation"
    if not clean and record_has_surrogates(ann):
        return NON_UTF8, "annotation holds bytes that are not UTF-8"
    return _answers(ann)


def read(ctx: ReadContext) -> Iterator[Row | Reject]:
    """One Row or Reject per question of the train, val and test questions files."""
    src = ctx.sources.vqa
    coco_root = Path(ctx.sources.coco.image_root)
    files = (("train", src.questions_train, src.annotations_train), ("val", src.questions_val, src.annotations_val),
             ("test", src.questions_test, src.annotations_test))
    for split, q_path, a_path in files:
        q_path = Path(q_path)
        doc, clean = load_json(q_path)
        annotations = None
        if a_path is not None:
            a_doc, a_clean = load_json(Path(a_path))
            annotations = index_by_id(expect_list(a_doc, Path(a_path), "annotations"), "question_id")
            clean = clean and a_clean
        questions = expect_list(doc, q_path, "questions")
        subtype = doc.get("data_subtype")
        subtype = subtype if isinstance(subtype, str) and subtype else DEFAULT_SUBTYPES[split]
        source = str(q_path)
        for i, q in enumerate(ctx.bar(questions, desc=f"vqa {split}")):
            locator = f"questions[{i}]"
            found = _question(q, clean, annotations, ctx)
            if isinstance(found, tuple):
                yield Reject(found[0], found[1], q, source, locator)
                continue
            image_path = str(coco_root / subtype / f"COCO_{subtype}_{q['image_id']:012d}.jpg")
            values = {
                "example_id": f"vqa:{q['question_id']}", "split": split, "image_source": IMAGE_SOURCE,
                "image_id": str(q["image_id"]), "image_path": image_path, "url": None,
                "text": q["question"].strip(), "question_id": q["question_id"], **found,
            }
            yield Row(values, q, source, locator, (image_path,))
