"""Feature shards (docs/design.md §8) -> one image DB (docs/design.md §9) per feature directory.

Every shard must carry its ``.done`` marker (a half-extracted source is an error, not a smaller
DB). Images are written in sorted id order, read one slice at a time from the memory-mapped
shards, so memory stays flat however large the source is.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from safetensors import safe_open

from pipeline.common.progress import track
from pipeline.common.ownership import atomic_dir
from pipeline.common.runinfo import InputsMissingError, RunRecord, atomic_write_json, file_digest, is_done, tree_digest
from pipeline.stores.lmdb_store import IMG_DB_KIND, META_FILE, NBB_FILE, LmdbWriter, encode_value

log = logging.getLogger(__name__)
FORMAT_VERSION = 1
SHARD_GLOB = "shard-*.safetensors"
# tensor -> dtype the contract fixes for it
PER_REGION = {"features": np.float16, "boxes": np.float32, "norm_bb": np.float16, "conf": np.float16,
              "soft_labels": np.float16}


@dataclass(frozen=True)
class _Entry:
    key: bytes
    shard: int
    index: int


def list_shards(feat_dir: Path) -> list[Path]:
    """The finished shards of a feature directory, sorted; raises if any lacks its marker."""
    shards = sorted(feat_dir.glob(SHARD_GLOB))
    unfinished = [s.name for s in shards if not is_done(s)]
    if unfinished:
        raise RuntimeError(f"{feat_dir}: shard(s) {unfinished[:5]} have no .done marker (extraction unfinished)")
    return shards


def _index_shards(handles: list[Any], shards: list[Path]) -> tuple[list[_Entry], list[np.ndarray], list[np.ndarray]]:
    entries, offsets, sizes = [], [], []
    seen: dict[bytes, Path] = {}
    for s, (handle, path) in enumerate(zip(handles, shards)):
        meta = handle.metadata() or {}
        if "image_ids" not in meta:
            raise ValueError(f"{path}: safetensors metadata has no 'image_ids'")
        ids = json.loads(meta["image_ids"])
        off = handle.get_tensor("offsets").astype(np.int64)
        hw = handle.get_tensor("image_hw")
        if len(off) != len(ids) + 1 or hw.shape != (len(ids), 2):
            raise ValueError(f"{path}: {len(ids)} image ids but offsets {off.shape} / image_hw {hw.shape}")
        for name, dtype in PER_REGION.items():
            sl = handle.get_slice(name)
            if np.dtype(_np_dtype(sl.get_dtype())) != np.dtype(dtype) or sl.get_shape()[0] != off[-1]:
                raise ValueError(f"{path}: tensor {name} is {sl.get_dtype()} {sl.get_shape()}, expected "
                                 f"{np.dtype(dtype).name} with {off[-1]} rows")
        for i, image_id in enumerate(ids):
            key = str(image_id).encode("utf-8")
            if key in seen:
                raise ValueError(f"image id {image_id!r} appears in both {seen[key].name} and {path.name}")
            seen[key] = path
            entries.append(_Entry(key, s, i))
        offsets.append(off)
        sizes.append(hw)
    entries.sort(key=lambda e: e.key)
    return entries, offsets, sizes


def _np_dtype(safetensors_dtype: str) -> str:
    return {"F16": "float16", "F32": "float32", "BF16": "bfloat16", "I64": "int64", "I32": "int32"}.get(
        safetensors_dtype, safetensors_dtype.lower())


def iter_image_records(shards: list[Path]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(image_id, record) for every image of ``shards``, in sorted id order."""
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(p), framework="numpy")) for p in shards]
        entries, offsets, sizes = _index_shards(handles, shards)
        slices = [{name: h.get_slice(name) for name in PER_REGION} for h in handles]
        for e in entries:
            a, b = int(offsets[e.shard][e.index]), int(offsets[e.shard][e.index + 1])
            record = {name: sl[a:b] for name, sl in slices[e.shard].items()}
            h, w = sizes[e.shard][e.index]
            record["image_h"], record["image_w"] = int(h), int(w)
            yield e.key.decode("utf-8"), record


