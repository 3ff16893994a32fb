"""The state shared by the dataset writers while one mini world is generated.

:class:`World` owns the output directory (a temporary one until the run succeeds), every image
written so far with its scene graph, where each image is used (dataset/split), the world-wide
Flickr photo-id allocator, the pHash registry that keeps distinct scenes apart, and the ground
truth of planted overlaps and defects. Writers run in a fixed order; each draws from its own
seeded Generator, so the tree is byte-identical for the same params.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable, Mapping, TypeVar

import numpy as np

from pipeline.mini_world.render import PhashRegistry, phash_distance, reencode
from pipeline.mini_world.scenes import Scene, dataset_rng, sample_scene
from pipeline.mini_world.urlforms import PhotoIds
from pipeline.params.world import MiniWorldConfig

T = TypeVar("T")


@dataclass
class ImageRec:
    """One image file of the world. ``origin`` names the scene it shows (copies share it)."""

    source: str
    image_id: str
    relpath: str
    scene: Scene
    data: bytes
    origin: str

    @property
    def key(self) -> str:
        return f"{self.source}/{self.image_id}"


class World:
    """Everything the writers share. ``root`` is the directory files are written below."""

    def __init__(self, cfg: MiniWorldConfig, seed: int, root: Path, eval_splits: Mapping[str, tuple[str, ...]]):
        self.cfg = cfg
        self.seed = seed
        self.root = root
        self.eval_splits = {k: tuple(v) for k, v in eval_splits.items()}
        self.phash = PhashRegistry()
        self.photos = PhotoIds()
        self.images: dict[str, ImageRec] = {}
        self.broken: set[str] = set()  # image keys whose file is planted as defective (not in scenes.json)
        self.reserved: set[str] = set()  # images no other dataset may use (defect carriers, copies)
        self.usage: dict[str, set[tuple[str, str]]] = defaultdict(set)
        self.overlaps: list[dict[str, Any]] = []  # "matches" filled in by finalize (usage is complete then)
        self.controls: list[dict[str, Any]] = []
        self.defects: list[dict[str, Any]] = []
        self.counts: dict[str, int] = {}
        self.info: dict[str, Any] = {}  # facts one writer leaves for later ones (eval ids, urls)

    # ------------------------------------------------------------------ rngs and files
    def rng(self, dataset: str) -> np.random.Generator:
        return dataset_rng(self.seed, dataset)

    def write_bytes(self, relpath: str, data: bytes) -> None:
        path = self.root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def write_json(self, relpath: str, obj: Any, *, indent: int | None = None) -> None:
        """JSON with sorted keys; compact (one line) like the real dumps unless ``indent``."""
        text = json.dumps(obj, sort_keys=True, indent=indent, separators=None if indent else (",", ":"))
        self.write_bytes(relpath, (text + "\n").encode())

    def read_json(self, relpath: str) -> Any:
        """A JSON file an earlier writer wrote (pipeline/mini_world/eval_extension.py extends some)."""
        return json.loads((self.root / relpath).read_bytes())

    def write_lines(self, relpath: str, lines: list[bytes]) -> None:
        self.write_bytes(relpath, b"".join(line + b"\n" for line in lines))

    def append_lines(self, relpath: str, lines: list[bytes]) -> None:
        """Lines added at the end of a file an earlier writer wrote (pipeline/mini_world/eval_extension.py)."""
        with (self.root / relpath).open("ab") as f:
            f.write(b"".join(line + b"\n" for line in lines))

    # ------------------------------------------------------------------ images
    def new_image(self, rng: np.random.Generator, source: str, image_id: str, relpath: str, *, fmt: str = "JPEG",
                  min_objects: int = 1, require: list[tuple[str, str]] | None = None,
                  accept: Callable[[Scene], bool] | None = None) -> ImageRec:
        """Sample a new scene (again, up to 100 draws, until ``accept`` takes it), render it
        perceptually distinct from all others, write it."""
        for _ in range(100):
            scene = sample_scene(rng, size=self.cfg.image_size, max_objects=max(self.cfg.max_objects, min_objects),
                                 min_objects=min_objects, require=require)
            if accept is None or accept(scene):
                break
        else:
            raise RuntimeError(f"no scene for {source}/{image_id} in 100 draws")
        data, _ = self.phash.render_distinct(scene, fmt, self.cfg.jpeg_quality)
        return self._add(ImageRec(source, image_id, relpath, scene, data, f"{source}/{image_id}"))

    def copy_image(self, src_key: str, source: str, image_id: str, relpath: str,
                   rng: np.random.Generator | None = None, quality: int | None = None) -> ImageRec:
        """The same picture under another source/id: byte copy, or a re-encode when ``quality``."""
        src = self.images[src_key]
        data, scene = src.data, src.scene
        if quality is not None:
            assert rng is not None
            for _ in range(20):  # a re-encode must stay a near duplicate (pHash <= 4); nearly always at once
                data, (w, h) = reencode(src.data, rng, quality=quality)
                if phash_distance(data, src.data) <= 2:
                    break
            else:
                data, (w, h) = reencode(src.data, np.random.default_rng(0), quality=95)
            scene = src.scene.scaled(w, h)
        return self._add(ImageRec(source, image_id, relpath, scene, data, src.origin))

    def _add(self, rec: ImageRec) -> ImageRec:
        if rec.key in self.images:
            raise RuntimeError(f"image {rec.key} generated twice")
        self.images[rec.key] = rec
        self.write_bytes(rec.relpath, rec.data)
        return rec

    def use(self, key: str, dataset: str, split: str) -> None:
        self.usage[key].add((dataset, split))

    def break_image(self, key: str, kind: str, dataset: str) -> None:
        """Plant an image defect: ``truncated`` (unreadable_image), ``empty`` (unreadable_image) or
        ``missing`` (missing_image)."""
        rec = self.images[key]
        path = self.root / rec.relpath
        if kind == "truncated":
            path.write_bytes(rec.data[: len(rec.data) * 2 // 5])
        elif kind == "empty":
            path.write_bytes(b"")
        elif kind == "missing":
            path.unlink()
        else:
            raise ValueError(kind)
        self.broken.add(key)
        self.reserved.add(key)
        reason = "missing_image" if kind == "missing" else "unreadable_image"
        self.defect(dataset, rec.relpath, rec.image_id, "image_id", reason, f"{kind} image file")

    # ------------------------------------------------------------------ ground truth
    def defect(self, dataset: str, file: str, locator: Any, locator_kind: str, reason: str, detail: str) -> None:
        self.defects.append({"dataset": dataset, "file": file, "locator": locator, "locator_kind": locator_kind,
                             "reason": reason, "detail": detail})

    def overlap(self, dataset: str, image_id: str, url: str | None, reason: str, targets: list[str],
                variant: str) -> None:
        """A pretraining image that decontamination must remove; ``targets`` are eval image keys."""
        self.overlaps.append({"dataset": dataset, "image_id": image_id, "url": url, "reason": reason,
                              "targets": sorted(set(targets)), "variant": variant})

    def control(self, dataset: str, image_id: str, url: str | None, shares: str, variant: str) -> None:
        """A pretraining image that shares pixels/ids with a *train* image and must be kept."""
        self.controls.append({"dataset": dataset, "image_id": image_id, "url": url, "reason": None,
                              "shares_with": shares, "variant": variant})

    def eval_matches(self, key: str) -> list[str]:
        """``<dataset>/<split>/<image_id>`` of every eval use of image ``key``."""
        image_id = key.split("/", 1)[1]
        return sorted(f"{d}/{s}/{image_id}" for d, s in self.usage.get(key, ()) if s in self.eval_splits.get(d, ()))

    def is_eval(self, key: str) -> bool:
        return bool(self.eval_matches(key))

    def planted(self) -> dict[str, Any]:
        """planted.json (docs/design.md §4): overlaps with their eval matches resolved."""
        overlaps = []
        for o in self.overlaps:
            matches = sorted({m for t in o["targets"] for m in self.eval_matches(t)})
            if not matches:
                raise RuntimeError(f"planted overlap {o['dataset']}/{o['image_id']} matches no eval image")
            overlaps.append({k: v for k, v in o.items() if k != "targets"} | {"matches": matches})
        for c in self.controls:
            if self.is_eval(c["shares_with"]):
                raise RuntimeError(f"control {c['dataset']}/{c['image_id']} shares an eval image")
        return {"seed": self.seed, "overlaps": overlaps, "controls": self.controls, "defects": self.defects,
                "eval_splits": {k: list(v) for k, v in sorted(self.eval_splits.items())}}

    def scenes(self) -> dict[str, Any]:
        """scenes.json: every readable image's scene graph, plus ``scene`` (its origin) for copies."""
        out = {}
        for key in sorted(self.images):
            if key in self.broken:
                continue
            rec = self.images[key]
            out[key] = rec.scene.to_json(rec.relpath) | {"scene": rec.origin}
        return out


