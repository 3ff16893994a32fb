"""Small scenes, defective images and detector checkpoints that the region tests build themselves.

Independent of the mini-world generator on purpose: the detector tests need only a few images
with known boxes, and must not change when the generator does.
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

COLOURS = {"red": (220, 40, 40), "blue": (40, 70, 220), "green": (40, 180, 60)}
SHAPES = ("circle", "square")
CATEGORIES = [(i + 1, colour, shape) for i, (colour, shape) in enumerate((c, s) for c in COLOURS for s in SHAPES)]
CLASS_NAMES = [f"{c} {s}" for _, c, s in CATEGORIES]


def render_scene(rng: np.random.Generator, size: int, n_objects: int) -> tuple[Image.Image, list[dict]]:
    """A noisy grey background with ``n_objects`` non-overlapping coloured shapes."""
    base = rng.integers(90, 160, size=(size, size, 3)).astype(np.uint8)
    img = Image.fromarray(base, "RGB")
    draw = ImageDraw.Draw(img)
    objects: list[dict] = []
    tries = 0
    while len(objects) < n_objects and tries < 200:
        tries += 1
        side = int(rng.integers(size // 5, size // 3))
        x1, y1 = (int(v) for v in rng.integers(0, size - side, size=2))
        box = [x1, y1, x1 + side, y1 + side]
        if any(not (box[2] <= o["box"][0] or o["box"][2] <= box[0] or box[3] <= o["box"][1] or o["box"][3] <= box[1])
               for o in objects):
            continue
        cid, colour, shape = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
        xy = [box[0], box[1], box[2] - 1, box[3] - 1]
        (draw.ellipse if shape == "circle" else draw.rectangle)(xy, fill=COLOURS[colour], outline=(20, 20, 20))
        objects.append({"box": box, "category_id": cid, "colour": colour, "shape": shape})
    return img, objects


def scene_images(n: int, size: int = 64, seed: int = 0) -> tuple[list[np.ndarray], list[list[dict]]]:
    """``n`` rendered scenes as uint8 RGB arrays, with their objects."""
    rng = np.random.default_rng(seed)
    images, objects = [], []
    for _ in range(n):
        img, objs = render_scene(rng, size, n_objects=2)
        images.append(np.asarray(img))
        objects.append(objs)
    return images, objects


def write_coco_world(root: Path, *, n_images: int, size: int = 64, seed: int = 0) -> dict:
    """Write COCO train2014-style images + ``scenes.json`` (docs/design.md §4) below ``root``."""
    rng = np.random.default_rng(seed)
    scenes = {}
    for k in range(n_images):
        image_id = 100 + k
        rel = f"coco/images/train2014/COCO_train2014_{image_id:012d}.jpg"
        img, objects = render_scene(rng, size, n_objects=int(rng.integers(1, 4)))
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        img.save(root / rel, quality=95)
        scenes[f"coco/{image_id}"] = {"path": rel, "width": size, "height": size, "objects": objects}
    (root / "scenes.json").write_text(json.dumps(scenes, sort_keys=True))
    return scenes


def save_mini_checkpoint(path: Path, *, image_size: int = 64, seed: int = 0) -> Path:
    """A randomly initialized ``mini`` detector, norms calibrated on a rendered scene, saved the way
    ``train_detector`` saves one."""
    from pipeline.extract.detector.build import Detector, build_model, calibrate_norms
    from pipeline.extract.detector.extractor import RegionExtractor

    torch.manual_seed(seed)
    model, cfg = build_model("mini", num_classes=len(CLASS_NAMES), image_size=image_size)
    detector = Detector(model=model, cfg=cfg, preset="mini", class_names=list(CLASS_NAMES), attribute_names=[],
                        weights=None)
    scene = np.asarray(render_scene(np.random.default_rng(seed + 1), image_size, n_objects=2)[0])
    calibrate_norms(model, RegionExtractor(detector).to_input(scene)[0][None])
    meta = {"preset": "mini", "class_names": CLASS_NAMES, "image_size": image_size,
            "shapes": [s for _, _, s in CATEGORIES], "category_ids": [c for c, _, _ in CATEGORIES]}
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "meta": meta}, buf)
    path.write_bytes(buf.getvalue())
    return path


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def write_defect_images(folder: Path, seed: int = 0) -> dict[str, Path]:
    """One file per defect kind of the issue; returns {kind: path}.

    Decodable: ``cmyk``, ``greyscale``, ``png_alpha``, ``exif_rotated`` (stored 40 wide x 24 high,
    displayed 24 x 40). Rejected: ``truncated``, ``empty``, ``huge`` (a PNG header announcing
    60,000 x 60,000 pixels), ``missing`` (no file).
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    noise = lambda h, w: rng.integers(0, 255, size=(h, w, 3), dtype=np.uint8)  # noqa: E731
    paths = {kind: folder / name for kind, name in [
        ("cmyk", "cmyk.jpg"), ("greyscale", "grey.jpg"), ("png_alpha", "alpha.png"), ("exif_rotated", "exif.jpg"),
        ("truncated", "truncated.jpg"), ("empty", "empty.jpg"), ("huge", "huge.png"), ("missing", "missing.jpg")]}
    Image.fromarray(noise(48, 48)).convert("CMYK").save(paths["cmyk"], quality=90)
    Image.fromarray(noise(48, 48)).convert("L").save(paths["greyscale"], quality=90)
    rgba = np.concatenate([noise(48, 48), rng.integers(0, 255, size=(48, 48, 1), dtype=np.uint8)], axis=2)
    Image.fromarray(rgba, "RGBA").save(paths["png_alpha"])
    rotated = Image.fromarray(noise(24, 40))
    exif = rotated.getexif()
    exif[0x0112] = 6  # displayed rotated by 90 degrees
    rotated.save(paths["exif_rotated"], quality=90, exif=exif)
    buf = io.BytesIO()
    Image.fromarray(noise(64, 64)).save(buf, format="JPEG", quality=90)
    paths["truncated"].write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    paths["empty"].write_bytes(b"")
    ihdr = struct.pack(">IIBBBBB", 60_000, 60_000, 8, 2, 0, 0, 0)
    paths["huge"].write_bytes(b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr)
                              + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + _png_chunk(b"IEND", b""))
    return paths


DECODABLE = ("cmyk", "greyscale", "png_alpha", "exif_rotated")
REJECTED = {"truncated": "unreadable_image", "empty": "unreadable_image", "huge": "unreadable_image",
            "missing": "missing_image"}