def image_db_is_current(out_dir: Path, features_digest: str, build: dict[str, Any]) -> bool:
    meta_path = out_dir / META_FILE
    if not (meta_path.is_file() and (out_dir / "data.mdb").is_file() and (out_dir / NBB_FILE).is_file()):
        return False
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    return (meta.get("features_digest") == features_digest and meta.get("build") == build
            and meta.get("format_version") == FORMAT_VERSION)


def build_image_db(feat_dir: Path, out_dir: Path, *, compression: str, commit_every: int,
                   params_digest: str) -> dict[str, Any]:
    """Write ``out_dir`` (data.mdb, nbb.json, meta.json, _run.json) from ``feat_dir``'s shards.

    Returns the counts. Skips the work when ``out_dir`` was already built from the same shards
    with the same settings.
    """
    name = feat_dir.name
    feat_meta_path = feat_dir / META_FILE
    if not feat_meta_path.is_file():
        raise InputsMissingError(f"{feat_meta_path} is missing (extraction unfinished?)")
    feat_meta = json.loads(feat_meta_path.read_text(encoding="utf-8"))
    shards = list_shards(feat_dir)
    features_digest = tree_digest(feat_dir)
    build = {"compression": compression, "commit_every": commit_every}
    if image_db_is_current(out_dir, features_digest, build):
        log.info("image DB %s is up to date", out_dir)
        return json.loads((out_dir / "_run.json").read_text(encoding="utf-8")).get("counts", {})

    run = RunRecord("build_dbs", params_digest)
    run.inputs["features"] = feat_dir
    nbb: dict[str, int] = {}
    regions = raw_f32 = 0
    dim, classes = int(feat_meta["feature_dim"]), int(feat_meta["num_classes"])
    with atomic_dir(out_dir, stage="build_dbs") as tmp:
        writer = LmdbWriter(tmp / ".work", commit_every=commit_every, name=str(out_dir))
        try:
            for image_id, rec in track(iter_image_records(shards), desc=f"image DB {name}", unit="img",
                                       mininterval=2.0):
                n = rec["features"].shape[0]
                if rec["features"].shape[1] != dim or rec["soft_labels"].shape[1] != classes:
                    raise ValueError(f"{feat_dir}: image {image_id} has features {rec['features'].shape} / soft_labels "
                                     f"{rec['soft_labels'].shape}, meta.json says D={dim}, C+1={classes}")
                writer.put(image_id, encode_value(rec, compression))
                nbb[image_id] = n
                regions += n
                raw_f32 += 4 * n * (dim + 4 + 7 + 1 + classes)
            mdb = writer.finish(tmp)
        except BaseException:
            writer.abort()
            raise
        atomic_write_json(tmp / NBB_FILE, nbb, indent=None)
        meta = {"kind": IMG_DB_KIND, "name": name, "format_version": FORMAT_VERSION, "feature_dim": dim,
                "num_classes": classes, "class_names": feat_meta.get("class_names"),
                "detector": feat_meta.get("detector"), "mode": feat_meta.get("mode"), "num_images": len(nbb),
                "num_regions": regions, "features_digest": features_digest, "build": build,
                "dtypes": {k: np.dtype(v).name for k, v in PER_REGION.items()},
                "value": "compressed msgpack map; arrays as {data: raw bytes, dtype, shape}"}
        atomic_write_json(tmp / META_FILE, meta)
        run.counts.update(images=len(nbb), regions=regions, commits=writer.commits, map_growths=writer.map_growths,
                          value_bytes=writer.value_bytes, db_bytes=mdb.stat().st_size, raw_float32_bytes=raw_f32)
        run.extra["data_mdb_sha256"] = file_digest(mdb)
        run.write(tmp)
    log.info("image DB %s: %d images, %d regions, %.1f MiB", name, len(nbb), regions, run.counts["db_bytes"] / 2**20)
    return run.counts
