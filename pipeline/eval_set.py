"""The evaluation set: every image of a downstream evaluation split, and its identity keys.

An eval image is named by refs ``"<dataset>/<split>/<image_id>"`` (one per dataset split that uses
it; docs/contracts.md §2). :class:`EvalIndex` maps four kinds of identity key to those refs:

- ``image``: ``(image_source, image_id)``, written ``source\\x1fid``
- ``coco_id``: the COCO id of every eval image whose source is COCO (matched by VG ``coco_id``)
- ``flickr``: Flickr photo ids from ``url``, ``flickr_url``, ``flickr_id`` and Flickr30k image ids
- ``url``: canonical URLs of ``url``
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.url_vec import url_keys
from pipeline.urls import flickr_photo_id

log = logging.getLogger(__name__)

KEY_SEP = "\x1f"
KEY_KINDS = ("image", "coco_id", "flickr", "url")
# columns an image row may carry; absent ones are read as null
IMAGE_COLUMNS = ("image_source", "image_id", "image_path", "url", "flickr_url", "flickr_id", "coco_id")
EVAL_COLUMNS = ("ref",) + IMAGE_COLUMNS


def manifest_path(manifest_dir: Path, dataset: str) -> Path:
    return Path(manifest_dir) / f"{dataset}.parquet"


def read_manifest(path: Path, columns: Iterable[str] | None = None) -> pa.Table:
    """Read a manifest parquet file (all columns or the existing ones of ``columns``)."""
    if not path.exists():
        raise FileNotFoundError(f"manifest {path} does not exist: run the ingest stage for this dataset first")
    if columns is None:
        return pq.read_table(path)
    present = set(pq.read_schema(path).names)
    return pq.read_table(path, columns=[c for c in columns if c in present])


def string_columns(table: pa.Table, columns: Iterable[str]) -> pa.Table:
    """``table`` restricted to ``columns`` in that order, missing ones as null strings, all as strings."""
    arrays = []
    for name in columns:
        if name in table.column_names:
            col = table.column(name)
            arrays.append(col if col.type == pa.string() else col.cast(pa.string()))
        else:
            arrays.append(pa.nulls(table.num_rows, pa.string()))
    return pa.Table.from_arrays(arrays, names=list(columns))


def bare_flickr_ids(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Normalize bare ids / file names (VG ``flickr_id``, Flickr30k ``image_id``) with flickr_photo_id."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    uniq = pc.unique(values.drop_null()).to_pylist()
    mapping = {v: flickr_photo_id(v) for v in uniq}
    return pa.array([mapping[v] if v is not None else None for v in values.to_pylist()], type=pa.large_string())


def image_key_array(table: pa.Table) -> pa.Array:
    """``source\\x1fid`` for every row of a table with ``image_source`` and ``image_id`` columns."""
    src = table.column("image_source").combine_chunks().cast(pa.large_string())
    ids = table.column("image_id").combine_chunks().cast(pa.large_string())
    return pc.binary_join_element_wise(src, ids, pa.scalar(KEY_SEP, pa.large_string()))


def identity_keys(table: pa.Table, *, eval_side: bool) -> dict[str, list[pa.Array]]:
    """Every identity key of every row, per kind (a kind may have several arrays, e.g. two URL columns).

    ``table`` has the string columns of IMAGE_COLUMNS (null where unknown). Each array has one
    element per row, null where the row has no key of that source. The ``coco_id`` key of an eval
    image is its own id when it is a COCO image; of a pretraining image, its ``coco_id`` column (VG).
    """
    keys: dict[str, list[pa.Array]] = {k: [] for k in KEY_KINDS}
    keys["image"].append(image_key_array(table))
    if eval_side:
        is_coco = pc.equal(table.column("image_source"), "coco")
        coco_ids = pc.if_else(is_coco, table.column("image_id"), None)
    else:
        coco_ids = table.column("coco_id")
    keys["coco_id"].append(coco_ids.combine_chunks().cast(pa.large_string()))
    canon, flickr = url_keys(table.column("url"))
    keys["url"].append(canon)
    keys["flickr"].append(flickr)
    if pc.any(pc.is_valid(table.column("flickr_url"))).as_py():
        keys["flickr"].append(url_keys(table.column("flickr_url"))[1])
    if pc.any(pc.is_valid(table.column("flickr_id"))).as_py():
        keys["flickr"].append(bare_flickr_ids(table.column("flickr_id")))
    is_f30k = pc.equal(table.column("image_source"), "flickr30k")
    if pc.any(is_f30k).as_py():
        keys["flickr"].append(bare_flickr_ids(pc.if_else(is_f30k, table.column("image_id"), None)))
    return keys


def _eval_rows(dataset: str, table: pa.Table, splits: tuple[str, ...]) -> list[pa.Table]:
    """Rows (ref + image columns) of the eval splits of one dataset manifest; NLVR2's second image too."""
    table = table.filter(pc.is_in(table.column("split"), pa.array(list(splits), pa.string())))
    images = [("image_id", "image_path")]
    if "image_id_2" in table.column_names:
        images.append(("image_id_2", "image_path_2"))
    out = []
    for id_col, path_col in images:
        part = table.filter(pc.is_valid(table.column(id_col)))
        if id_col != "image_id":  # the second image of a pair: same source, no URL of its own here
            part = part.drop_columns([c for c in ("image_id", "image_path", "url") if c in part.column_names])
            part = part.rename_columns({id_col: "image_id", path_col: "image_path"})
        rows = string_columns(part, IMAGE_COLUMNS)
        ref = pc.binary_join_element_wise(
            pa.scalar(dataset), part.column("split").cast(pa.string()), rows.column("image_id"), "/"
        )
        out.append(rows.add_column(0, "ref", ref))
    return out


