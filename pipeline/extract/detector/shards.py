"""Feature shard files (docs/design.md §8): deterministic safetensors, one per ~1,000 images.

A shard holds the regions of m images concatenated: ``features`` f16 [N, D], ``boxes`` f32 [N, 4]
(x1, y1, x2, y2 pixels), ``norm_bb`` f16 [N, 7], ``conf`` f16 [N], ``soft_labels`` f16 [N, C+1]
(background first), ``offsets`` i64 [m+1] (image j owns rows offsets[j]:offsets[j+1]), ``image_hw``
i32 [m, 2]; the safetensors metadata ``image_ids`` is the JSON list of the m image ids. Given-box
shards add metadata ``box_ids``: per image, the JSON list of the ids of its boxes (VCR object
index / RefCOCO annotation id), in row order.

The safetensors library writes its metadata map in hash order (different bytes on every run), so
the file is encoded here: header JSON with sorted keys and no spaces, padded to 8 bytes, tensors
in name order. Any safetensors reader (``safetensors.safe_open``) reads it.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from pipeline.extract.detector.extractor import Regions

SHARD_PATTERN = "shard-{:05d}.safetensors"
_DTYPES = {np.dtype("float16"): "F16", np.dtype("float32"): "F32", np.dtype("int64"): "I64",
           np.dtype("int32"): "I32"}


def shard_name(index: int) -> str:
    return SHARD_PATTERN.format(index)


def encode_safetensors(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> bytes:
    """Serialize numpy arrays + string metadata to safetensors bytes, deterministically."""
    header: dict[str, object] = {"__metadata__": dict(sorted(metadata.items()))}
    chunks, offset = [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        if arr.dtype not in _DTYPES:
            raise TypeError(f"tensor {name!r}: dtype {arr.dtype} is not one of {sorted(map(str, _DTYPES))}")
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _DTYPES[arr.dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def encode_shard(image_ids: Sequence[str], regions: Sequence[Regions], *, feature_dim: int, num_classes: int,
                 box_ids: Sequence[Sequence[int | str]] | None = None) -> bytes:
    """The bytes of one shard for ``regions`` of ``image_ids`` (same order).

    ``feature_dim`` (D) and ``num_classes`` (C+1) fix the array widths even for an empty shard.
    """
    if len(image_ids) != len(regions):
        raise ValueError(f"{len(image_ids)} image ids for {len(regions)} region sets")
    counts = [len(r.boxes) for r in regions]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def stack(get, width: int, dtype) -> np.ndarray:
        parts = [np.asarray(get(r)).reshape(-1, width) for r in regions]
        return (np.concatenate(parts) if parts else np.zeros((0, width))).astype(dtype)

    tensors = {
        "features": stack(lambda r: r.features, feature_dim, np.float16),
        "boxes": stack(lambda r: r.boxes, 4, np.float32),
        "norm_bb": stack(lambda r: r.norm_bb, 7, np.float16),
        "conf": stack(lambda r: r.conf, 1, np.float16).reshape(-1),
        "soft_labels": stack(lambda r: r.soft_labels, num_classes, np.float16),
        "offsets": offsets,
        "image_hw": np.array([r.image_hw for r in regions], dtype=np.int32).reshape(-1, 2),
    }
    metadata = {"image_ids": json.dumps([str(i) for i in image_ids], ensure_ascii=False)}
    if box_ids is not None:
        if [len(b) for b in box_ids] != counts:
            raise ValueError("box_ids must list one id per region of each image")
        metadata["box_ids"] = json.dumps([list(b) for b in box_ids], ensure_ascii=False)
    return encode_safetensors(tensors, metadata)


@dataclass
class Shard:
    """A shard read back: ``arrays`` by name, ``image_ids``, ``box_ids`` (given mode) or None."""

    arrays: dict[str, np.ndarray]
    image_ids: list[str]
    box_ids: list[list] | None

    def image(self, j: int) -> dict[str, np.ndarray]:
        """The per-region arrays of the j-th image of the shard (plus its ``image_hw``)."""
        lo, hi = int(self.arrays["offsets"][j]), int(self.arrays["offsets"][j + 1])
        out = {k: self.arrays[k][lo:hi] for k in ("features", "boxes", "norm_bb", "conf", "soft_labels")}
        out["image_hw"] = self.arrays["image_hw"][j]
        return out


def read_shard(path: Path | str) -> Shard:
    """Read a shard with the safetensors library (numpy arrays)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as fh:
        arrays = {k: fh.get_tensor(k) for k in fh.keys()}
        meta = fh.metadata() or {}
    box_ids = json.loads(meta["box_ids"]) if "box_ids" in meta else None
    return Shard(arrays=arrays, image_ids=json.loads(meta["image_ids"]), box_ids=box_ids)
