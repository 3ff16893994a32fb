"""The reject reason of one image file (ingest keeps the detail too: ``probe_image_detail``)."""

from __future__ import annotations

from pathlib import Path

from pipeline.common.image_io import DEFAULT_MAX_PIXELS, probe_image_detail


def probe_image(path: Path | str, *, full: bool = False, max_pixels: int = DEFAULT_MAX_PIXELS) -> str | None:
    """None if the image at ``path`` is usable, else ``"missing_image"`` or ``"unreadable_image"``
    (``full``: decode it completely instead of the cheap header and end-marker checks)."""
    return probe_image_detail(path, full=full, max_pixels=max_pixels)[0]
