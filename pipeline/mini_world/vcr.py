"""VCR: jsonl per split (question/answers/rationales as token lists mixed with object-index lists),
images under ``vcr1images/<movie>/`` with a metadata json (boxes, names) beside each image.

The released test file has no labels; they are written apart, to ``vcr/eval_server/test_labels.jsonl``
(``annot_id``, ``answer_label``, ``rationale_label``), standing in for the leaderboard that holds
real VCR test labels (``sources.vcr.test_labels``)."""

from __future__ import annotations

import json

from pipeline.mini_world.task_text import vcr_item
from pipeline.mini_world.world import World, distinct_draws, insert_randomly, split_plan

# Up to six different questions per image (fewer when the scene has fewer), so that val holds ~120: with
# two it held 44, and one question moved Q->AR by 2.3 points, more than the demo test's margin
# (docs/decisions.md#vcr-questions).
QUESTIONS_PER_IMAGE = 6
IMAGES_PER_MOVIE = 5
TEST_LABELS = "vcr/eval_server/test_labels.jsonl"
LABEL_KEYS = ("answer_label", "rationale_label")
# the stream of relation rationales' wrong shapes (a stream of its own beside "vcr_questions", whose
# draws it leaves as they were)
SHAPE_STREAM = "vcr_rationale_shapes"


def write_vcr(world: World) -> None:
    cfg, rng = world.cfg, world.rng("vcr")
    text_rng = world.rng("vcr_questions")  # its own stream: the number of questions leaves the images as they are
    shape_rng = world.rng(SHAPE_STREAM)
    splits = split_plan(rng, cfg.n_vcr, {"val": 0.15, "test": 0.15}, "train")
    lines: dict[str, list[bytes]] = {s: [] for s in ("train", "val", "test")}
    test_labels: list[bytes] = []
    train_images = []
    for idx, split in enumerate(splits):
        key = write_vcr_image(world, rng, text_rng, idx, split, lines[split], test_labels, shape_rng=shape_rng)
        if split == "train":
            train_images.append(key)
    _plant_defects(world, rng, lines, train_images)
    for split, rows in lines.items():
        world.write_lines(f"vcr/{split}.jsonl", rows)
        world.counts[f"vcr_{split}_questions"] = len(rows)
    world.write_lines(TEST_LABELS, test_labels)


def write_vcr_image(world: World, rng, text_rng, idx: int, split: str, rows: list[bytes], test_labels: list[bytes],
                    *, shape_rng, row_base: int = 0) -> str:
    """Image number ``idx`` of ``split`` with its metadata and up to ``QUESTIONS_PER_IMAGE`` rows,
    appended to ``rows`` (test labels to ``test_labels``); the rows' annot_ids count on from
    ``row_base + len(rows)``. ``rng`` draws the image, ``text_rng`` the questions and their labels,
    ``shape_rng`` the wrong shapes of relation rationales (``task_text.vcr_item``). Returns the image's key."""
    movie = f"{3000 + idx // IMAGES_PER_MOVIE}_MINI_MOVIE"
    folder = f"lsmdc_{movie}"
    stem = f"{movie}_00.{idx % IMAGES_PER_MOVIE:02d}.00.000-00.{idx % IMAGES_PER_MOVIE:02d}.04.000@0"
    img_fn, metadata_fn = f"{folder}/{stem}.jpg", f"{folder}/{stem}.json"
    rec = world.new_image(rng, "vcr", img_fn, f"vcr/vcr1images/{img_fn}", min_objects=2)
    w, h = rec.scene.size
    objs = rec.scene.objects
    world.write_json(f"vcr/vcr1images/{metadata_fn}", {
        "boxes": [[float(v) for v in o.box] + [1.0] for o in objs], "height": h, "names": [o.shape for o in objs],
        "segms": [[[[o.box[0], o.box[1]], [o.box[2], o.box[1]], [o.box[2], o.box[3]], [o.box[0], o.box[3]]]]
                  for o in objs], "width": w})
    world.use(rec.key, "vcr", split)
    items = distinct_draws(lambda: vcr_item(text_rng, rec.scene, shape_rng=shape_rng),
                           key=lambda it: json.dumps(it.question), n=QUESTIONS_PER_IMAGE)
    for q, item in enumerate(items):
        row = {"annot_id": f"{split}-{row_base + len(rows)}", "answer_choices": item.answers,
               "answer_label": item.answer_label, "img_fn": img_fn, "img_id": f"{split}-{idx}",
               "metadata_fn": metadata_fn, "movie": movie, "objects": [o.shape for o in objs],
               "question": item.question, "question_number": q, "rationale_choices": item.rationales,
               "rationale_label": item.rationale_label}
        if split == "test":  # labels are withheld in the released test file: the leaderboard has them
            test_labels.append(_line({"annot_id": row["annot_id"], **{k: row.pop(k) for k in LABEL_KEYS}}))
        rows.append(_line(row))
    return rec.key


def _plant_defects(world: World, rng, lines: dict[str, list[bytes]], train_images: list[str]) -> None:
    base = json.loads(lines["train"][0])
    no_answers = _line({k: v for k, v in base.items() if k != "answer_choices"} | {"annot_id": "train-900001"})
    malformed = _line(base | {"annot_id": "train-900002"})[:-20]
    extra = [(no_answers, ("missing_field", "no 'answer_choices'")), (malformed, ("malformed_row", "truncated JSON"))]
    rows = insert_randomly(rng, [(r, None) for r in lines["train"]], extra)
    for lineno, (_, defect) in enumerate(rows, start=1):
        if defect:
            world.defect("vcr", "vcr/train.jsonl", lineno, "line", *defect)
    lines["train"] = [r for r, _ in rows]
    carriers = [k for k in train_images if k != f"vcr/{base['img_fn']}"]
    world.break_image(carriers[int(rng.integers(len(carriers)))], "missing", "vcr")


def _line(obj: dict) -> bytes:
    return json.dumps(obj, sort_keys=True).encode()
