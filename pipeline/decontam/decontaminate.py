"""Stage ``decontaminate``: remove every downstream eval image from the pretraining manifests.

Reads ``<data>/manifests/<dataset>.parquet`` (+ ``.rejects.parquet``) of every dataset, builds the
eval set (:mod:`pipeline.decontam.eval_set`) and removes, per image, every pretraining image that is
an eval image by any identity key or, optionally, by perceptual hash (:mod:`pipeline.decontam.matching`).
Writes (docs/design.md §5–§7):

- ``<data>/clean/<dataset>.parquet``: the kept rows, ``split`` in train|val, sorted by example_id
- ``<data>/clean/_run.json``
- ``<data>/reports/cleaning/<dataset>.{json,md,html}`` + chart, ``summary.json`` (DVC metrics)

A removed image loses all its rows; its reason is the first that applies in REASONS order, and
``matched_eval`` lists every eval ref that any key matched.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.common.ownership import atomic_dir
from pipeline.common.runinfo import InputsMissingError, RunRecord
from pipeline.decontam.arrow_sort import count_distinct, take_sorted
from pipeline.decontam.coco_test_images import read_image_info
from pipeline.decontam.eval_set import (IMAGE_COLUMNS, EvalIndex, inherit_identities, manifest_path, read_eval_images,
                                        read_known_images, read_manifest, string_columns)
from pipeline.decontam.matching import (REASONS, ImageMatch, NearDuplicateFinder, find_key_matches, image_paths,
                                        row_image_keys)
from pipeline.decontam.phash import PhashCache
from pipeline.common.reasons import REJECT_REASONS
from pipeline.decontam.splits import pretrain_split
from pipeline.decontam.streamed import count_rejects, decontaminate_file

log = logging.getLogger(__name__)


@dataclass
class DatasetResult:
    """Outcome for one pretraining dataset: clean table (or the file it was streamed to), JSON report,
    report samples."""

    clean: pa.Table | None
    report: dict
    samples: list[dict]
    clean_path: Path | None = None


def decontaminate_dataset(
    dataset: str,
    manifest: pa.Table,
    rejects: pa.Table,
    index: EvalIndex,
    *,
    finder: NearDuplicateFinder | None,
    val_coco_ids: set[str] | None = None,
    workers: int = 1,
) -> DatasetResult:
    """Remove the eval images from one pretraining manifest; build its report.

    Args:
        manifest: the dataset's manifest (docs/design.md §6), any row order.
        rejects: its ingest rejects (``reason`` column), counted in the report.
        finder: pHash search, or None to skip near duplicates.
        val_coco_ids: COCO ids of pretraining-val COCO images; VG rows of these images become val.
        workers: threads for the key matching and the counting.

    Returns:
        clean table (kept rows, split train|val, sorted by example_id), report dict (docs/design.md §7),
        samples (removed images with paths, for thumbnails).
    """
    rows = string_columns(manifest, IMAGE_COLUMNS)
    row_keys, prefix = row_image_keys(rows)
    # pHash first: its worker processes are forked while this process runs no other thread
    near = finder.find(*image_paths(rows), desc=f"phash {dataset}") if finder is not None else {}
    with ThreadPoolExecutor(1) as pool:
        input_images_job = pool.submit(count_distinct, row_keys)
        matches = find_key_matches(rows, index, workers=workers, row_keys=(row_keys, prefix))
        for key, refs in near.items():
            match = matches.setdefault(key, ImageMatch())
            match.reasons.add("near_duplicate")
            match.refs.update(refs)
        removed_keys = pa.array(sorted(k[len(prefix):] for k in matches), row_keys.type)
        removed_mask = pc.is_in(row_keys, value_set=removed_keys)
        clean = _clean_rows(dataset, manifest, pc.invert(removed_mask), val_coco_ids, workers)
        input_images = input_images_job.result()
    removed = _removed_entries(rows.filter(removed_mask), row_keys.filter(removed_mask), prefix, matches)
    reject_counts: Counter = Counter(rejects.column("reason").to_pylist() if rejects.num_rows else [])
    report = build_report(dataset, input_rows=manifest.num_rows + rejects.num_rows, input_images=input_images,
                          kept_rows=clean.num_rows, removed_rows=int(pc.sum(removed_mask).as_py() or 0),
                          matched_images=len(matches), removed=removed, rejects=reject_counts)
    check_invariant(report)
    return DatasetResult(clean=clean, report=report, samples=removed)


def build_report(dataset: str, *, input_rows: int, input_images: int, kept_rows: int, removed_rows: int,
                 matched_images: int, removed: list[dict], rejects: Counter) -> dict:
    """The cleaning report of one dataset (docs/design.md §7); ``removed``: :func:`_removed_entries`."""
    removed_images = {r: 0 for r in REASONS}
    for entry in removed:
        removed_images[entry["reason"]] += 1
    reject_counts = {r: 0 for r in REJECT_REASONS} | dict(rejects)
    report = {
        "dataset": dataset,
        "input_rows": input_rows,
        "input_images": input_images,
        "kept_rows": kept_rows,
        "kept_images": input_images - matched_images,  # removal takes every row of an image
        "removed_rows": removed_rows,
        "removed_images": removed_images,
        "removed": [{k: e[k] for k in ("image_id", "url", "reason", "matched_eval")} for e in removed],
        "rejected_rows": reject_counts,
    }
    check_invariant(report)
    return report


def decontaminate_streamed(dataset: str, manifest: Path, rejects: Path, index: EvalIndex, out_path: Path,
                           tmp_dir: Path, *, finder: NearDuplicateFinder | None, val_coco_ids: set[str] | None = None,
                           workers: int = 1, batch_rows: int | None = None) -> DatasetResult:
    """:func:`decontaminate_dataset` of the manifest file ``manifest``, in record batches of ``batch_rows``
    (default ``streamed.BATCH_ROWS``; :mod:`pipeline.decontam.streamed`): the clean manifest is written to ``out_path`` (the same bytes
    :func:`write_parquet` gives) and no step holds the whole manifest. ``clean`` is None."""
    res = decontaminate_file(dataset, manifest, index, out_path, tmp_dir, finder=finder, val_coco_ids=val_coco_ids,
                             workers=workers, batch_rows=batch_rows)
    removed = _removed_entries(res.removed_rows_table, res.removed_keys, res.prefix, res.matches)
    reject_counts = count_rejects(rejects)
    report = build_report(dataset, input_rows=res.input_rows + sum(reject_counts.values()),
                          input_images=res.input_images, kept_rows=res.kept_rows, removed_rows=res.removed_rows,
                          matched_images=len(res.matches), removed=removed, rejects=reject_counts)
    return DatasetResult(clean=None, report=report, samples=removed, clean_path=out_path)


def _clean_rows(dataset: str, manifest: pa.Table, keep: pa.Array, val_coco_ids: set[str] | None,
                workers: int) -> pa.Table:
    """The rows where ``keep``, with split train|val, sorted by example_id."""
    split_at = manifest.schema.get_field_index("split")
    manifest = manifest.set_column(split_at, manifest.schema.field(split_at),  # keeps type and nullability
                                   pretrain_split(manifest, dataset, val_coco_ids=val_coco_ids))
    return take_sorted(manifest, "example_id", keep=keep, workers=workers)


def _removed_entries(rows: pa.Table, row_keys: pa.Array, prefix: str, matches: dict[str, ImageMatch]) -> list[dict]:
    """One dict per removed image (image_id, url, reason, matched_eval, image_path), report order.

    ``rows``/``row_keys``: the manifest rows of the removed images; an image's url and path are the
    smallest of its rows' (any choice would do; this one does not depend on row order).
    """
    info: dict[str, dict] = {}
    columns = (rows.column(c).to_pylist() for c in ("image_id", "url", "image_path"))
    for key, image_id, url, path in zip((prefix + k for k in row_keys.to_pylist()), *columns):
        entry = info.setdefault(key, {"image_id": image_id, "url": None, "image_path": None})
        if url is not None and (entry["url"] is None or url < entry["url"]):
            entry["url"] = url
        if path is not None and (entry["image_path"] is None or path < entry["image_path"]):
            entry["image_path"] = path
    out = []
    for key, match in matches.items():
        entry = info[key]
        out.append({**entry, "image_key": key, "reason": match.reason, "matched_eval": sorted(match.refs)})
    out.sort(key=lambda e: (REASONS.index(e["reason"]), e["image_id"]))
    return out


def check_invariant(report: dict) -> None:
    """Raise if input_rows != kept_rows + removed_rows + sum(rejected_rows)."""
    rejected = sum(report["rejected_rows"].values())
    total = report["kept_rows"] + report["removed_rows"] + rejected
    if report["input_rows"] != total:
        raise AssertionError(
            f"cleaning report {report['dataset']}: input_rows {report['input_rows']} != kept {report['kept_rows']}"
            f" + removed {report['removed_rows']} + rejected {rejected}"
        )


def write_parquet(table: pa.Table, path: Path) -> None:
    """Deterministic parquet bytes (same table => same file)."""
    pq.write_table(table, path, compression="zstd", row_group_size=1 << 20)


def _rejects_path(manifest_dir: Path, dataset: str) -> Path:
    return Path(manifest_dir) / f"{dataset}.rejects.parquet"


def check_inputs(params) -> None:
    """Every manifest the stage reads (each scored dataset's, each pretraining corpus's and its rejects)
    exists, before any work: the first one missing raises InputsMissingError naming it and the ingest
    that writes it."""
    manifest_dir = Path(params.paths.data) / "manifests"
    scored = [d for d, splits in params.eval_splits().items() if splits]
    corpora = list(params.decontaminate.pretrain_datasets)
    wanted = [manifest_path(manifest_dir, d) for d in sorted(set(scored + corpora))]
    wanted += [_rejects_path(manifest_dir, d) for d in sorted(corpora)]
    for path in wanted:
        if not path.is_file():
            dataset = path.name.split(".", 1)[0]
            raise InputsMissingError(f"{path} does not exist: run `python -m pipeline ingest {dataset}` first")


def _read_rejects(manifest_dir: Path, dataset: str) -> pa.Table:
    path = _rejects_path(manifest_dir, dataset)
    if not path.exists():
        raise InputsMissingError(f"rejects file {path} does not exist: run the ingest stage for {dataset} first")
    return pq.read_table(path, columns=["reason"])


def top_up_val(clean: pa.Table, min_val_images: int, seed: int) -> pa.Table:
    """``clean`` (a COCO clean manifest) with at least ``min_val_images`` images in split val.

    The val images left after decontamination (Karpathy val minus eval images: on real data none,
    since VQA val covers val2014) are kept; the rest are drawn from the train images in the order of
    sha256("<seed>:<image_id>"), so the draw is the same on every machine and stable when other
    images come or go. All rows of a drawn image move to val. At most half the train images are
    drawn (a warning says so), so a small world keeps a training set.
    """
    split = clean.column("split")
    ids = clean.column("image_id").cast(pa.string())
    have = set(pc.unique(pc.filter(ids, pc.equal(split, "val"))).to_pylist())
    need = min_val_images - len(have)
    if need <= 0:
        return clean
    train_ids = sorted(set(pc.unique(pc.filter(ids, pc.equal(split, "train"))).to_pylist()),
                       key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())
    if need > len(train_ids) // 2:
        log.warning("coco: decontaminate.min_val_images=%d would leave fewer train than val images; drawing "
                    "%d of %d train images instead", min_val_images, len(train_ids) // 2, len(train_ids))
    drawn = train_ids[:min(need, len(train_ids) // 2)]
    log.info("coco: %d pretraining-val images after decontamination; %d train images drawn to reach %d",
             len(have), len(drawn), min_val_images)
    to_val = pc.is_in(ids, value_set=pa.array(drawn, pa.string()))
    at = clean.schema.get_field_index("split")
    new_split = pc.if_else(to_val, pa.scalar("val", split.type), split)
    return clean.set_column(at, clean.schema.field(at), new_split)  # keeps type and nullability


def _val_coco_ids(result: DatasetResult) -> set[str]:
    clean = result.clean
    val = clean.filter(pc.equal(clean.column("split"), "val"))
    return set(pc.unique(val.column("image_id").cast(pa.string())).to_pylist())


def eval_identities(params, eval_images: pa.Table, record: RunRecord | None = None) -> pa.Table:
    """``eval_images`` with what every file read here knows about them (:func:`inherit_identities`).

    Reads the manifests of the eval and pretraining datasets (same image, VG links) and COCO's test
    image list ``sources.coco.image_info_test`` (the test2015 URLs VQA test rows lack); null
    leaves the test images known by id only (logged). A path that does not exist raises
    FileNotFoundError naming the key.
    """
    cfg = params.decontaminate
    datasets = [d for d, splits in params.eval_splits().items() if splits] + list(cfg.pretrain_datasets)
    same, vg = read_known_images(Path(params.paths.data) / "manifests", datasets, eval_images)
    info = params.sources.coco.image_info_test
    if info is None:
        log.warning("sources.coco.image_info_test is null: COCO test2015 images (VQA test) are matched by id "
                    "only, not by their URLs")
    else:
        if not Path(info).exists():
            raise FileNotFoundError(f"sources.coco.image_info_test: {info} does not exist (COCO's "
                                    f"image_info_test2015.json; null to do without the test image URLs)")
        same.append(read_image_info(Path(info)))
        if record is not None:
            record.inputs["coco_image_info_test"] = Path(info)
    out = inherit_identities(eval_images, same, vg)
    log.info("eval set: %d rows of its own, %d lent by other files", eval_images.num_rows,
             out.num_rows - eval_images.num_rows)
    return out


def run(params) -> dict[str, dict]:
    """Stage entry: decontaminate every ``params.decontaminate.pretrain_datasets`` manifest.

    Returns the report dict of each dataset (also written to ``<data>/reports/cleaning``).
    """
    from pipeline.decontam import cleaning_report  # matplotlib is only needed once the data work is done

    cfg = params.decontaminate
    data = Path(params.paths.data)
    manifest_dir = data / "manifests"
    if not 0 <= cfg.phash_max_distance <= 32:
        raise ValueError(f"decontaminate.phash_max_distance must be in 0..32, got {cfg.phash_max_distance}")
    check_inputs(params)
    record = RunRecord("decontaminate", params.section_digest("decontaminate"))
    eval_splits = params.eval_splits()
    eval_images = read_eval_images(manifest_dir, eval_splits)
    index = EvalIndex.build(eval_identities(params, eval_images, record))
    log.info("eval set: %d images, %d refs from %s", len(index), len(index.ref_images),
             {d: list(s) for d, s in eval_splits.items()})
    cache = PhashCache(data / "cache" / "phash.parquet", workers=cfg.workers)
    finder = NearDuplicateFinder(index, cache, cfg.phash_max_distance) if cfg.near_duplicates else None

    results: dict[str, DatasetResult] = {}
    val_coco_ids = None
    data.mkdir(parents=True, exist_ok=True)
    streamed = Path(tempfile.mkdtemp(dir=data, prefix=".decontaminate.", suffix=".tmp"))  # beside clean/: a rename
    try:
        # COCO first: VG images of pretraining-val COCO images go to VG val
        for dataset in sorted(cfg.pretrain_datasets, key=lambda d: (d != "coco", d)):
            path = manifest_path(manifest_dir, dataset)
            record.inputs[f"manifest_{dataset}"] = path
            vg_val = val_coco_ids if dataset == "vg" and cfg.vg_val_from_coco else None
            if dataset == "coco":  # in memory: the val top-up draws from all its images (COCO's size is fixed)
                results[dataset] = decontaminate_dataset(
                    dataset, read_manifest(path), _read_rejects(manifest_dir, dataset), index, finder=finder,
                    workers=cfg.workers)
                results[dataset].clean = top_up_val(results[dataset].clean, cfg.min_val_images, params.seed)
                val_coco_ids = _val_coco_ids(results[dataset])
            else:  # streamed: web-scale manifests (CC, SBU, ...) in bounded memory (check_inputs found both files)
                runs = streamed / f"{dataset}.runs"
                runs.mkdir()
                results[dataset] = decontaminate_streamed(
                    dataset, path, _rejects_path(manifest_dir, dataset), index,
                    streamed / f"{dataset}.parquet", runs, finder=finder, val_coco_ids=vg_val, workers=cfg.workers)
                shutil.rmtree(runs)
            cache.save()
        for dataset in sorted(eval_splits):
            record.inputs[f"manifest_{dataset}"] = manifest_path(manifest_dir, dataset)

        with atomic_dir(data / "reports" / "cleaning", stage="decontaminate") as out:
            for dataset, result in sorted(results.items()):
                cleaning_report.write_cleaning_report(out, result.report, cleaning_report.pick_samples(result.samples, cfg.report_samples),
                                              eval_paths=index.image_paths, ref_images=index.ref_images)
            cleaning_report.write_summary(out, [r.report for _, r in sorted(results.items())])
        with atomic_dir(data / "clean", stage="decontaminate") as out:
            for dataset, result in sorted(results.items()):
                if result.clean_path is not None:
                    os.replace(result.clean_path, out / f"{dataset}.parquet")
                else:
                    write_parquet(result.clean, out / f"{dataset}.parquet")
                rep = result.report
                record.counts[dataset] = {k: rep[k] for k in ("input_rows", "kept_rows", "removed_rows")} | {
                    "removed_images": sum(rep["removed_images"].values()),
                    "rejected_rows": sum(rep["rejected_rows"].values()),
                }
            record.extra["eval_images"] = len(index)
            record.extra["eval_splits"] = params.eval_split_origins()
            record.write(out)
    finally:
        shutil.rmtree(streamed, ignore_errors=True)
    for dataset, result in sorted(results.items()):
        rep = result.report
        log.info("%s: %d input rows -> %d kept, %d removed (%s), %d rejected", dataset, rep["input_rows"],
                 rep["kept_rows"], rep["removed_rows"],
                 ", ".join(f"{r} {n}" for r, n in rep["removed_images"].items() if n) or "no images",
                 sum(rep["rejected_rows"].values()))
    return {d: r.report for d, r in results.items()}