def split_plan(rng: np.random.Generator, n: int, fractions: dict[str, float], rest: str) -> list[str]:
    """A shuffled list of ``n`` split names: each named split gets max(1, round(frac * n)) items
    (never more than leaves one for ``rest``), ``rest`` takes the remainder."""
    names: list[str] = []
    for name, frac in fractions.items():
        names += [name] * min(max(1, round(frac * n)), max(0, n - len(names) - 1))
    names += [rest] * (n - len(names))
    return [names[int(i)] for i in rng.permutation(n)]


def insert_randomly(rng: np.random.Generator, rows: list, extra: list) -> list:
    """``rows`` with each item of ``extra`` inserted at a random position (order of rows kept)."""
    out = list(rows)
    for item in extra:
        out.insert(int(rng.integers(0, len(out) + 1)), item)
    return out


def distinct_draws(draw: Callable[[], T], key: Callable[[T], Hashable], n: int) -> list[T]:
    """Up to ``n`` results of ``draw()`` with different ``key``s, in draw order; gives up after ``4 n`` draws
    (a scene may not have ``n`` different texts to say)."""
    out: dict[Hashable, T] = {}
    for _ in range(4 * n):
        item = draw()
        out.setdefault(key(item), item)
        if len(out) == n:
            break
    return list(out.values())
