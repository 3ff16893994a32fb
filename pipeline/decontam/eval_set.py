"""The evaluation set: every image of a downstream evaluation split, and its identity keys.

An eval image is named by refs ``"<dataset>/<split>/<image_id>"`` (one per dataset split that uses
it; docs/design.md §4). :class:`EvalIndex` maps four kinds of identity key to those refs:

- ``image``: ``(image_source, image_id)``, written ``source\\x1fid``
- ``coco_id``: the COCO id of every eval image whose source is COCO (matched by VG ``coco_id``)
- ``flickr``: Flickr photo ids from ``url``, ``flickr_url``, ``flickr_id`` and Flickr30k image ids
- ``url``: canonical URLs of ``url``

An eval manifest's row often knows little of its image (a RefCOCO+ or VQA row has a COCO id and
nothing else), so :func:`inherit_identities` lends every eval image the keys that any other file
knows for the same image: rows of any manifest with the same ``(image_source, image_id)`` (the COCO
manifest's ``coco_url``/``flickr_url``), COCO's test image list, and VG images linked to it by
``coco_id`` or Flickr photo id.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.common.runinfo import InputsMissingError
from pipeline.decontam.url_vec import url_keys
from pipeline.decontam.urls import flickr_photo_id

log = logging.getLogger(__name__)

KEY_SEP = "\x1f"
KEY_KINDS = ("image", "coco_id", "flickr", "url")
# what a row of another file can tell about an image it shares with the eval set
LENT_COLUMNS = ("url", "flickr_url", "flickr_id", "coco_id")
# columns an image row may carry; absent ones are read as null
IMAGE_COLUMNS = ("image_source", "image_id", "image_path", "url", "flickr_url", "flickr_id", "coco_id")
EVAL_COLUMNS = ("ref",) + IMAGE_COLUMNS


def manifest_path(manifest_dir: Path, dataset: str) -> Path:
    return Path(manifest_dir) / f"{dataset}.parquet"


def read_manifest(path: Path, columns: Iterable[str] | None = None) -> pa.Table:
    """Read a manifest parquet file (all columns or the existing ones of ``columns``)."""
    if not path.exists():
        raise InputsMissingError(f"manifest {path} does not exist: run the ingest stage for this dataset first")
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
        # a COCO image is its own COCO id; a VG row lent to an eval image (inherit_identities) names one
        is_coco = pc.equal(table.column("image_source"), "coco")
        coco_ids = pc.coalesce(pc.if_else(is_coco, table.column("image_id"), None), table.column("coco_id"))
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


def read_known_images(manifest_dir: Path, datasets: Iterable[str], eval_images: pa.Table) -> tuple[list[pa.Table], pa.Table | None]:
    """What the manifests of ``datasets`` know about the eval images: (same-image rows, VG rows).

    Same-image rows: the distinct ``image_source, image_id`` + LENT_COLUMNS rows of every manifest
    whose image is an eval image (a manifest none of whose image sources is an eval source is
    skipped after reading its ``image_source`` column). VG rows: the distinct image rows of the
    ``vg`` manifest (for :func:`inherit_identities`' coco_id / Flickr id links), None without one.
    All columns are strings; a missing manifest raises FileNotFoundError naming it.
    """
    wanted = pc.unique(image_key_array(eval_images))
    sources = set(pc.unique(eval_images.column("image_source").drop_null()).to_pylist())
    columns = ("image_source", "image_id") + LENT_COLUMNS
    same, vg = [], None
    for dataset in sorted(set(datasets)):
        path = manifest_path(manifest_dir, dataset)
        if dataset != "vg":  # VG is read whole anyway, for the links
            present = set(pc.unique(read_manifest(path, ["image_source"]).column("image_source")).to_pylist())
            if not present & sources:  # CC, SBU: the big URL columns are not read twice
                continue
        table = _distinct(string_columns(read_manifest(path, columns), columns))
        if dataset == "vg":
            vg = table
        same.append(table.filter(pc.fill_null(pc.is_in(image_key_array(table), value_set=wanted), False)))
    return same, vg


def _distinct(table: pa.Table) -> pa.Table:
    return table.group_by(table.column_names, use_threads=False).aggregate([])


def _lend(targets: pa.Table, lent: pa.Table) -> pa.Table:
    """EVAL_COLUMNS rows: each ref of ``targets`` (ref, image_key, image_source, image_id) with the
    LENT_COLUMNS of every ``lent`` row (image_key + LENT_COLUMNS) of the same image_key; no path."""
    rows = targets.join(lent, "image_key", join_type="inner", use_threads=False)
    rows = rows.append_column("image_path", pa.nulls(rows.num_rows, pa.string()))
    return string_columns(rows, EVAL_COLUMNS)


def _link_keys(table: pa.Table, ids: pa.Array, kind: str, *, eval_side: bool) -> pa.Table:
    """Distinct (id, key): every ``kind`` key (``coco_id`` or ``flickr``) of every row of ``table``
    (IMAGE_COLUMNS) beside that row's element of ``ids``; rows without such a key are left out."""
    parts = []
    for arr in identity_keys(table, eval_side=eval_side, image=False)[kind]:
        part = pa.table({"id": ids, "key": arr.cast(pa.string())})
        parts.append(part.filter(pc.is_valid(part.column("key"))))
    return _distinct(pa.concat_tables(parts))


def _vg_links(combined: pa.Table, vg: pa.Table) -> pa.Table:
    """(image_key, LENT_COLUMNS) of every VG row that shares a COCO id or a Flickr photo id with an
    eval image of ``combined`` (EVAL_COLUMNS), keyed by that eval image."""
    vg = _distinct(string_columns(vg, ("image_source", "image_id") + LENT_COLUMNS))
    vg_rows = pa.array(np.arange(vg.num_rows, dtype=np.int64))
    eval_keys, vg_keys = image_key_array(combined), string_columns(vg, IMAGE_COLUMNS)
    links = []
    for kind in ("coco_id", "flickr"):
        mine = _link_keys(combined, eval_keys, kind, eval_side=True).rename_columns(["image_key", "key"])
        theirs = _link_keys(vg_keys, vg_rows, kind, eval_side=False).rename_columns(["vg_row", "key"])
        links.append(mine.join(theirs, "key", join_type="inner", use_threads=False).select(["image_key", "vg_row"]))
    links = _distinct(pa.concat_tables(links))
    lent = string_columns(vg.take(links.column("vg_row")), LENT_COLUMNS)
    return lent.add_column(0, "image_key", links.column("image_key"))


def inherit_identities(eval_images: pa.Table, same: Iterable[pa.Table] = (), vg: pa.Table | None = None) -> pa.Table:
    """``eval_images`` plus the rows that lend each eval image what other files know about it.

    Args:
        eval_images: EVAL_COLUMNS rows (e.g. :func:`read_eval_images`).
        same: tables with ``image_source``, ``image_id`` and any of LENT_COLUMNS: rows of any dataset
            or source file (the COCO manifest, COCO's test image list); a row whose image is an eval
            image lends it its ``url``, ``flickr_url``, ``flickr_id`` and ``coco_id``.
        vg: VG image rows (``image_source``, ``image_id`` + LENT_COLUMNS). A VG image whose ``coco_id``
            is a COCO eval image, or whose Flickr photo id (``flickr_id``, URLs) is one an eval image
            has once ``same`` has lent its keys, lends its URLs and ids too, but not its own
            ``(vg, id)``: that VG image is removed by ``coco_id`` or ``flickr_photo_id``, not as an
            eval image.

    Returns:
        Distinct rows, EVAL_COLUMNS (strings), sorted; a lent row carries the eval image's ref,
        source and id and no image_path, so refs, image keys and paths stay those of the eval set.
        Joins are Arrow hash joins; nothing is looked up row by row in Python.
    """
    eval_images = string_columns(eval_images, EVAL_COLUMNS)
    image_keys = image_key_array(eval_images)
    targets = _distinct(pa.table({"ref": eval_images.column("ref"), "image_key": image_keys,
                                  "image_source": eval_images.column("image_source"),
                                  "image_id": eval_images.column("image_id")}))
    wanted = pc.unique(image_keys)
    parts = [eval_images]
    for table in same:
        if not table.num_rows:
            continue
        keys = image_key_array(table)
        hit = pc.fill_null(pc.is_in(keys, value_set=wanted), False)
        lent = string_columns(table.filter(hit), LENT_COLUMNS).add_column(0, "image_key", keys.filter(hit))
        parts.append(_lend(targets, _distinct(lent)))
    if vg is not None and vg.num_rows and eval_images.num_rows:
        # after the same-image rows: a RefCOCO+ image's Flickr id comes from the COCO manifest
        parts.append(_lend(targets, _vg_links(pa.concat_tables(parts), vg)))
    combined = _distinct(pa.concat_tables(parts))
    return combined.select(list(EVAL_COLUMNS)).sort_by([(c, "ascending") for c in EVAL_COLUMNS])


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
