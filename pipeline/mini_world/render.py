"""Rendering scenes to pixels, encoding them, and keeping distinct scenes perceptually apart.

Backgrounds are smooth random colour fields (a few random low-frequency blobs), a gradient, a
texture (stripes or checks) and fine noise, all seeded per image. The low-frequency blobs are what
makes the perceptual hashes (DCT of a 32x32 thumbnail) of different scenes far apart, like real
photos; :class:`PhashRegistry` enforces a minimum distance by redrawing the background otherwise.
"""

from __future__ import annotations

import io
import math

import imagehash
import numpy as np
from PIL import Image, ImageDraw

from pipeline.mini_world.scenes import COLOURS, Obj, Scene

# pHash bits that must differ between any two distinct scenes (decontamination flags <= 4)
MIN_DISTINCT_PHASH = 14


def _desaturate(rgb: np.ndarray, keep: float = 0.55) -> np.ndarray:
    """Pull colours towards their grey value so that saturated shapes stand out."""
    grey = rgb.mean(axis=-1, keepdims=True)
    return grey + (rgb - grey) * keep


def _background(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """A float32 [h, w, 3] muted background: colour blobs + gradient + grey texture + grey noise.

    Gradient and texture are built from 1-D profiles (outer sums/products) and colours are muted
    before upsampling: thousands of images must render in seconds.
    """
    grid = int(rng.integers(3, 6))
    coarse = _desaturate(rng.uniform(60, 215, size=(grid, grid, 3))).astype(np.uint8)
    img = np.asarray(Image.fromarray(coarse, "RGB").resize((w, h), Image.BICUBIC), dtype=np.float32)
    x = np.arange(w, dtype=np.float32)
    y = np.arange(h, dtype=np.float32)
    angle = rng.uniform(0, 2 * math.pi)
    ramp = np.cos(angle) * x[None, :] / w + np.sin(angle) * y[:, None] / h
    img += ramp[..., None] * _desaturate(rng.uniform(-50, 50, size=3)).astype(np.float32)
    # texture: oriented stripes (sin(a+b) = sin a cos b + cos a sin b) or checks, random period
    k = np.float32(2 * math.pi / rng.uniform(6, 18))
    if rng.random() < 0.5:
        ax, by = k * np.cos(angle) * x, k * np.sin(angle) * y
        tex = np.cos(by)[:, None] * np.sin(ax)[None, :] + np.sin(by)[:, None] * np.cos(ax)[None, :]
    else:
        tex = np.sign(np.sin(k * y)[:, None] * np.sin(k * x)[None, :])
    grain = tex * np.float32(rng.uniform(3, 10)) + rng.integers(-7, 8, size=(h, w), dtype=np.int8)
    img += grain[..., None]
    return np.clip(img, 0, 255)


def _polygon(obj: Obj) -> list[tuple[float, float]] | None:
    x1, y1, x2, y2 = obj.box
    w, h = x2 - x1 - 1, y2 - y1 - 1
    cx, cy = x1 + w / 2.0, y1 + h / 2.0
    if obj.shape == "triangle":
        return [(cx, y1), (x1 + w, y1 + h), (x1, y1 + h)]
    if obj.shape == "diamond":
        return [(cx, y1), (x1 + w, cy), (cx, y1 + h), (x1, cy)]
    if obj.shape == "star":
        pts = []
        for k in range(10):
            r = 0.5 if k % 2 == 0 else 0.21
            a = -math.pi / 2 + k * math.pi / 5
            pts.append((cx + r * w * math.cos(a) * 1.0, cy + r * h * math.sin(a) * 1.05))
        return pts
    if obj.shape == "cross":
        t = 0.34
        return [(x1 + w * t, y1), (x1 + w * (1 - t), y1), (x1 + w * (1 - t), y1 + h * t), (x1 + w, y1 + h * t),
                (x1 + w, y1 + h * (1 - t)), (x1 + w * (1 - t), y1 + h * (1 - t)), (x1 + w * (1 - t), y1 + h),
                (x1 + w * t, y1 + h), (x1 + w * t, y1 + h * (1 - t)), (x1, y1 + h * (1 - t)), (x1, y1 + h * t),
                (x1 + w * t, y1 + h * t)]
    return None


def draw_shapes(canvas: Image.Image, objects: tuple[Obj, ...], rng: np.random.Generator) -> None:
    """Draw each object filled in its colour (slightly jittered) with a dark outline."""
    draw = ImageDraw.Draw(canvas)
    for obj in objects:
        base = np.array(COLOURS[obj.colour], dtype=np.int32)
        fill = tuple(int(v) for v in np.clip(base + rng.integers(-12, 13, size=3), 0, 255))
        outline = tuple(int(v) for v in base // 3)
        x1, y1, x2, y2 = obj.box
        if obj.shape == "circle":
            draw.ellipse((x1, y1, x2 - 1, y2 - 1), fill=fill, outline=outline, width=2)
        elif obj.shape == "square":
            draw.rectangle((x1, y1, x2 - 1, y2 - 1), fill=fill, outline=outline, width=2)
        else:
            draw.polygon(_polygon(obj), fill=fill, outline=outline, width=2)


def render(scene: Scene, attempt: int = 0) -> Image.Image:
    """RGB image of ``scene``; ``attempt`` > 0 redraws the background with a derived seed."""
    rng = np.random.default_rng([scene.bg_seed, attempt])
    w, h = scene.size
    canvas = Image.fromarray(_background(rng, w, h).astype(np.uint8), "RGB")
    draw_shapes(canvas, scene.objects, rng)
    return canvas


def encode(img: Image.Image, fmt: str = "JPEG", quality: int = 90) -> bytes:
    """Deterministic bytes (no EXIF, no timestamps) of ``img`` as JPEG or PNG."""
    buf = io.BytesIO()
    if fmt == "JPEG":
        img.save(buf, format="JPEG", quality=quality, optimize=False, progressive=False, subsampling=2)
    else:
        img.save(buf, format="PNG", optimize=False, compress_level=1)
    return buf.getvalue()


def phash_bits(img: Image.Image) -> np.ndarray:
    """The 64-bit pHash of ``img`` as a bool vector (imagehash.phash, the decontamination hash)."""
    return imagehash.phash(img).hash.flatten()


class PhashRegistry:
    """pHashes of every distinct scene rendered so far; refuses a new one closer than ``min_distance``."""

    def __init__(self, min_distance: int = MIN_DISTINCT_PHASH) -> None:
        self.min_distance = min_distance
        self._matrix = np.zeros((256, 64), dtype=bool)  # grows by doubling
        self.n = 0

    @property
    def hashes(self) -> np.ndarray:
        return self._matrix[: self.n]

    def min_distance_to(self, bits: np.ndarray) -> int:
        if not self.n:
            return 64
        return int((self.hashes != bits).sum(axis=1).min())

    def add(self, bits: np.ndarray) -> None:
        if self.n == len(self._matrix):
            self._matrix = np.concatenate([self._matrix, np.zeros_like(self._matrix)])
        self._matrix[self.n] = bits
        self.n += 1

    def render_distinct(self, scene: Scene, fmt: str = "JPEG", quality: int = 90) -> tuple[bytes, int]:
        """Render ``scene`` (redrawing the background until far from all others) -> (bytes, attempt)."""
        for attempt in range(50):
            data = encode(render(scene, attempt), fmt, quality)
            bits = phash_bits(Image.open(io.BytesIO(data)))
            if self.min_distance_to(bits) >= self.min_distance:
                self.add(bits)
                return data, attempt
        raise RuntimeError("could not render a perceptually distinct background in 50 attempts")


def reencode(data: bytes, rng: np.random.Generator, *, quality: int) -> tuple[bytes, tuple[int, int]]:
    """A near-duplicate of an encoded image: other JPEG quality, sometimes a tiny resize.

    Returns the new JPEG bytes and its (width, height).
    """
    img = Image.open(io.BytesIO(data)).convert("RGB")
    if rng.random() < 0.5:
        shrink = int(rng.integers(2, 9))
        img = img.resize((img.width - shrink, img.height - shrink), Image.BILINEAR)
    return encode(img, "JPEG", quality), img.size


def phash_distance(a: bytes, b: bytes) -> int:
    """Hamming distance of the pHashes of two encoded images."""
    return int((phash_bits(Image.open(io.BytesIO(a))) != phash_bits(Image.open(io.BytesIO(b)))).sum())
