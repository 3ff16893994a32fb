"""pipeline.mini_world.task_text: VCR's choices, drawn on random scenes (no files)."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from pipeline.mini_world.scenes import SHAPES, relation, sample_scene
from pipeline.mini_world.task_text import OPPOSITE, vcr_item


def _relation_items(n: int, seed: int = 0):
    """``n`` relation items with their scenes, drawn as the world draws them."""
    rng, shape_rng, scene_rng = (np.random.default_rng([seed, k]) for k in range(3))
    out = []
    while len(out) < n:
        scene = sample_scene(scene_rng, size=96, max_objects=4, min_objects=2)
        item = vcr_item(rng, scene, shape_rng=shape_rng)
        if item.question[0] == "Where":
            out.append((scene, item))
    return out


def _parts(rationale: list) -> tuple[str, str]:
    """(shape, relation) of "Because [i] is a <shape> <relation> [j] ."."""
    return rationale[4], " ".join(rationale[5:-2])


def test_relation_rationales_need_the_image():
    """The right rationale names [i]'s shape and the gold relation; of the three wrong ones two
    change only the shape and one only the relation (to its opposite), so text rules out one."""
    for scene, item in _relation_items(200):
        i, j = item.question[2][0], item.question[5][0]
        rel, shape = relation(scene.objects[i], scene.objects[j]), scene.objects[i].shape
        assert item.answers[item.answer_label][1:-2] == ["is", *rel.split()]
        assert _parts(item.rationales[item.rationale_label]) == (shape, rel)
        wrong = [_parts(r) for k, r in enumerate(item.rationales) if k != item.rationale_label]
        assert sorted(r == rel for _, r in wrong) == [False, True, True]
        assert (shape, OPPOSITE[rel]) in wrong
        assert len({s for s, r in wrong if r == rel} | {shape}) == 3
        assert all(r[1] == [i] and r[-2] == [j] for r in item.rationales)


def test_the_shapes_shown_do_not_name_the_right_one():
    """Given only the set of three shapes a relation question's rationales show, the right shape is
    not fixed: every set seen often has its right shape spread (a fixed pick of wrong shapes, such as
    the first two others, would make sets like {circle, square, star} always right on 'star')."""
    right_by_set: dict[frozenset, Counter] = defaultdict(Counter)
    for _, item in _relation_items(3000):
        shapes = frozenset(_parts(r)[0] for r in item.rationales)
        right_by_set[shapes][_parts(item.rationales[item.rationale_label])[0]] += 1
    often = {s: c for s, c in right_by_set.items() if sum(c.values()) >= 30}
    assert len(often) >= 15  # C(6, 3) = 20 sets in all
    for shapes, counts in often.items():
        assert len(shapes) == 3 and set(counts) <= shapes <= set(SHAPES)
        assert max(counts.values()) / sum(counts.values()) < 0.6, (shapes, counts)


def test_the_shape_stream_moves_no_other_draw():
    """Questions, answers and both labels depend on ``rng`` alone, which is left in the same state
    whatever ``shape_rng`` draws: the stream was added without moving the world's other draws."""
    scene = sample_scene(np.random.default_rng(7), size=96, max_objects=4, min_objects=2)
    runs = []
    for shape_seed in (1, 2):
        rng, shape_rng = np.random.default_rng(3), np.random.default_rng(shape_seed)
        items = [vcr_item(rng, scene, shape_rng=shape_rng) for _ in range(50)]
        runs.append(([(it.question, it.answers, it.answer_label, it.rationale_label) for it in items], rng.random()))
    assert runs[0] == runs[1]
