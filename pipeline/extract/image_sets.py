"""One image source's extraction (docs/design.md §8): which images, with which settings, and its outputs.

Which images: the union, per image source, of the image ids of the clean pretraining manifests
(``data/clean/*.parquet``) and the downstream task manifests (``data/manifests/{vqa, vcr, nlvr2,
snli_ve, refcoco, flickr30k}.parquet``, both images of an NLVR2 pair), sorted by id. Outputs in
``data/features/<name>/``: shards + markers, ``meta.json``, ``rejects.parquet``, ``_run.json``.
The stage (:mod:`pipeline.extract.extract`) runs a whole source here or, split in parts,
through :mod:`pipeline.extract.parts`.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.common.ownership import claim_dir
from pipeline.common.runinfo import InputsMissingError, RunRecord, atomic_write_bytes, atomic_write_json, file_digest
from pipeline.common.detector_files import WEIGHTS_FILE, detector_dir
from pipeline.extract.detector.runner import (ExtractorPool, ExtractSettings, ImageItem, RunSummary, effective_amp,
                                              plan_shards, remove_stale_files, run_shards, settings_record)
from pipeline.params.extract import GIVEN_BOX_DATASETS, GIVEN_BOX_SETS, IMAGE_SOURCES
from pipeline.params.parser import Params, ParamsError

log = logging.getLogger("pipeline.extract")

TASK_MANIFESTS = ("vqa", "vcr", "nlvr2", "snli_ve", "refcoco", "flickr30k")
BAD_BOXES = "bad_boxes"  # given-box metadata missing or malformed (rejects.parquet reason)
REJECT_SCHEMA = pa.schema([("image_id", pa.string()), ("image_path", pa.string()), ("reason", pa.string()),
                           ("detail", pa.string())])


# ----------------------------------------------------------------------------- which images


def manifest_paths(data: Path) -> list[Path]:
    """Clean pretraining manifests, then the task manifests (those that exist)."""
    paths = sorted((data / "clean").glob("*.parquet"))
    paths += [data / "manifests" / f"{name}.parquet" for name in TASK_MANIFESTS]
    return [p for p in paths if p.is_file() and not p.name.endswith(".rejects.parquet")]


def _read(path: Path, wanted: list[str]) -> pa.Table:
    names = set(pq.read_schema(path).names)
    missing = [c for c in ("image_source", "image_id", "image_path") if c not in names]
    if missing:
        raise ValueError(f"{path}: manifest lacks column(s) {missing} (docs/design.md §6)")
    return pq.read_table(path, columns=[c for c in wanted if c in names])


def detected_items(data: Path, source: str) -> tuple[list[ImageItem], list[Path]]:
    """Every image of ``source`` that a manifest needs, sorted by image id; and the manifests read."""
    paths: dict[str, str] = {}
    used = []
    for manifest in manifest_paths(data):
        table = _read(manifest, ["image_source", "image_id", "image_path", "image_id_2", "image_path_2"])
        rows = table.to_pydict()
        pairs = [("image_id", "image_path")] + ([("image_id_2", "image_path_2")] if "image_id_2" in rows else [])
        found = False
        for id_col, path_col in pairs:
            for src, image_id, path in zip(rows["image_source"], rows[id_col], rows[path_col]):
                if src != source or image_id is None or path is None:
                    continue
                found = True
                image_id = str(image_id)
                # the same image may be listed under two path spellings: keep one, deterministically
                if image_id not in paths or path < paths[image_id]:
                    paths[image_id] = path
        if found:
            used.append(manifest)
    return [ImageItem(i, paths[i]) for i in sorted(paths)], used


def _metadata_boxes(path: str) -> list[tuple[float, float, float, float]]:
    """VCR metadata JSON -> its object boxes (x1, y1, x2, y2; the 5th value, a score, dropped)."""
    meta = json.loads(Path(path).read_text(encoding="utf-8"))
    boxes = [tuple(float(v) for v in box[:4]) for box in meta["boxes"]]
    if any(len(b) != 4 for b in boxes):
        raise ValueError("a box has fewer than 4 coordinates")
    return boxes


def given_box_items(data: Path, name: str) -> tuple[list[ImageItem], list[dict], list[Path]]:
    """Images with their given boxes for ``vcr_gt`` / ``coco_gt``; rejects for bad box data."""
    rejects: list[dict] = []
    by_image: dict[str, dict] = {}
    if name == "vcr_gt":
        manifest = data / "manifests" / "vcr.parquet"
        rows = _read(manifest, ["image_source", "image_id", "image_path", "metadata_path"]).to_pydict()
        for image_id, path, meta_path in zip(rows["image_id"], rows["image_path"], rows["metadata_path"]):
            by_image.setdefault(str(image_id), {"path": path, "meta": meta_path})
        items = []
        for image_id in sorted(by_image):
            entry = by_image[image_id]
            try:
                boxes = _metadata_boxes(entry["meta"])
            except (OSError, ValueError, KeyError, TypeError) as err:
                rejects.append({"image_id": image_id, "image_path": entry["path"], "reason": BAD_BOXES,
                                "detail": f"{entry['meta']}: {type(err).__name__}: {err}"})
                continue
            items.append(ImageItem(image_id, entry["path"], tuple(boxes), tuple(range(len(boxes)))))
        return items, rejects, [manifest]
    if name == "coco_gt":
        manifest = data / "manifests" / "refcoco.parquet"
        rows = _read(manifest, ["image_source", "image_id", "image_path", "ann_id", "bbox"]).to_pydict()
        for src, image_id, path, ann_id, bbox in zip(rows["image_source"], rows["image_id"], rows["image_path"],
                                                     rows["ann_id"], rows["bbox"]):
            if src == "coco":
                entry = by_image.setdefault(str(image_id), {"path": path, "anns": {}})
                entry["anns"][ann_id] = bbox
        items = []
        for image_id in sorted(by_image):
            entry = by_image[image_id]
            ann_ids = sorted(entry["anns"])
            boxes = [entry["anns"][a] for a in ann_ids]
            if any(b is None or len(b) != 4 or not (b[2] > 0 and b[3] > 0) for b in boxes):
                rejects.append({"image_id": image_id, "image_path": entry["path"], "reason": BAD_BOXES,
                                "detail": f"{manifest}: a bbox is missing or not [x, y, w>0, h>0]: {boxes}"})
                continue
            xyxy = tuple((float(x), float(y), float(x + w), float(y + h)) for x, y, w, h in boxes)
            items.append(ImageItem(image_id, entry["path"], xyxy, tuple(_plain(a) for a in ann_ids)))
        return items, rejects, [manifest]
    raise ValueError(f"unknown given-box set {name!r}; expected one of {sorted(GIVEN_BOX_SETS.values())}")


def _plain(value):
    """numpy / pyarrow scalars -> int or str for JSON metadata."""
    return int(value) if isinstance(value, int) or str(value).lstrip("-").isdigit() else str(value)


# ----------------------------------------------------------------------------- the stage


def make_settings(params: Params) -> tuple[ExtractSettings, int]:
    """The worker settings and the number of workers for ``params.extract``."""
    import torch

    cfg = params.extract
    device = cfg.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    weights = cfg.weights or detector_dir(params.paths.data) / WEIGHTS_FILE
    if not Path(weights).is_file():
        hint = "run `python -m pipeline train_detector`" if cfg.detector == "mini" else "set extract.weights"
        raise InputsMissingError(f"detector weights not found: {weights} ({hint})")
    if device == "cuda":
        workers = min(cfg.workers or torch.cuda.device_count(), torch.cuda.device_count())
    else:  # one torch thread per worker (ExtractSettings.threads): a worker per core uses the machine
        workers = cfg.workers or len(os.sched_getaffinity(0))
    settings = ExtractSettings(preset=cfg.detector, weights=str(weights), weights_digest=file_digest(weights),
                               device=device, batch_size=cfg.batch_size, conf_th=cfg.conf_th,
                               min_boxes=cfg.min_boxes, max_boxes=cfg.max_boxes, proposals=cfg.proposals,
                               amp=effective_amp(cfg.amp, device))
    return settings, workers


def targets(params: Params, item: str | None) -> list[str]:
    """Feature sets to write for ``item`` (None: every configured source), each source's given-box set
    included when the dataset giving its boxes is in ``ingest.datasets`` (COCO + VG has no RefCOCO+)."""
    known = set(IMAGE_SOURCES) | set(GIVEN_BOX_SETS.values())
    if item is not None and item not in known:
        raise ParamsError(f"extract: unknown item {item!r}; expected one of {sorted(known)}")
    sources = [item] if item is not None else list(params.extract.sources)
    names = []
    for source in sources:
        names.append(source)
        if source in GIVEN_BOX_SETS and GIVEN_BOX_DATASETS[GIVEN_BOX_SETS[source]] in params.ingest.datasets:
            names.append(GIVEN_BOX_SETS[source])
    return names


def detector_meta(settings: ExtractSettings, mode: str, detector=None) -> dict:
    """The feature directory's ``meta.json`` content (``detector``: the loaded one, else it is
    loaded to read its dimensions)."""
    from pipeline.extract.detector.build import load_detector

    if detector is None:
        detector = load_detector(settings.preset, settings.weights)
    return {"feature_dim": detector.feature_dim, "num_classes": detector.num_classes,
            "class_names": ["__background__"] + detector.class_names, "detector": settings.preset,
            "weights_sha256": settings.weights_digest, "mode": mode}


@dataclass(frozen=True)
class Selection:
    """The images one feature set needs: ``mode`` (detected | given), ``items`` sorted by id, the
    ``input_rejects`` (bad given boxes) and the manifests ``used``."""

    name: str
    mode: str
    items: list[ImageItem]
    input_rejects: list[dict]
    used: list[Path]


def select(params: Params, name: str) -> Selection:
    """Which images the feature set ``name`` (an image source or a given-box set) needs."""
    data = params.paths.data
    if name in IMAGE_SOURCES:
        items, used = detected_items(data, name)
        return Selection(name, "detected", items, [], used)
    items, input_rejects, used = given_box_items(data, name)
    return Selection(name, "given", items, input_rejects, used)


def feature_dir(params: Params, name: str) -> Path:
    """``<paths.data>/features/<name>``: the feature set's output directory (docs/design.md §8)."""
    return params.paths.data / "features" / name


