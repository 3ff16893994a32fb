"""VCR: ``{train,val,test}.jsonl`` (one question per line) + per-image box metadata JSON.

Question, answers and rationales are token lists mixing words and lists of object indices
(``["What", "is", [0], "doing", "?"]``); they are kept verbatim as JSON strings. ``text`` renders
the question with each index as the object's name and number (``person0``). Train/val lines need
``answer_label``/``rationale_label`` in range; test labels are null, unless ``sources.vcr.test_labels``
names a file of them as the leaderboard holds them (jsonl: ``annot_id``, ``answer_label``,
``rationale_label``; the mini world writes one): each test line then takes its labels from it. Images:
``<image_root>/<img_fn>`` plus ``<image_root>/<metadata_fn>`` (checked with the images).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa

from pipeline.common.source_records import (
    BAD_LABEL, MALFORMED_ROW, MISSING_FIELD, Problem, ReadContext, Reject, Row, SourceFormatError, jsonl_records,
    missing_keys,
)

log = logging.getLogger(__name__)

DATASET = "vcr"
IMAGE_SOURCE = "vcr"
COLUMNS = (
    pa.field("annot_id", pa.string(), nullable=False),
    pa.field("question", pa.string(), nullable=False),
    pa.field("answer_choices", pa.string(), nullable=False),
    pa.field("rationale_choices", pa.string(), nullable=False),
    pa.field("objects", pa.string(), nullable=False),
    pa.field("answer_label", pa.int64()),
    pa.field("rationale_label", pa.int64()),
    pa.field("metadata_path", pa.string(), nullable=False),
)
IMAGES_REPEAT = True
REQUIRED = ("annot_id", "question", "answer_choices", "rationale_choices", "objects", "img_fn", "metadata_fn")
N_CHOICES = 4


def input_files(sources) -> dict[str, Path]:
    src = sources.vcr
    files = {"train": src.train, "val": src.val, "test": src.test, "test_labels": src.test_labels}
    return {k: v for k, v in files.items() if v is not None}


def read_test_labels(path: Path, ctx: ReadContext) -> dict[str, dict]:
    """{annot_id: {"answer_label", "rationale_label"}} of a test-label file.

    A line that is not a label record is counted (``test_label_lines_unreadable`` in _run.json) and
    logged naming file and line; the test question it was for then has no labels and is rejected
    (``missing_field``), so nothing is dropped silently. An annot_id given twice raises
    SourceFormatError naming both lines: which label is the truth is then unknown.
    """
    out: dict[str, dict] = {}
    lines: dict[str, str] = {}
    for item in jsonl_records(path, ctx, "vcr test labels"):
        if isinstance(item, Reject):
            locator, detail = item.locator, item.detail
        else:
            locator, record, _ = item
            problem = missing_keys(record, ("annot_id", "answer_label", "rationale_label"))
            if not problem and isinstance(record["annot_id"], str):
                if record["annot_id"] in out:
                    raise SourceFormatError(f"{path}: {locator}: annot_id {record['annot_id']!r} appears twice "
                                            f"(first on {lines[record['annot_id']]})")
                out[record["annot_id"]] = {k: record[k] for k in ("answer_label", "rationale_label")}
                lines[record["annot_id"]] = locator
                continue
            detail = "expected annot_id (string), answer_label and rationale_label"
        ctx.note("test_label_lines_unreadable")
        log.warning("%s: %s: %s; the test question it labels is rejected", path, locator, detail)
    return out


def _tokens_problem(tokens: Any, n_objects: int, name: str) -> Problem | None:
    """A token list: strings and lists of object indices below ``n_objects``."""
    if not isinstance(tokens, list) or not tokens:
        return MALFORMED_ROW, f"{name} should be a non-empty token list"
    for tok in tokens:
        if isinstance(tok, str):
            continue
        if not isinstance(tok, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in tok):
            return MALFORMED_ROW, f"{name}: token {tok!r} is neither a word nor a list of object indices"
        if any(not 0 <= i < n_objects for i in tok):
            return MALFORMED_ROW, f"{name}: object index in {tok} out of range for {n_objects} objects"
    return None


def render(tokens: list, objects: list[str]) -> str:
    """Token list -> text, object references as ``<name><index>`` joined by 'and'."""
    words = [tok if isinstance(tok, str) else " and ".join(f"{objects[i]}{i}" for i in tok) for tok in tokens]
    return " ".join(words)


def _labels(record: dict, labelled: bool) -> Problem | dict:
    """answer_label / rationale_label: required indices into the choices unless unlabelled (test)."""
    out: dict[str, int | None] = {}
    for name, choices in (("answer_label", "answer_choices"), ("rationale_label", "rationale_choices")):
        value = record.get(name)
        if value is None and not labelled:
            out[name] = None
            continue
        if name not in record:
            return MISSING_FIELD, f"missing {name}"
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(record[choices]):
            return BAD_LABEL, f"{name} {value!r} is not an index into the {len(record[choices])} {choices}"
        out[name] = value
    return out


def _record(record: dict, labelled: bool, ctx: ReadContext) -> Problem | dict:
    """The rendered question text and the labels, or the problem that rejects the line."""
    problem = missing_keys(record, REQUIRED)
    if problem:
        return problem
    objects = record["objects"]
    if not isinstance(objects, list) or not all(isinstance(o, str) for o in objects):
        return MALFORMED_ROW, "objects should be a list of names"
    if not all(isinstance(record[k], str) and record[k] for k in ("annot_id", "img_fn", "metadata_fn")):
        return MALFORMED_ROW, "annot_id, img_fn and metadata_fn should be non-empty strings"
    problem = _tokens_problem(record["question"], len(objects), "question")
    for name in ("answer_choices", "rationale_choices"):
        choices = record[name]
        if not isinstance(choices, list) or len(choices) != N_CHOICES:
            return MALFORMED_ROW, f"{name} should be a list of {N_CHOICES} token lists"
        for k, choice in enumerate(choices):
            problem = problem or _tokens_problem(choice, len(objects), f"{name}[{k}]")
    if problem:
        return problem
    text = render(record["question"], objects)
    problem = ctx.check_text(text, "question")
    if problem:
        return problem
    labels = _labels(record, labelled)
    return labels if isinstance(labels, tuple) else {"text": text.strip(), **labels}


def read(ctx: ReadContext) -> Iterator[Row | Reject]:
    """One Row or Reject per line of train, val and test (locator ``line N``)."""
    src = ctx.sources.vcr
    root = Path(src.image_root)
    test_labels = read_test_labels(Path(src.test_labels), ctx) if src.test_labels is not None else None
    for split, path in (("train", src.train), ("val", src.val), ("test", src.test)):
        source = str(path)
        for item in jsonl_records(Path(path), ctx, f"vcr {split}"):
            if isinstance(item, Reject):
                yield item
                continue
            locator, record, line = item
            labelled = split != "test" or test_labels is not None
            if split == "test" and test_labels is not None and isinstance(record, dict):
                record = {**record, **test_labels.get(record.get("annot_id"), {})}  # type: ignore[arg-type]
            found = _record(record, labelled, ctx)
            if isinstance(found, tuple):
                yield Reject(found[0], found[1], line, source, locator)
                continue
            image_path, metadata_path = str(root / record["img_fn"]), str(root / record["metadata_fn"])
            values = {
                "example_id": f"vcr:{record['annot_id']}", "split": split, "image_source": IMAGE_SOURCE,
                "image_id": record["img_fn"], "image_path": image_path, "url": None, "text": found["text"],
                "annot_id": record["annot_id"], "question": json.dumps(record["question"]),
                "answer_choices": json.dumps(record["answer_choices"]),
                "rationale_choices": json.dumps(record["rationale_choices"]), "objects": json.dumps(record["objects"]),
                "answer_label": found["answer_label"], "rationale_label": found["rationale_label"],
                "metadata_path": metadata_path,
            }
            yield Row(values, line, source, locator, (image_path,), aux_files=(metadata_path,))
