"""Which pretraining images are eval images: identity-key matches and pHash near-duplicates.

:func:`find_key_matches` looks every row's identity keys (:func:`pipeline.decontam.eval_set.identity_keys`)
up in the eval key sets; :class:`NearDuplicateFinder` compares perceptual hashes
(:mod:`pipeline.decontam.phash`). Both answer per image key, with the eval refs matched.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.decontam.eval_set import KEY_SEP, EvalIndex, identity_keys, image_key_array
from pipeline.decontam.phash import PhashCache, near_duplicate_pairs
from pipeline.common.reasons import REMOVAL_REASONS

log = logging.getLogger(__name__)

REASONS = REMOVAL_REASONS  # priority order
KIND_REASON = {"image": "eval_split", "coco_id": "coco_id", "flickr": "flickr_photo_id", "url": "canonical_url"}


@dataclass
class ImageMatch:
    """What one pretraining image matched: reasons that apply and every eval ref matched."""

    reasons: set[str] = field(default_factory=set)
    refs: set[str] = field(default_factory=set)

    @property
    def reason(self) -> str:
        return min(self.reasons, key=REASONS.index)



def row_image_keys(rows: pa.Table) -> tuple[pa.Array, str]:
    """(key of each row's image, prefix) such that prefix + key is the image key ``source\\x1fid``.

    A pretraining manifest has one image source, so its ``image_id`` column serves as the key
    (no per-row string building); with several sources the full keys are built.
    """
    sources = pc.unique(rows.column("image_source")).to_pylist()
    if len(sources) == 1 and sources[0] is not None:
        return rows.column("image_id").combine_chunks().cast(pa.string()), sources[0] + KEY_SEP
    return image_key_array(rows), ""


def _chunk_hits(rows: pa.Table, row_keys: pa.Array, prefix: str, index: EvalIndex) -> dict[str, list[tuple[str, str]]]:
    """Kind -> [(image key, identity key)] of the rows of one chunk whose keys are in ``index``."""
    hits: dict[str, list[tuple[str, str]]] = {}
    source = prefix[: -len(KEY_SEP)] if prefix else None
    keys = identity_keys(rows, eval_side=False, image=source is None or source in index.sources)
    for kind, arrays in keys.items():
        for arr in arrays:
            hit = pc.fill_null(pc.is_in(arr, value_set=index.value_sets[kind]), False)
            idx = np.flatnonzero(hit.to_numpy(zero_copy_only=False))
            if len(idx):
                take = pa.array(idx)
                images = [prefix + k for k in row_keys.take(take).to_pylist()]
                hits.setdefault(kind, []).extend(zip(images, arr.take(take).to_pylist()))
    return hits


def find_key_matches(rows: pa.Table, index: EvalIndex, *, workers: int = 1,
                     row_keys: tuple[pa.Array, str] | None = None) -> dict[str, ImageMatch]:
    """Image key -> ImageMatch for every image with an identity key in ``index``.

    Keys are computed per row with Arrow kernels (most rows cost one regular-expression pass) and
    looked up in the eval key sets at once; only the (few) hit rows are visited in Python. Chunks
    of rows run on ``workers`` threads (Arrow kernels release the GIL).

    Args:
        rows: IMAGE_COLUMNS of the manifest (strings, null where unknown).
        row_keys: :func:`row_image_keys` of ``rows`` if already computed.
    """
    keys, prefix = row_keys if row_keys is not None else row_image_keys(rows)
    # one chunk per worker: every pc.is_in call hashes its value set again, so fewer chunks are cheaper
    chunk_rows = max(1 << 16, -(-rows.num_rows // max(1, workers)))
    chunks = [(rows.slice(start, chunk_rows), keys.slice(start, chunk_rows))
              for start in range(0, rows.num_rows, chunk_rows)]
    if workers > 1 and len(chunks) > 1:
        with ThreadPoolExecutor(workers) as pool:
            per_chunk = list(pool.map(lambda chunk: _chunk_hits(*chunk, prefix, index), chunks))
    else:
        per_chunk = [_chunk_hits(*chunk, prefix, index) for chunk in chunks]
    matches: dict[str, ImageMatch] = defaultdict(ImageMatch)
    for kind in KIND_REASON:
        hits = [hit for chunk in per_chunk for hit in chunk.get(kind, [])]
        lookup = index.refs_for(kind, (key for _, key in hits)) if hits else {}
        for img, key in hits:
            match = matches[img]
            match.reasons.add(KIND_REASON[kind])
            match.refs.update(lookup[key])
    return dict(matches)


def image_paths(rows: pa.Table) -> tuple[list[str], list[str | None]]:
    """(image key, first image_path) of every distinct image of a manifest, sorted by key."""
    paths = rows.select(["image_source", "image_id", "image_path"]).group_by(
        ["image_source", "image_id"], use_threads=False).aggregate([("image_path", "min")])
    keys = image_key_array(paths)
    order = pc.sort_indices(keys)
    return keys.take(order).to_pylist(), paths.column("image_path_min").take(order).to_pylist()


class NearDuplicateFinder:
    """pHash near-duplicate search against the eval images (their hashes computed once)."""

    def __init__(self, index: EvalIndex, cache: PhashCache, max_distance: int) -> None:
        self.index = index
        self.cache = cache
        self.max_distance = max_distance
        keys = sorted(index.image_paths)
        hashes = cache.hashes([index.image_paths[k] for k in keys], desc="phash eval images")
        self.eval_keys = [k for k, h in zip(keys, hashes) if h is not None]
        self.eval_hashes = np.array([h for h in hashes if h is not None], dtype=np.uint64)
        log.info("pHash of %d eval images (%d unreadable or missing)", len(self.eval_keys), len(keys) - len(self.eval_keys))

    def find(self, image_keys: list[str], paths: list[str | None], *, desc: str) -> dict[str, set[str]]:
        """Image key -> eval refs within ``max_distance`` for each pretraining image on disk."""
        with_path = [(k, p) for k, p in zip(image_keys, paths) if p is not None]
        hashes = self.cache.hashes([p for _, p in with_path], desc=desc)
        keys = [k for (k, _), h in zip(with_path, hashes) if h is not None]
        query = np.array([h for h in hashes if h is not None], dtype=np.uint64)
        qi, ri = near_duplicate_pairs(query, self.eval_hashes, self.max_distance)
        found: dict[str, set[str]] = defaultdict(set)
        for q, r in zip(qi.tolist(), ri.tolist()):
            found[keys[q]].update(self.index.image_refs[self.eval_keys[r]])
        return dict(found)
