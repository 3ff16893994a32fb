"""Stage ``build_dbs``: feature shards -> image DBs, manifests -> text DBs (docs/design.md §9).

Reads ``data/features/<name>/`` (every finished feature directory, detected and ``_gt``),
``data/clean/{coco,vg,cc,sbu}.parquet`` and ``data/manifests/<dataset>.parquet``; writes
``data/db/img/<name>/`` and ``data/db/txt/<name>/`` (each built in a temporary directory and
renamed atomically, each with its own ``_run.json``) and ``data/db/{img,txt}/_run.json`` with
every DB's counts. Records whose image is not
in its image DB (e.g. rejected at extraction) are dropped and counted; texts longer than
``max_txt_len`` are truncated and counted.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.common.ownership import (ForeignDirectoryError, atomic_dir, check_prunable, preflight, prune,
                                       remove_stale_temps)
from pipeline.common.runinfo import RUN_FILE, InputsMissingError, RunRecord, atomic_write_json
from pipeline.params.parser import Params
from pipeline.stores.image_db_builder import build_image_db
from pipeline.stores.lmdb_store import (ID2LEN_FILE, IMG2TXTS_FILE, META_FILE, TXT2IMG_FILE, TXT_DB_KIND, LmdbWriter,
                                        encode_value, text_length)
from pipeline.stores.readers import ImageDb, read_json
from pipeline.stores.text_db_builder import (TextDbSpec, nlvr2_specs, pretrain_specs, refcoco_specs, retrieval_specs,
                                             snli_ve_specs, text_db_names, vqa_specs)
from pipeline.stores.tokenization import WordPieceTokenizer
from pipeline.stores.vcr_text import vcr_specs

log = logging.getLogger(__name__)


def write_text_db(out_dir: Path, spec: TextDbSpec, tok: WordPieceTokenizer, nbb: dict[str, dict[str, int]], *,
                  compression: str, commit_every: int, params_digest: str, inputs: dict[str, Path]) -> dict[str, Any]:
    """Drop records with missing images, then write ``out_dir`` with its side files; returns counts."""
    dropped: Counter[str] = Counter()
    kept = []
    for rec in spec.records:
        images = rec["image_ids"] + rec.get("gt_image_ids", [])
        missing = [q for q in images if q.partition("/")[2] not in nbb.get(q.partition("/")[0], {})]
        if missing:
            db = missing[0].partition("/")[0]
            dropped["missing_image_db" if db not in nbb else "missing_image"] += 1
            continue
        kept.append(rec)
    img_dbs = sorted({q.partition("/")[0] for rec in spec.records
                      for q in rec["image_ids"] + rec.get("gt_image_ids", [])})
    counts = {"examples": len(kept), "input_rows": len(spec.records), "truncated": spec.truncated,
              "dropped": dict(sorted(dropped.items()))}
    if not kept:
        return {**counts, "skipped": "no example has all its images (missing image DBs: "
                f"{sorted(set(img_dbs) - set(nbb))})"}

    remove_stale_temps(out_dir)
    run = RunRecord("build_dbs", params_digest)
    run.inputs.update(inputs)
    id2len, txt2img, img2txts = {}, {}, {}
    with atomic_dir(out_dir, stage="build_dbs") as tmp:
        writer = LmdbWriter(tmp / ".work", commit_every=commit_every, name=str(out_dir))
        try:
            for rec in kept:
                value = {k: v for k, v in rec.items() if k != "example_id"}
                writer.put(rec["example_id"], encode_value(value, compression))
                id2len[rec["example_id"]] = text_length(rec)
                txt2img[rec["example_id"]] = rec["image_ids"]
                for image in rec["image_ids"]:
                    img2txts.setdefault(image, []).append(rec["example_id"])
            writer.finish(tmp)
        except BaseException:
            writer.abort()
            raise
        lens = np.fromiter(id2len.values(), dtype=np.int64)
        meta = {"kind": TXT_DB_KIND, "name": spec.name, "task": spec.task, "split": spec.split,
                "datasets": spec.datasets, **tok.meta(), "max_txt_len": spec.max_txt_len,
                "img_db": img_dbs, "image_layout": spec.image_layout, "num_examples": len(kept),
                "truncated": spec.truncated, "dropped": counts["dropped"], "build": {"compression": compression},
                "length": {"mean": round(float(lens.mean()), 3), "max": int(lens.max())}, **spec.meta}
        atomic_write_json(tmp / META_FILE, meta)
        atomic_write_json(tmp / ID2LEN_FILE, id2len, indent=None)
        atomic_write_json(tmp / TXT2IMG_FILE, txt2img, indent=None)
        atomic_write_json(tmp / IMG2TXTS_FILE, {k: sorted(v) for k, v in img2txts.items()}, indent=None)
        for name, obj in spec.side_files.items():
            atomic_write_json(tmp / name, obj)
        run.counts.update(counts)
        run.write(tmp)
    return counts


def build_image_dbs(params: Params, feat_root: Path, img_root: Path) -> dict[str, dict[str, Any]]:
    cfg = params.build_dbs
    results = {}
    feat_dirs = sorted(d for d in feat_root.iterdir() if d.is_dir() and (d / META_FILE).is_file()) \
        if feat_root.is_dir() else []
    for feat_dir in feat_dirs:
        out = img_root / feat_dir.name
        remove_stale_temps(out)
        results[feat_dir.name] = build_image_db(feat_dir, out, compression=cfg.compression,
                                                commit_every=cfg.commit_every,
                                                params_digest=params.section_digest("build_dbs"))
    return results


def text_db_specs(params: Params, tok: WordPieceTokenizer, img_root: Path) -> list[tuple[TextDbSpec, dict[str, Path]]]:
    """Every text DB the configured datasets give, with the input files each depends on."""
    cfg, data = params.build_dbs, params.paths.data
    manifests, clean = data / "manifests", data / "clean"
    datasets = set(params.ingest.datasets)
    out: list[tuple[TextDbSpec, dict[str, Path]]] = []

    def add(specs: list[TextDbSpec], inputs: dict[str, Path]) -> None:
        out.extend((s, inputs) for s in specs)

    corpora = params.pretrain_corpora()
    if corpora:
        add(pretrain_specs(clean, corpora, tok, max_len=cfg.max_txt_len, outdomain_val_size=cfg.outdomain_val_size,
                           seed=params.seed), {f"clean_{d}": clean / f"{d}.parquet" for d in corpora})
    if "vqa" in datasets:
        add(vqa_specs(manifests / "vqa.parquet", tok, max_len=cfg.max_txt_len,
                      min_answer_count=cfg.vqa_min_answer_count), {"vqa": manifests / "vqa.parquet"})
    if "vcr" in datasets:
        add(vcr_specs(manifests / "vcr.parquet", tok, max_len=cfg.max_txt_len_vcr), {"vcr": manifests / "vcr.parquet"})
    if "nlvr2" in datasets:
        add(nlvr2_specs(manifests / "nlvr2.parquet", tok, max_len=cfg.max_txt_len),
            {"nlvr2": manifests / "nlvr2.parquet"})
    if "snli_ve" in datasets:
        add(snli_ve_specs(manifests / "snli_ve.parquet", tok, max_len=cfg.max_txt_len),
            {"snli_ve": manifests / "snli_ve.parquet"})
    for dataset in ("coco", "flickr30k"):
        if dataset in datasets:
            add(retrieval_specs(manifests / f"{dataset}.parquet", dataset, tok, max_len=cfg.max_txt_len),
                {dataset: manifests / f"{dataset}.parquet"})
    if "refcoco" in datasets:
        gt_name = "coco_gt" if (img_root / "coco_gt" / META_FILE).is_file() else None
        gt_db = ImageDb(img_root / gt_name) if gt_name else None

        def gt_boxes_of(image_id: str) -> np.ndarray | None:
            return np.asarray(gt_db[image_id]["boxes"]) if gt_db is not None and image_id in gt_db else None

        instances = params.sources.refcoco.instances
        add(refcoco_specs(manifests / "refcoco.parquet", instances, tok, max_len=cfg.max_txt_len,
                          gt_img_db=gt_name, gt_boxes_of=gt_boxes_of), {"refcoco": manifests / "refcoco.parquet"})
    return out


def _preflight(params: Params, img_root: Path, txt_root: Path) -> None:
    """Before any DB is built: every image and text DB directory this run may replace is the
    pipeline's, and the summaries' ``_run.json`` paths are free for a file. (A foreign directory at
    a later DB, or in place of a summary record, used to stop the stage only after others were
    rebuilt, or at its very end.)"""
    feat_root = params.paths.data / "features"
    feat_dirs = sorted(d for d in feat_root.iterdir() if d.is_dir() and (d / META_FILE).is_file()) \
        if feat_root.is_dir() else []
    corpora = params.pretrain_corpora()
    absent = [d for d in corpora if not (params.paths.data / "clean" / f"{d}.parquet").is_file()]
    if absent:  # named before any DB is built, not found at its pretraining DBs
        raise InputsMissingError(
            f"build_dbs: pretraining corpora without a clean manifest: {', '.join(absent)} "
            f"({', '.join(str(params.paths.data / 'clean' / f'{d}.parquet') for d in absent)}): run `python -m "
            "pipeline ingest` and `decontaminate` first, or leave it out of ingest.datasets "
            "(the corpora used are those ingest.datasets and decontaminate.pretrain_datasets both name)")
    txt_names = text_db_names(params.ingest.datasets, corpora=corpora)
    preflight(*(img_root / d.name for d in feat_dirs), *(txt_root / name for name in txt_names))
    for record in (img_root / RUN_FILE, txt_root / RUN_FILE):
        if record.is_symlink() or (record.exists() and not record.is_file()):
            raise ForeignDirectoryError(record, "replace with the stage's run record")
    # what this run will not write goes at its end (prune): only the pipeline's own may be there
    check_prunable(img_root, [*(d.name for d in feat_dirs), RUN_FILE])
    check_prunable(txt_root, [*txt_names, RUN_FILE])


def run(params: Params) -> dict[str, Any]:
    """Build every image DB, then every text DB; returns {"img": counts per DB, "txt": counts per DB}.

    With ``build_dbs.source: uniter_release`` the DBs are UNITER's released ones, converted by
    ``import_uniter_db`` instead (returns its report).
    """
    cfg, data = params.build_dbs, params.paths.data
    if cfg.source == "uniter_release":
        from pipeline.stores.import_uniter_db import run as import_release  # it imports this module

        return import_release(params)
    img_root, txt_root = data / "db" / "img", data / "db" / "txt"
    _preflight(params, img_root, txt_root)
    digest = params.section_digest("build_dbs", "seed")
    img_summary = RunRecord("build_dbs", digest)
    img_summary.counts.update(build_image_dbs(params, data / "features", img_root))
    img_root.mkdir(parents=True, exist_ok=True)
    prune(img_root, [*img_summary.counts, RUN_FILE])  # DVC leaves the outputs in place (persist: true)
    # the summary vouches for every DB it counts: each must be complete (its data and its own record)
    db_files = ("data.mdb", "_run.json")
    img_summary.write(img_root, require=[img_root / n / f for n in img_summary.counts for f in db_files])

    nbb = {name: read_json(img_root / name / "nbb.json") for name in img_summary.counts}
    tok = WordPieceTokenizer(cfg.tokenizer)
    txt_summary = RunRecord("build_dbs", digest)
    for spec, inputs in text_db_specs(params, tok, img_root):
        counts = write_text_db(txt_root / spec.name, spec, tok, nbb, compression=cfg.compression,
                               commit_every=cfg.commit_every, params_digest=digest, inputs=inputs)
        txt_summary.counts[spec.name] = counts
        if "skipped" in counts:
            log.warning("text DB %s not written: %s", spec.name, counts["skipped"])
    txt_root.mkdir(parents=True, exist_ok=True)
    built = [n for n, c in txt_summary.counts.items() if "skipped" not in c]
    prune(txt_root, [*built, RUN_FILE])
    txt_summary.write(txt_root, require=[txt_root / n / f for n in built for f in db_files])
    txt = txt_summary.counts
    log.info("build_dbs: %d image DBs, %d text DBs (%d examples, %d truncated, %d dropped, %d skipped)",
             len(img_summary.counts), sum("skipped" not in c for c in txt.values()),
             sum(c["examples"] for c in txt.values()), sum(c["truncated"] for c in txt.values()),
             sum(sum(c["dropped"].values()) for c in txt.values()), sum("skipped" in c for c in txt.values()))
    return {"img": img_summary.counts, "txt": txt_summary.counts}
