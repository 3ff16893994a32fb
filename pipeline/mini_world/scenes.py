"""Scene graphs of the mini world: coloured shapes on a background, sampled from a seeded RNG.

A :class:`Scene` is the ground truth every text generator and the detector work from: a list of
objects (shape, colour, pixel box) plus the seed of its background. Relations (left of, above)
and counts are computed from it, so every caption, answer and label is derivable from the pixels.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 35, 35),
    "green": (30, 160, 55),
    "blue": (35, 75, 215),
    "yellow": (240, 205, 30),
    "purple": (140, 50, 185),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond", "star", "cross")

# category ids 1..30, colour-major (the order of instances files' `categories`)
CATEGORIES: list[tuple[str, str]] = [(c, s) for c in COLOURS for s in SHAPES]
CATEGORY_ID: dict[tuple[str, str], int] = {cs: i + 1 for i, cs in enumerate(CATEGORIES)}

# boxes may overlap a little, never so much that an object hides another
MAX_PAIR_IOU = 0.08
MIN_SIDE_FRAC, MAX_SIDE_FRAC = 0.16, 0.40


@dataclass(frozen=True)
class Obj:
    """One shape; ``box`` is (x1, y1, x2, y2) in pixels, integer-valued, x2/y2 exclusive."""

    shape: str
    colour: str
    box: tuple[int, int, int, int]

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"

    @property
    def category_id(self) -> int:
        return CATEGORY_ID[(self.colour, self.shape)]

    @property
    def centre(self) -> tuple[float, float]:
        x1, y1, x2, y2 = self.box
        return (x1 + x2) / 2.0, (y1 + y2) / 2.0

    @property
    def area(self) -> int:
        x1, y1, x2, y2 = self.box
        return (x2 - x1) * (y2 - y1)

    def xywh(self) -> list[float]:
        x1, y1, x2, y2 = self.box
        return [float(x1), float(y1), float(x2 - x1), float(y2 - y1)]


@dataclass(frozen=True)
class Scene:
    """What one picture shows. ``bg_seed`` fixes the background; ``size`` = (width, height)."""

    objects: tuple[Obj, ...]
    bg_seed: int
    size: tuple[int, int]

    def count(self, *, shape: str | None = None, colour: str | None = None) -> int:
        return sum(1 for o in self.objects if (shape is None or o.shape == shape)
                   and (colour is None or o.colour == colour))

    def scaled(self, width: int, height: int) -> "Scene":
        """The same scene at another resolution (boxes rescaled and rounded)."""
        sx, sy = width / self.size[0], height / self.size[1]
        objs = tuple(Obj(o.shape, o.colour, (round(o.box[0] * sx), round(o.box[1] * sy),
                                             round(o.box[2] * sx), round(o.box[3] * sy))) for o in self.objects)
        return Scene(objs, self.bg_seed, (width, height))

    def to_json(self, path: str) -> dict:
        """The scenes.json entry (docs/design.md §4)."""
        return {
            "path": path,
            "width": self.size[0],
            "height": self.size[1],
            "objects": [{"shape": o.shape, "colour": o.colour, "box": list(o.box), "category_id": o.category_id}
                        for o in self.objects],
        }


def iou(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> float:
    ix = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union else 0.0


def dataset_rng(seed: int, name: str) -> np.random.Generator:
    """The one Generator of a dataset family, derived from the root seed and a stable name hash."""
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))


def sample_scene(rng: np.random.Generator, *, size: int, max_objects: int, min_objects: int = 1,
                 require: list[tuple[str, str]] | None = None) -> Scene:
    """Draw 1..max_objects shapes at varied sizes and positions that overlap at most a little.

    ``require`` forces some (colour, shape) pairs into the scene (NLVR2 and VCR use it to make
    statements true or to get enough objects to talk about).
    """
    n = int(rng.integers(min_objects, max_objects + 1))
    kinds = list(require or [])
    while len(kinds) < n:
        kinds.append((str(rng.choice(list(COLOURS))), str(rng.choice(SHAPES))))
    objs: list[Obj] = []
    for colour, shape in kinds:
        for _ in range(60):  # rejection sampling; give up on this object if the canvas is full
            side = int(rng.uniform(MIN_SIDE_FRAC, MAX_SIDE_FRAC) * size)
            aspect = 1.0 if shape in ("circle", "square", "star", "cross") else float(rng.uniform(0.8, 1.25))
            w, h = side, max(8, int(side * aspect))
            h = min(h, size - 2)
            x1 = int(rng.integers(1, size - w))
            y1 = int(rng.integers(1, size - h))
            box = (x1, y1, x1 + w, y1 + h)
            if all(iou(box, o.box) <= MAX_PAIR_IOU for o in objs) and _centres_apart(box, objs):
                objs.append(Obj(shape, colour, box))
                break
    if not objs:
        raise RuntimeError("could not place any object (image_size too small?)")
    bg_seed = int(rng.integers(0, 2**63 - 1))
    return Scene(tuple(objs), bg_seed, (size, size))


def _centres_apart(box: tuple[int, int, int, int], objs: list[Obj], min_gap: float = 6.0) -> bool:
    """Keep centres a few pixels apart in x and y so that left/right/above are unambiguous."""
    cx, cy = (box[0] + box[2]) / 2.0, (box[1] + box[3]) / 2.0
    for o in objs:
        ox, oy = o.centre
        if abs(cx - ox) < min_gap or abs(cy - oy) < min_gap:
            return False
    return True


def relation(a: Obj, b: Obj) -> str:
    """The dominant spatial relation of ``a`` to ``b``: left of / right of / above / below."""
    (ax, ay), (bx, by) = a.centre, b.centre
    dx, dy = ax - bx, ay - by
    if abs(dx) >= abs(dy):
        return "to the left of" if dx < 0 else "to the right of"
    return "above" if dy < 0 else "below"
