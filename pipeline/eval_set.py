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
from dataclasses import dataclass
from functools import cached_property
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
    """``source\\x1fid`` (string) for every row of a table with ``image_source`` and ``image_id`` columns."""
    src = table.column("image_source").combine_chunks().cast(pa.string())
    ids = table.column("image_id").combine_chunks().cast(pa.string())
    return pc.binary_join_element_wise(src, ids, pa.scalar(KEY_SEP, pa.string()))


def identity_keys(table: pa.Table, *, eval_side: bool, image: bool = True) -> dict[str, list[pa.Array]]:
    """Every identity key of every row, per kind (a kind may have several arrays, e.g. two URL columns).

    ``table`` has the string columns of IMAGE_COLUMNS (null where unknown). Each array has one
    element per row, null where the row has no key of that source. The ``coco_id`` key of an eval
    image is its own id when it is a COCO image; of a pretraining image, its ``coco_id`` column (VG).
    ``image=False`` leaves out the ``image`` keys (when no eval image can share the source).
    """
    keys: dict[str, list[pa.Array]] = {k: [] for k in KEY_KINDS}
    if image:
        keys["image"].append(image_key_array(table).cast(pa.large_string()))
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


def _group_refs(table: pa.Table) -> dict[str, tuple[str, ...]]:
    """{key: (ref, ...)} of a (key, ref) table sorted by key then ref."""
    out: dict[str, list[str]] = defaultdict(list)
    for key, ref in zip(table.column("key").to_pylist(), table.column("ref").to_pylist()):
        out[key].append(ref)
    return {k: tuple(v) for k, v in out.items()}


@dataclass
class EvalIndex:
    """Identity keys of the eval images, each with the refs it names; built without Python loops.

    ``pairs[kind]``: distinct (key, ref) rows sorted by key then ref; ``value_sets[kind]``: the
    distinct keys (for ``pc.is_in``); ``images``: (image key, ref, image_path) of every eval row.
    Dict views (:attr:`image_paths`, :attr:`image_refs`, :attr:`ref_images`) are built on first use.
    """

    pairs: dict[str, pa.Table]
    value_sets: dict[str, pa.Array]
    images: pa.Table
    sources: frozenset[str]  # image sources of the eval images

    @classmethod
    def build(cls, images: pa.Table) -> "EvalIndex":
        """Index a table of eval rows (EVAL_COLUMNS, e.g. from :func:`read_eval_images`)."""
        refs = images.column("ref").combine_chunks().cast(pa.string())
        pairs, value_sets = {}, {}
        for kind, arrays in identity_keys(images, eval_side=True).items():
            parts = [pa.table({"key": arr, "ref": refs}).filter(pc.is_valid(arr)) for arr in arrays]
            table = pa.concat_tables(parts).group_by(["key", "ref"], use_threads=False).aggregate([])
            pairs[kind] = table.sort_by([("key", "ascending"), ("ref", "ascending")])
            value_sets[kind] = pc.unique(pairs[kind].column("key"))
        rows = pa.table({"image_key": image_key_array(images), "ref": refs,
                         "image_path": images.column("image_path").cast(pa.string())})
        sources = frozenset(pc.unique(images.column("image_source").drop_null()).to_pylist())
        return cls(pairs=pairs, value_sets=value_sets, images=rows, sources=sources)

    def refs_for(self, kind: str, keys: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """{key: sorted refs} for the given keys of one kind (keys absent from the index are left out)."""
        wanted = pa.array(sorted(set(keys)), pa.large_string())
        table = self.pairs[kind]
        return _group_refs(table.filter(pc.is_in(table.column("key"), value_set=wanted)))

    @cached_property
    def image_refs(self) -> dict[str, tuple[str, ...]]:
        """Image key -> sorted refs of every eval image."""
        return _group_refs(self.pairs["image"])

    @cached_property
    def image_paths(self) -> dict[str, str]:
        """Image key -> file (the smallest path when rows disagree) of every eval image with a path."""
        rows = self.images.filter(pc.is_valid(self.images.column("image_path")))
        rows = rows.group_by(["image_key"], use_threads=False).aggregate([("image_path", "min")])
        return dict(zip(rows.column("image_key").to_pylist(), rows.column("image_path_min").to_pylist()))

    @cached_property
    def ref_images(self) -> dict[str, str]:
        """Ref -> image key."""
        return dict(zip(self.images.column("ref").to_pylist(), self.images.column("image_key").to_pylist()))

    def __len__(self) -> int:
        return len(self.value_sets["image"])
