"""Robust image decoding shared by ingest (validity checks) and region extraction (pixels).

Real image folders hold every kind of file: CMYK JPEGs, palette PNGs with transparency, 16-bit
greyscale, phone photos that rely on EXIF orientation, 0-byte files left by failed downloads,
truncated JPEGs, and the occasional header claiming billions of pixels. :func:`decode_image`
turns all usable ones into the same thing (uint8 RGB, upright) and refuses the rest with an
:class:`ImageRejected` whose ``reason`` is a contract reject reason (docs/design.md §5):
``missing_image`` (no file) or ``unreadable_image`` (empty, truncated, undecodable, too large).

Pillow's global switches (``ImageFile.LOAD_TRUNCATED_IMAGES``, ``Image.MAX_IMAGE_PIXELS``) are
never changed: other code in the same process may rely on them.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

MISSING_IMAGE = "missing_image"
UNREADABLE_IMAGE = "unreadable_image"

# 100 megapixels: above any real dataset image (COCO/VG/CC are <= ~20 MP) and ~300 MB as RGB.
DEFAULT_MAX_PIXELS = 100_000_000

# How far from the end of a file the end-of-image marker may sit (some encoders pad with zeros).
_TAIL_BYTES = 64


class ImageRejected(Exception):
    """An image that cannot be used; ``reason`` is ``missing_image`` or ``unreadable_image``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _check_file(path: Path) -> None:
    """Raise ImageRejected for a path that is absent, not a regular file, or empty."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ImageRejected(MISSING_IMAGE, f"{path}: no such file") from None
    except OSError as err:
        raise ImageRejected(MISSING_IMAGE, f"{path}: cannot stat ({err})") from None
    if not path.is_file():
        raise ImageRejected(MISSING_IMAGE, f"{path}: not a regular file")
    if size == 0:
        raise ImageRejected(UNREADABLE_IMAGE, f"{path}: empty file (0 bytes)")


def _open_checked(path: Path, max_pixels: int) -> Image.Image:
    """Open ``path`` lazily (header only) and refuse decompression bombs before any pixel is decoded."""
    try:
        with warnings.catch_warnings():
            # our own limit below decides; Pillow's warning at its default limit is noise here
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(path)
    except Image.DecompressionBombError as err:
        raise ImageRejected(UNREADABLE_IMAGE, f"{path}: decompression bomb ({err})") from None
    except UnidentifiedImageError:
        raise ImageRejected(UNREADABLE_IMAGE, f"{path}: not a recognized image format") from None
    except (OSError, ValueError, SyntaxError) as err:  # PIL raises SyntaxError for some bad headers
        raise ImageRejected(UNREADABLE_IMAGE, f"{path}: bad header ({err})") from None
    width, height = image.size
    if width <= 0 or height <= 0:
        image.close()
        raise ImageRejected(UNREADABLE_IMAGE, f"{path}: invalid size {width}x{height}")
    if width * height > max_pixels:
        image.close()
        raise ImageRejected(
            UNREADABLE_IMAGE,
            f"{path}: decompression bomb: {width}x{height} = {width * height} pixels > limit {max_pixels}",
        )
    return image


def _to_rgb(image: Image.Image) -> Image.Image:
    """Convert any Pillow mode to RGB; transparency is composited on white."""
    mode = image.mode
    if mode == "RGB":
        return image
    if mode.startswith("I;16"):
        # 16-bit greyscale: keep the top 8 bits instead of Pillow's clipping at 255
        arr = (np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8)
        return Image.fromarray(arr, mode="L").convert("RGB")
    if mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    elif mode in ("LA", "La", "PA", "RGBa"):
        image = image.convert("RGBA")
    if image.mode == "RGBA":
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, image).convert("RGB")
    return image.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV, I, F


def decode_image(path: Path | str, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode an image file into upright RGB pixels.

    Args:
        path: the image file (any format Pillow reads: JPEG, PNG, GIF (first frame), TIFF, ...).
        max_pixels: refuse images whose header announces more than this many pixels (width *
            height), before decoding anything.

    Returns:
        uint8 array [H, W, 3], RGB, with the EXIF orientation applied (so H, W are the displayed
        height and width), greyscale/palette/CMYK converted and alpha composited on white.

    Raises:
        ImageRejected: reason ``missing_image`` for a missing path; ``unreadable_image`` for an
            empty, truncated, undecodable or oversized file (``detail`` says which).
    """
    path = Path(path)
    _check_file(path)
    image = _open_checked(path, max_pixels)
    try:
        with image:
            image.load()  # raises OSError on truncated data (LOAD_TRUNCATED_IMAGES stays False)
            upright = ImageOps.exif_transpose(image)
            rgb = _to_rgb(upright)
            arr = np.asarray(rgb, dtype=np.uint8)
    except ImageRejected:
        raise
    except Image.DecompressionBombError as err:
        raise ImageRejected(UNREADABLE_IMAGE, f"{path}: decompression bomb ({err})") from None
    except (OSError, ValueError, SyntaxError, EOFError, MemoryError) as err:
        raise ImageRejected(UNREADABLE_IMAGE, f"{path}: cannot decode ({type(err).__name__}: {err})") from None
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ImageRejected(UNREADABLE_IMAGE, f"{path}: decoded to unexpected shape {arr.shape}")
    return np.ascontiguousarray(arr)


def _tail_complete(path: Path, fmt: str | None) -> str | None:
    """For JPEG/PNG, check that the end-of-image marker is present; return a detail if not.

    A download cut short keeps a valid header, so a header-only probe would accept it; the end
    marker is a cheap (one seek) way to catch most such files without decoding.
    """
    if fmt not in ("JPEG", "PNG"):
        return None
    size = path.stat().st_size
    with path.open("rb") as fh:
        fh.seek(max(0, size - _TAIL_BYTES))
        tail = fh.read()
    if fmt == "JPEG":
        ok = b"\xff\xd9" in tail.rstrip(b"\x00\r\n ")[-_TAIL_BYTES:]
        return None if ok else "truncated: no JPEG end-of-image marker (FFD9)"
    ok = b"IEND" in tail
    return None if ok else "truncated: no PNG IEND chunk"


def probe_image_detail(
    path: Path | str, *, full: bool = False, max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[str | None, str]:
    """Check an image file: ``(reject reason, human-readable detail)``, ``(None, "")`` if it is usable.

    Cheap by default: existence, non-empty, a parseable header within ``max_pixels``, and for
    JPEG/PNG the end-of-image marker. With ``full=True`` the image is decoded completely
    (:func:`decode_image`), which also catches corruption inside the compressed data. The reason
    is ``"missing_image"`` or ``"unreadable_image"``.
    """
    path = Path(path)
    try:
        if full:
            decode_image(path, max_pixels=max_pixels)
            return None, ""
        _check_file(path)
        with _open_checked(path, max_pixels) as image:
            fmt = image.format
        problem = _tail_complete(path, fmt)
        if problem:
            return UNREADABLE_IMAGE, f"{path}: {problem}"
        return None, ""
    except ImageRejected as rej:
        return rej.reason, rej.detail
    except OSError as err:  # e.g. permission denied while reading the tail
        return UNREADABLE_IMAGE, f"{path}: {err}"