def read_eval_images(manifest_dir: Path, eval_splits: Mapping[str, tuple[str, ...]]) -> pa.Table:
    """Distinct (ref, image) rows of every eval split, sorted; columns EVAL_COLUMNS (strings)."""
    parts = []
    for dataset in sorted(eval_splits):
        splits = tuple(eval_splits[dataset])
        if not splits:
            continue
        path = manifest_path(manifest_dir, dataset)
        wanted = ("split",) + IMAGE_COLUMNS + ("image_id_2", "image_path_2")
        table = read_manifest(path, wanted)
        present = set(pc.unique(table.column("split")).to_pylist())
        absent = sorted(set(splits) - present)
        if absent:
            log.warning("%s: eval split(s) %s not in the manifest (present: %s)", path, absent, sorted(present))
        parts.extend(_eval_rows(dataset, table, splits))
    if not parts:
        return pa.Table.from_arrays([pa.array([], pa.string())] * len(EVAL_COLUMNS), names=list(EVAL_COLUMNS))
    table = pa.concat_tables(parts)
    table = table.group_by(list(EVAL_COLUMNS), use_threads=False).aggregate([])
    return table.select(list(EVAL_COLUMNS)).sort_by([(c, "ascending") for c in EVAL_COLUMNS])


@dataclass
class EvalIndex:
    """Identity keys of the eval images -> sorted refs; plus each image's path for thumbnails/pHash."""

    keys: dict[str, dict[str, tuple[str, ...]]]
    value_sets: dict[str, pa.Array]
    image_paths: dict[str, str]  # image key -> path
    image_refs: dict[str, tuple[str, ...]]  # image key -> refs
    ref_images: dict[str, str] = field(default_factory=dict)  # ref -> image key

    @classmethod
    def build(cls, images: pa.Table) -> "EvalIndex":
        """Index a table of eval rows (EVAL_COLUMNS, e.g. from :func:`read_eval_images`)."""
        refs = images.column("ref").to_pylist()
        collected: dict[str, dict[str, set[str]]] = {k: defaultdict(set) for k in KEY_KINDS}
        for kind, arrays in identity_keys(images, eval_side=True).items():
            for arr in arrays:
                for ref, key in zip(refs, arr.to_pylist()):
                    if key is not None:
                        collected[kind][key].add(ref)
        keys = {k: {key: tuple(sorted(v)) for key, v in d.items()} for k, d in collected.items()}
        value_sets = {k: pa.array(sorted(d), type=pa.large_string()) for k, d in keys.items()}
        image_paths: dict[str, str] = {}
        ref_images: dict[str, str] = {}
        image_keys = image_key_array(images).to_pylist()
        for ref, ikey, path in zip(refs, image_keys, images.column("image_path").to_pylist()):
            ref_images.setdefault(ref, ikey)
            if path is not None:
                image_paths.setdefault(ikey, path)
        return cls(keys=keys, value_sets=value_sets, image_paths=image_paths,
                   image_refs=keys["image"], ref_images=ref_images)

    def __len__(self) -> int:
        return len(self.image_refs)
