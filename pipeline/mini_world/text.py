"""Captions and region phrases generated from scene graphs, in the styles of COCO, CC, SBU and VG.

Every statement is true of the scene it describes: counts, colours, shapes and the relations of
:func:`pipeline.mini_world.scenes.relation`. Templates vary so that a model has to read the words.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from pipeline.mini_world.scenes import Obj, Scene, relation

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
BACKGROUND_WORDS = ("colourful", "blurry", "striped", "patterned", "textured", "soft", "noisy")


def number_word(n: int) -> str:
    return NUMBER_WORDS[n] if 0 <= n < len(NUMBER_WORDS) else str(n)


def plural(shape: str, n: int) -> str:
    return shape if n == 1 else shape + ("es" if shape.endswith("s") else "s")


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def tokenize(text: str) -> list[str]:
    """Karpathy-style tokens: lower-case words, punctuation dropped."""
    return re.findall(r"[a-z0-9]+", text.lower())


def sentence(text: str) -> str:
    text = text.strip()
    return text[0].upper() + text[1:] + ("" if text.endswith(".") else ".")


def size_word(obj: Obj, scene: Scene) -> str:
    """"big"/"small"/"" from the object's share of the picture."""
    frac = obj.area / float(scene.size[0] * scene.size[1])
    return "big" if frac > 0.085 else "small" if frac < 0.04 else ""


def noun_phrase(obj: Obj, scene: Scene | None = None, *, with_size: bool = False) -> str:
    size = size_word(obj, scene) if (with_size and scene is not None) else ""
    words = " ".join(w for w in (size, obj.colour, obj.shape) if w)
    return f"{article(words)} {words}"


def grouped_list(scene: Scene) -> str:
    """"a red circle, two blue squares and a green star" (grouped by colour and shape)."""
    groups = Counter((o.colour, o.shape) for o in scene.objects)
    parts = []
    for (colour, shape), n in sorted(groups.items(), key=lambda kv: (-kv[1], kv[0])):
        count = article(colour) if n == 1 else number_word(n)
        parts.append(f"{count} {colour} {plural(shape, n)}")
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def shape_counts(scene: Scene) -> str:
    groups = Counter(o.shape for o in scene.objects)
    parts = [f"{article(s) if n == 1 else number_word(n)} {plural(s, n)}"
             for s, n in sorted(groups.items(), key=lambda kv: (-kv[1], kv[0]))]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def there_be(phrase: str) -> str:
    """"there is a circle and two stars" / "there are two stars and a circle" (agrees with the first item)."""
    return f"there {'is' if phrase.split()[0] in ('a', 'an') else 'are'} {phrase}"


def relation_phrase(rng: np.random.Generator, scene: Scene) -> str | None:
    """"a red circle to the left of a blue square" for a random pair, or None for one object."""
    if len(scene.objects) < 2:
        return None
    i, j = rng.choice(len(scene.objects), size=2, replace=False)
    a, b = scene.objects[int(i)], scene.objects[int(j)]
    return f"{noun_phrase(a)} {relation(a, b)} {noun_phrase(b)}"


def coco_captions(rng: np.random.Generator, scene: Scene, k: int) -> list[str]:
    """``k`` different COCO-style captions of ``scene`` (sentence case, final period)."""
    n = len(scene.objects)
    bg = BACKGROUND_WORDS[int(rng.integers(len(BACKGROUND_WORDS)))]
    makers = [
        lambda: grouped_list(scene),
        lambda: f"{number_word(n)} {plural('shape', n)} on a {bg} background" if n > 1
        else f"a single {scene.objects[0].colour} {scene.objects[0].shape} on a {bg} background",
        lambda: f"{there_be(shape_counts(scene))} in the picture",
        lambda: relation_phrase(rng, scene) or f"{noun_phrase(scene.objects[0], scene, with_size=True)} alone",
        lambda: f"a picture of {grouped_list(scene)}",
        lambda: f"{noun_phrase(scene.objects[int(rng.integers(n))], scene, with_size=True)} among "
                f"{number_word(n)} {plural('shape', n)}" if n > 1 else f"just {grouped_list(scene)}",
        lambda: (relation_phrase(rng, scene) or grouped_list(scene)) + f", {number_word(n)} in all",
    ]
    order = rng.permutation(len(makers))
    out: list[str] = []
    for idx in order:
        text = sentence(makers[int(idx)]())
        if text not in out:
            out.append(text)
        if len(out) == k:
            break
    while len(out) < k:  # tiny scenes have fewer distinct templates; repeat with a prefix
        out.append(sentence(f"this shows {grouped_list(scene)}" + " too" * (len(out) - 1)))
    return out


def web_caption(rng: np.random.Generator, scene: Scene, style: str) -> str:
    """A one-line alt-text style caption: ``style`` is "cc" (plain) or "sbu" (first person)."""
    core = relation_phrase(rng, scene) if rng.random() < 0.4 else None
    core = core or grouped_list(scene)
    if style == "cc":
        prefix = ("", "illustration of ", "vector image of ", "stock photo of ", "")[int(rng.integers(5))]
        return f"{prefix}{core}"
    prefix = ("my drawing of ", "i made ", "look at ", "today i saw ", "")[int(rng.integers(5))]
    suffix = ("", " !", " on the wall", " in my notebook")[int(rng.integers(4))]
    return f"{prefix}{core}{suffix}"


def region_phrases(rng: np.random.Generator, scene: Scene) -> list[tuple[str, list[float]]]:
    """VG regions: one phrase per object (box x,y,w,h) plus one relation phrase (union box)."""
    regions = []
    for obj in scene.objects:
        words = [w for w in (size_word(obj, scene) if rng.random() < 0.5 else "", obj.colour, obj.shape) if w]
        phrase = " ".join(words)
        if rng.random() < 0.3:
            phrase = f"{article(phrase)} {phrase}"
        regions.append((phrase, obj.xywh()))
    if len(scene.objects) >= 2:
        i, j = (int(v) for v in rng.choice(len(scene.objects), size=2, replace=False))
        a, b = scene.objects[i], scene.objects[j]
        x1, y1 = min(a.box[0], b.box[0]), min(a.box[1], b.box[1])
        x2, y2 = max(a.box[2], b.box[2]), max(a.box[3], b.box[3])
        regions.append((f"{a.colour} {a.shape} {relation(a, b)} {b.colour} {b.shape}",
                        [float(x1), float(y1), float(x2 - x1), float(y2 - y1)]))
    return regions