def write_outputs(params: Params, sel: Selection, settings: ExtractSettings, summary: RunSummary, meta: dict, *,
                  workers: int | None, extra: dict | None = None) -> dict:
    """``meta.json``, ``rejects.parquet`` and ``_run.json`` of a feature directory whose shards are
    all written (``summary``: their totals); returns the run record. ``extra``: more record fields."""
    out_dir = feature_dir(params, sel.name)
    record = RunRecord(f"extract@{sel.name}", params.section_digest("extract"))
    atomic_write_json(out_dir / "meta.json", meta)
    rejects = sorted(sel.input_rejects + summary.rejects, key=lambda r: (r["image_id"], r["reason"]))
    table = pa.Table.from_pylist(rejects, schema=REJECT_SCHEMA)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomic_write_bytes(out_dir / "rejects.parquet", sink.getvalue().to_pybytes())

    for i, manifest in enumerate(sel.used):
        record.inputs[f"manifest_{i}"] = manifest
    record.inputs["weights"] = settings.weights
    reasons: dict[str, int] = {}
    for r in rejects:
        reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    record.counts.update({"images_listed": len(sel.items) + len(sel.input_rejects), "images": summary.images,
                          "rejected": len(rejects), "rejected_by_reason": reasons, "regions": summary.regions,
                          "shards": summary.shards, "shards_skipped": summary.shards_skipped})
    record.extra["settings"] = settings_record(settings)
    record.extra["workers"] = workers
    record.extra.update(extra or {})
    result = record.write(out_dir)
    per_image = summary.regions / summary.images if summary.images else 0.0
    log.info("extract@%s: %d images in %d shards (%d reused), %d rejected, %d regions (%.1f per image), %.1fs",
             sel.name, summary.images, summary.shards, summary.shards_skipped, len(rejects), summary.regions,
             per_image, result["wall_time_s"])
    return result


def extract_set(params: Params, name: str, pool: ExtractorPool) -> dict:
    """Write ``data/features/<name>/`` for one image source or given-box set; return the run record."""
    sel = select(params, name)
    out_dir = feature_dir(params, name)
    claim_dir(out_dir, f"extract@{name}")  # stale shards below are pruned: only in a directory of ours
    jobs = plan_shards(sel.items, out_dir, shard_size=params.extract.shard_size, settings=pool.settings, mode=sel.mode)
    remove_stale_files(out_dir, keep=len(jobs))
    summary = run_shards(jobs, pool, desc=f"extract@{name}")
    return write_outputs(params, sel, pool.settings, summary, detector_meta(pool.settings, sel.mode, pool.detector),
                         workers=pool.workers)
