"""NLVR2: jsonl statements over an image pair (label "True"/"False"), PNG images per split."""

from __future__ import annotations

import json

from pipeline.mini_world.task_text import nlvr2_statement
from pipeline.mini_world.urlforms import web_url
from pipeline.mini_world.world import World, distinct_draws, insert_randomly, split_plan

FILE_SPLIT = {"train": "train", "dev": "dev", "test1": "test"}  # file/dir name -> manifest split name
# Real NLVR2 pairs each sentence with several image pairs; here each pair gets several distinct sentences. Two per
# pair left 280 training statements, which both starts memorised before learning the grounding
# (docs/decisions.md#nlvr2-statements).
STATEMENTS_PER_PAIR = 6


def write_nlvr2(world: World) -> None:
    """Leaves ``world.info['nlvr2']['query_left']``: (image key, left_url) of eval pairs whose URL has a query."""
    cfg, rng = world.cfg, world.rng("nlvr2")
    text_rng = world.rng("nlvr2_statements")  # its own stream: the number of statements leaves the images as they are
    splits = split_plan(rng, cfg.n_nlvr2_pairs, {"dev": 0.15, "test1": 0.15}, "train")
    lines: dict[str, list[bytes]] = {s: [] for s in FILE_SPLIT}
    query_left = []
    for set_id, fsplit in enumerate(splits):
        # at least one eval pair has a left URL with a query (CC plants a reordered-query variant of it)
        force = FILE_SPLIT[fsplit] != "train" and not query_left
        write_nlvr2_pair(world, rng, text_rng, set_id, fsplit, lines[fsplit], query_left, force_query=force)
    _plant_defects(world, rng, lines)
    for fsplit, rows in lines.items():
        world.write_lines(f"nlvr2/{fsplit}.json", rows)
        world.counts[f"nlvr2_{fsplit}_statements"] = len(rows)
    world.info["nlvr2"] = {"query_left": query_left}


def write_nlvr2_pair(world: World, rng, text_rng, set_id: int, fsplit: str, lines: list[bytes],
                     query_left: list[tuple[str, str]], *, force_query: bool = False) -> None:
    """Pair ``set_id`` of file split ``fsplit``: two PNGs and up to ``STATEMENTS_PER_PAIR`` rows
    appended to ``lines``; an eval pair whose left URL has a query goes to ``query_left``
    (``force_query``: the left URL gets one)."""
    recs = []
    for side in (0, 1):
        stem = f"{fsplit}-{set_id}-0-img{side}"
        recs.append(world.new_image(rng, "nlvr2", stem, f"nlvr2/images/{fsplit}/{stem}.png", fmt="PNG"))
        world.use(recs[-1].key, "nlvr2", FILE_SPLIT[fsplit])
    urls = [web_url(rng, with_query=bool(rng.random() < 0.5) or (force_query and side == 0)) for side in (0, 1)]
    if "?" in urls[0] and FILE_SPLIT[fsplit] != "train":
        query_left.append((recs[0].key, urls[0]))
    left, right = recs[0].scene, recs[1].scene
    statements = distinct_draws(
        lambda: nlvr2_statement(text_rng, left, right, want=bool(text_rng.random() < 0.5)),
        key=lambda st: st[0], n=STATEMENTS_PER_PAIR)
    for k, (text, label) in enumerate(statements):
        lines.append(_line({
            "extra_validations": {}, "identifier": f"{fsplit}-{set_id}-0-{k}", "label": str(label),
            "left_url": urls[0], "query": "shapes", "right_url": urls[1], "sentence": text,
            "synset": "shape", "validation": {}, "writer": "mini_world"}))


def _plant_defects(world: World, rng, lines: dict[str, list[bytes]]) -> None:
    base = json.loads(lines["train"][0])
    bad_label = _line(base | {"identifier": base["identifier"][:-1] + "7", "label": "Maybe"})
    no_sentence = _line({k: v for k, v in base.items() if k != "sentence"} | {"identifier": base["identifier"][:-1] + "8"})
    malformed = _line(base)[:-9]
    extra = [(bad_label, ("bad_label", "label 'Maybe'")), (no_sentence, ("missing_field", "no 'sentence'")),
             (malformed, ("malformed_row", "truncated JSON line"))]
    rows = insert_randomly(rng, [(r, None) for r in lines["train"]], extra)
    for lineno, (_, defect) in enumerate(rows, start=1):
        if defect:
            world.defect("nlvr2", "nlvr2/train.json", lineno, "line", *defect)
    lines["train"] = [r for r, _ in rows]


def _line(obj: dict) -> bytes:
    return json.dumps(obj, sort_keys=True).encode()
