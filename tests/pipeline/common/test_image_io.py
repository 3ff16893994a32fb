"""pipeline.common.image_io on images each test writes: every mode, EXIF, and every kind of broken file."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.images import probe_image
from pipeline.common.image_io import ImageRejected, decode_image, probe_image_detail


def _noise_jpeg(path: Path, size=(64, 48), quality=90) -> Path:
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path, quality=quality)
    return path


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _huge_header_png(path: Path, width: int, height: int) -> Path:
    """A PNG whose IHDR claims width x height but carries almost no pixel data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    data = b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr)
    data += _png_chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + _png_chunk(b"IEND", b"")
    path.write_bytes(data)
    return path


def _rejected(path, **kw) -> ImageRejected:
    with pytest.raises(ImageRejected) as info:
        decode_image(path, **kw)
    return info.value


def test_rgb_jpeg_roundtrip(tmp_path):
    path = _noise_jpeg(tmp_path / "a.jpg")
    arr = decode_image(path)
    assert arr.dtype == np.uint8 and arr.shape == (48, 64, 3)
    assert probe_image(path) is None and probe_image(path, full=True) is None


def test_missing_and_directory_are_missing_image(tmp_path):
    assert _rejected(tmp_path / "nope.jpg").reason == "missing_image"
    assert _rejected(tmp_path).reason == "missing_image"
    assert probe_image(tmp_path / "nope.jpg") == "missing_image"


def test_empty_file_is_unreadable(tmp_path):
    path = tmp_path / "empty.jpg"
    path.write_bytes(b"")
    rej = _rejected(path)
    assert rej.reason == "unreadable_image" and "empty" in rej.detail
    assert probe_image(path) == "unreadable_image"


def test_garbage_is_unreadable(tmp_path):
    path = tmp_path / "garbage.jpg"
    path.write_bytes(b"<html>404 not found</html>" * 10)
    assert _rejected(path).reason == "unreadable_image"
    assert probe_image(path) == "unreadable_image"


def test_truncated_jpeg(tmp_path):
    full = _noise_jpeg(tmp_path / "full.jpg", size=(128, 128)).read_bytes()
    path = tmp_path / "cut.jpg"
    path.write_bytes(full[: len(full) // 2])
    rej = _rejected(path)
    assert rej.reason == "unreadable_image" and "truncated" in rej.detail
    # the header survives the cut; the cheap probe still catches it by the missing end marker
    reason, detail = probe_image_detail(path)
    assert reason == "unreadable_image" and "FFD9" in detail
    assert probe_image(path, full=True) == "unreadable_image"


def test_truncated_png(tmp_path):
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(tmp_path / "full.png")
    data = (tmp_path / "full.png").read_bytes()
    path = tmp_path / "cut.png"
    path.write_bytes(data[: len(data) // 2])
    assert _rejected(path).reason == "unreadable_image"
    assert probe_image(path) == "unreadable_image"


def test_cmyk_jpeg_becomes_rgb(tmp_path):
    path = tmp_path / "cmyk.jpg"
    Image.new("CMYK", (16, 16), (0, 255, 255, 0)).save(path, quality=95)  # pure red in CMYK
    assert Image.open(path).mode == "CMYK"
    arr = decode_image(path)
    assert arr.shape == (16, 16, 3)
    np.testing.assert_allclose(arr.reshape(-1, 3).mean(0), [255, 0, 0], atol=6)


def test_greyscale_l(tmp_path):
    path = tmp_path / "grey.png"
    Image.new("L", (10, 7), 77).save(path)
    arr = decode_image(path)
    assert arr.shape == (7, 10, 3) and (arr == 77).all()


def test_16bit_greyscale_keeps_top_bits(tmp_path):
    path = tmp_path / "grey16.png"
    Image.fromarray(np.full((4, 5), 0x8123, dtype=np.uint16)).save(path)
    arr = decode_image(path)
    assert arr.shape == (4, 5, 3) and (arr == 0x81).all()


def test_rgba_png_alpha_on_white(tmp_path):
    rgba = np.zeros((2, 3, 4), dtype=np.uint8)
    rgba[0, 0] = (255, 0, 0, 255)  # opaque red
    rgba[0, 1] = (255, 0, 0, 0)  # fully transparent -> white
    rgba[0, 2] = (0, 0, 0, 128)  # half-transparent black -> mid grey
    rgba[1, :] = (0, 0, 255, 255)
    path = tmp_path / "rgba.png"
    Image.fromarray(rgba, mode="RGBA").save(path)
    arr = decode_image(path).astype(int)
    assert tuple(arr[0, 0]) == (255, 0, 0)
    assert tuple(arr[0, 1]) == (255, 255, 255)
    assert all(abs(v - 127) <= 1 for v in arr[0, 2])
    assert tuple(arr[1, 1]) == (0, 0, 255)


def test_palette_with_transparency(tmp_path):
    img = Image.new("P", (4, 4), 0)
    img.putpalette([0, 255, 0] + [0, 0, 0] * 255)  # index 0 green, index 1 black
    img.putpixel((0, 0), 1)
    path = tmp_path / "pal.png"
    img.save(path, transparency=1)
    arr = decode_image(path)
    assert tuple(arr[0, 0]) == (255, 255, 255)  # transparent index composited on white
    assert tuple(arr[3, 3]) == (0, 255, 0)


def test_exif_orientation_applied(tmp_path):
    stored = np.zeros((20, 40, 3), dtype=np.uint8)  # H=20, W=40: left half red, right half blue
    stored[:, :20] = (255, 0, 0)
    stored[:, 20:] = (0, 0, 255)
    img = Image.fromarray(stored)
    exif = img.getexif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    path = tmp_path / "rot.jpg"
    img.save(path, quality=95, exif=exif)
    arr = decode_image(path).astype(int)
    assert arr.shape == (40, 20, 3)
    # rotating clockwise puts the stored left (red) half on top
    assert arr[5, 10, 0] > 200 and arr[5, 10, 2] < 60
    assert arr[35, 10, 2] > 200 and arr[35, 10, 0] < 60


def test_huge_dimension_header_refused_without_decoding(tmp_path):
    path = _huge_header_png(tmp_path / "bomb.png", 50_000, 50_000)
    rej = _rejected(path)
    assert rej.reason == "unreadable_image" and "decompression bomb" in rej.detail
    assert probe_image(path) == "unreadable_image"


def test_max_pixels_keyword(tmp_path):
    path = _noise_jpeg(tmp_path / "a.jpg", size=(100, 100))
    assert "decompression bomb" in _rejected(path, max_pixels=9_999).detail
    assert decode_image(path, max_pixels=10_000).shape == (100, 100, 3)
    assert probe_image(path, max_pixels=9_999) == "unreadable_image"
    # a header above the limit is refused even when it is too broken to decode
    bomb = _huge_header_png(tmp_path / "wide.png", 20_000, 10)
    assert "200000 pixels" in _rejected(bomb, max_pixels=100_000).detail
