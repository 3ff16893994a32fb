"""Downstream-task text from scene graphs: VQA questions, VCR choices, NLVR2 statements, SNLI-VE
hypotheses and RefCOCO+ expressions. Every answer and label is computed from the scene graph.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pipeline.mini_world.scenes import COLOURS, SHAPES, Scene, relation
from pipeline.mini_world.text import article, number_word, plural

RELATIONS = ("to the left of", "to the right of", "above", "below")
OPPOSITE = {"to the left of": "to the right of", "to the right of": "to the left of",
            "above": "below", "below": "above"}


# ------------------------------------------------------------------ VQA
@dataclass(frozen=True)
class VqaItem:
    question: str
    answer: str  # the true answer (VQA-normalized form: digits, lower case)
    answer_type: str  # yes/no | number | other
    question_type: str
    wrong: tuple[str, ...]  # plausible wrong answers that disagreeing annotators give


def vqa_question(rng: np.random.Generator, scene: Scene) -> VqaItem:
    """One question about ``scene`` whose answer is read off the scene graph."""
    kind = ("color", "count", "count", "yesno", "yesno", "relation")[int(rng.integers(6))]
    objs = scene.objects
    shape_counts = Counter(o.shape for o in objs)
    unique = [o for o in objs if shape_counts[o.shape] == 1]
    if kind == "color" and unique:
        o = unique[int(rng.integers(len(unique)))]
        return VqaItem(f"What color is the {o.shape}?", o.colour, "other", "what color is the",
                       tuple(c for c in COLOURS if c != o.colour))
    if kind == "relation" and len(objs) >= 2 and len(unique) >= 2:
        i, j = (int(v) for v in rng.choice(len(unique), size=2, replace=False))
        a, b = unique[i], unique[j]
        rel = relation(a, b) if rng.random() < 0.5 else RELATIONS[int(rng.integers(4))]
        ans = "yes" if relation(a, b) == rel else "no"
        return VqaItem(f"Is the {a.shape} {rel} the {b.shape}?", ans, "yes/no", "is the",
                       ("no" if ans == "yes" else "yes",))
    if kind in ("yesno", "relation"):
        if rng.random() < 0.5:
            o = objs[int(rng.integers(len(objs)))]
            colour, shape = o.colour, o.shape
        else:
            colour, shape = str(rng.choice(list(COLOURS))), str(rng.choice(SHAPES))
        ans = "yes" if scene.count(shape=shape, colour=colour) else "no"
        return VqaItem(f"Is there {article(colour)} {colour} {shape}?", ans, "yes/no", "is there a",
                       ("no" if ans == "yes" else "yes",))
    how = int(rng.integers(3))
    if how == 0:
        shape = objs[int(rng.integers(len(objs)))].shape if rng.random() < 0.8 else str(rng.choice(SHAPES))
        n, q = scene.count(shape=shape), f"How many {plural(shape, 2)} are there?"
    elif how == 1:
        colour = objs[int(rng.integers(len(objs)))].colour
        n, q = scene.count(colour=colour), f"How many {colour} shapes are there?"
    else:
        n, q = len(objs), "How many shapes are in the picture?"
    wrong = tuple(str(v) for v in (n + 1, max(0, n - 1), n + 2) if v != n)
    return VqaItem(q, str(n), "number", "how many", wrong)


def vqa_answers(rng: np.random.Generator, item: VqaItem) -> list[str]:
    """Ten annotator answers: at least six give the true one, up to four a plausible wrong one."""
    n_wrong = int(rng.choice([0, 0, 0, 0, 1, 1, 1, 2, 3, 4]))
    answers = [item.answer] * 10
    for pos in rng.choice(10, size=n_wrong, replace=False):
        answers[int(pos)] = item.wrong[int(rng.integers(len(item.wrong)))]
    return answers


# ------------------------------------------------------------------ VCR
@dataclass(frozen=True)
class VcrItem:
    question: list
    answers: list[list]
    answer_label: int
    rationales: list[list]
    rationale_label: int


def _choices(rng: np.random.Generator, right: list, wrong: list[list]) -> tuple[list[list], int]:
    label = int(rng.integers(4))
    picked = [wrong[int(k)] for k in rng.permutation(len(wrong))[:3]]
    picked.insert(label, right)
    return picked, label


def vcr_item(rng: np.random.Generator, scene: Scene, *, shape_rng: np.random.Generator) -> VcrItem:
    """A colour or relation question with object tags ([i] index lists) as in VCR's jsonl.

    ``rng`` draws the question, the choices' order and both labels; ``shape_rng`` (a stream of its
    own, so that adding it moved none of ``rng``'s draws) the wrong shapes of relation rationales.
    Both kinds' right rationale names the tagged object's shape, so QA->R needs the image.
    """
    objs = scene.objects
    if len(objs) >= 2 and rng.random() < 0.5:
        i, j = (int(v) for v in rng.choice(len(objs), size=2, replace=False))
        rel, shape = relation(objs[i], objs[j]), objs[i].shape
        ans = {r: [[i], "is", *r.split(), [j], "."] for r in RELATIONS}
        answers, a_label = _choices(rng, ans[rel], [ans[r] for r in RELATIONS if r != rel])
        # two wrong shapes drawn (a fixed pick would let the three shapes shown name the right one)
        # and the opposite relation: the answer's words rule out one, only the image the other two
        why = [(str(s), rel) for s in shape_rng.choice([s for s in SHAPES if s != shape], size=2, replace=False)]
        why.append((shape, OPPOSITE[rel]))
        right, wrong = _relation_rationale(i, j, shape, rel), [_relation_rationale(i, j, s, r) for s, r in why]
        rationales, r_label = _choices(rng, right, wrong)
        return VcrItem(["Where", "is", [i], "compared", "to", [j], "?"], answers, a_label, rationales, r_label)
    i = int(rng.integers(len(objs)))
    o = objs[i]
    q = ["What", "color", "is", [i], "?"]
    ans = {c: [[i], "is", c, "."] for c in COLOURS}
    answers, a_label = _choices(rng, ans[o.colour], [ans[c] for c in COLOURS if c != o.colour])
    right = ["Because", [i], "is", article(o.colour), o.colour, o.shape, "."]
    wrong = [["Because", [i], "is", article(o.colour), o.colour, s, "."] for s in SHAPES if s != o.shape][:2]
    wrong += [["Because", [i], "is", article(c), c, o.shape, "."] for c in COLOURS if c != o.colour][:2]
    rationales, r_label = _choices(rng, right, wrong)
    return VcrItem(q, answers, a_label, rationales, r_label)


def _relation_rationale(i: int, j: int, shape: str, rel: str) -> list:
    """"Because [i] is a <shape> <relation> [j] ." as a VCR token list."""
    return ["Because", [i], "is", article(shape), shape, *rel.split(), [j], "."]


# ------------------------------------------------------------------ NLVR2
Statement = tuple[str, Callable[[Scene, Scene], bool]]


def _nlvr2_statements(rng: np.random.Generator, left: Scene, right: Scene) -> list[Statement]:
    pool = list(left.objects + right.objects)
    o = pool[int(rng.integers(len(pool)))]
    c, s = (o.colour, o.shape) if rng.random() < 0.6 else (str(rng.choice(list(COLOURS))), str(rng.choice(SHAPES)))
    n = left.count(shape=s) + right.count(shape=s) + int(rng.choice([0, 0, 1, -1]))
    n = max(n, 1)
    return [
        (f"The left image contains {article(c)} {c} {s}.", lambda a, b: a.count(colour=c, shape=s) > 0),
        (f"The right image contains {article(c)} {c} {s}.", lambda a, b: b.count(colour=c, shape=s) > 0),
        (f"Both images contain at least one {s}.", lambda a, b: a.count(shape=s) > 0 and b.count(shape=s) > 0),
        (f"There {'is' if n == 1 else 'are'} exactly {number_word(n)} {plural(s, n)} in total.",
         lambda a, b: a.count(shape=s) + b.count(shape=s) == n),
        ("The left image has more shapes than the right image.", lambda a, b: len(a.objects) > len(b.objects)),
        (f"Exactly one image contains {c} shapes.",
         lambda a, b: (a.count(colour=c) > 0) != (b.count(colour=c) > 0)),
        (f"There are more {c} shapes in the right image than in the left image.",
         lambda a, b: b.count(colour=c) > a.count(colour=c)),
    ]


def nlvr2_statement(rng: np.random.Generator, left: Scene, right: Scene, want: bool) -> tuple[str, bool]:
    """A statement about the pair; tries for truth value ``want`` (labels ~50/50), returns its truth."""
    for _ in range(20):
        stmts = _nlvr2_statements(rng, left, right)
        text, pred = stmts[int(rng.integers(len(stmts)))]
        if pred(left, right) == want:
            return text, want
    return text, pred(left, right)


# ------------------------------------------------------------------ SNLI-VE
NEUTRAL_TEMPLATES = (
    "The {x} was drawn by a child.",
    "The {x} is made of paper.",
    "Someone is about to move the {x}.",
    "The {x} is the artist's favourite shape.",
    "The picture was painted yesterday.",
    "The {x} belongs to a teacher.",
)


def snli_hypothesis(rng: np.random.Generator, scene: Scene, label: str) -> str:
    """A hypothesis that the image entails, contradicts, or leaves undecided (``label``)."""
    objs = scene.objects
    o = objs[int(rng.integers(len(objs)))]
    if label == "neutral":
        return NEUTRAL_TEMPLATES[int(rng.integers(len(NEUTRAL_TEMPLATES)))].format(x=f"{o.colour} {o.shape}")
    truth = label == "entailment"
    kind = int(rng.integers(3))
    if kind == 0:  # existence
        if truth:
            return f"There is {article(o.colour)} {o.colour} {o.shape}."
        absent = [(c, s) for c in COLOURS for s in SHAPES if not scene.count(colour=c, shape=s)]
        c, s = absent[int(rng.integers(len(absent)))]
        return f"There is {article(c)} {c} {s}."
    if kind == 1:  # total count
        n = len(objs)
        if not truth:
            n = n + 1 if (n == 1 or rng.random() < 0.5) else n - 1
        return f"There {'is' if n == 1 else 'are'} {number_word(n)} {plural('shape', n)} in the picture."
    if len(objs) >= 2:  # relation
        i, j = (int(v) for v in rng.choice(len(objs), size=2, replace=False))
        a, b = objs[i], objs[j]
        rel = relation(a, b)
        if not truth:
            rel = {"to the left of": "to the right of", "to the right of": "to the left of",
                   "above": "below", "below": "above"}[rel]
        return f"The {a.colour} {a.shape} is {rel} the {b.colour} {b.shape}."
    colour = o.colour if truth else [c for c in COLOURS if c != o.colour][int(rng.integers(len(COLOURS) - 1))]
    return f"The {o.shape} is {colour}."


# ------------------------------------------------------------------ RefCOCO+
SIZE_MARGIN = 1.3  # "bigger"/"biggest" only when the areas differ by this factor


def referring_expressions(rng: np.random.Generator, scene: Scene, target: int, *, comparing: bool = False) -> list[str]:
    """1-3 appearance-only expressions (RefCOCO+ forbids location words) naming ``target`` uniquely.

    With ``comparing``, expressions that compare regions come first whenever the scene has any
    (real RefCOCO+ is collected on images with several objects of the target's category, so its
    expressions mostly tell the target apart from its own kind). Empty when no appearance words
    single the object out.
    """
    naming = naming_expressions(scene, target)
    if not comparing:
        exps = [naming[int(i)] for i in rng.permutation(len(naming))]
    else:
        compared = comparing_expressions(scene, target)
        exps = [compared[int(i)] for i in rng.permutation(len(compared))]
        exps += [naming[int(i)] for i in rng.permutation(len(naming))]
    k = int(rng.integers(1, 4))
    return exps[:k]


def naming_expressions(scene: Scene, target: int) -> list[str]:
    """Expressions the detector's class name ("red circle") answers on its own, plus the size word
    between two of a kind."""
    objs = scene.objects
    o = objs[target]
    same_kind = [p for p in objs if p.colour == o.colour and p.shape == o.shape]
    exps: list[str] = []
    if len(same_kind) == 1:
        exps.append(f"{o.colour} {o.shape}")
        if scene.count(colour=o.colour) == 1:
            exps.append(f"{o.colour} one")
        if scene.count(shape=o.shape) == 1:
            exps.append(f"the {o.shape}")
        exps.append(f"the {o.colour} {o.shape}")
    elif len(same_kind) == 2:
        other = same_kind[0] if same_kind[1] is o else same_kind[1]
        if o.area > SIZE_MARGIN * other.area:
            exps += [f"bigger {o.colour} {o.shape}", f"large {o.colour} {o.shape}"]
        elif other.area > SIZE_MARGIN * o.area:
            exps += [f"smaller {o.colour} {o.shape}", f"small {o.colour} {o.shape}"]
    return exps


def comparing_expressions(scene: Scene, target: int) -> list[str]:
    """Expressions that need regions compared, which no single class name answers: the biggest or
    smallest of a shape or a colour, and "the same colour / shape as" another object."""
    objs = scene.objects
    o = objs[target]
    exps: list[str] = []
    for group, noun in (([p for p in objs if p.shape == o.shape], o.shape),
                        ([p for p in objs if p.colour == o.colour], f"{o.colour} one")):
        others = [p.area for p in group if p is not o]
        if others and o.area > SIZE_MARGIN * max(others):
            exps.append(f"biggest {noun}")
        elif others and SIZE_MARGIN * o.area < min(others):
            exps.append(f"smallest {noun}")
    if scene.count(colour=o.colour, shape=o.shape) > 1:
        return exps
    for p in objs:
        # the anchor is named by the one word unique to it; the target shares the other one with it
        if p.shape != o.shape and p.colour == o.colour \
                and scene.count(shape=p.shape) == 1 < scene.count(shape=o.shape):
            exps.append(f"{o.shape} the same colour as the {p.shape}")
        if p.colour != o.colour and p.shape == o.shape \
                and scene.count(colour=p.colour) == 1 < scene.count(colour=o.colour):
            exps.append(f"{o.colour} one the same shape as the {p.colour} one")
    return exps
