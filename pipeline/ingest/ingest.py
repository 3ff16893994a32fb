"""Stage ``ingest@<dataset>``: raw annotations in their real formats -> manifest + rejects.

For each dataset the reader (pipeline/ingest/sources/<dataset>.py) yields one Row or Reject per raw row;
this module removes duplicate ids (the first wins), checks images (pipeline/common/image_io.py) and
streams both outputs in chunks of ``params.ingest.chunk_rows``:

    <paths.data>/manifests/<dataset>.parquet          (docs/design.md §6)
    <paths.data>/manifests/<dataset>.rejects.parquet  (reason, detail and the raw row)
    <paths.data>/manifests/<dataset>._run.json        (counts: rows_in = manifest_rows + rejects)

Every byte of the three is written to temporary files first, then they are renamed into place,
the run record last (:func:`publish_all_or_none`). A run first removes the temporaries a killed
run of the same dataset left (``.<dataset>.parquet.<random>.tmp`` and the like), no other file.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from pipeline.common.ownership import ForeignDirectoryError, remove_stale_temp_files
from pipeline.common.runinfo import RunRecord, json_bytes, stage_bytes
from pipeline.common.image_io import probe_image_detail
from pipeline.ingest.manifest import BATCH_ROWS, REJECT_SCHEMA, ParquetStreamWriter, manifest_schema
from pipeline.ingest.sources import load_reader
from pipeline.params.parser import ParamsError
from pipeline.common.source_records import (
    DUPLICATE_ID, MALFORMED_ROW, MISSING_IMAGE, NON_UTF8, UNREADABLE_IMAGE, Problem, ReadContext, Reject, Row,
    SourceFormatError, raw_text,
)

log = logging.getLogger("pipeline.ingest.ingest")


@dataclass(frozen=True)
class IngestResult:
    dataset: str
    rows_in: int
    manifest_rows: int
    rejects: dict[str, int]  # reason -> count
    manifest_path: Path
    rejects_path: Path
    notes: dict[str, int] = field(default_factory=dict)

    @property
    def rejected(self) -> int:
        return sum(self.rejects.values())

    def summary(self) -> str:
        reasons = ", ".join(f"{r} {n}" for r, n in sorted(self.rejects.items(), key=lambda kv: (-kv[1], kv[0])))
        return (f"ingest {self.dataset}: {self.rows_in} rows -> {self.manifest_rows} manifest, "
                f"{self.rejected} rejects" + (f" ({reasons})" if reasons else ""))


class SeenKeys:
    """A set of 64-bit id hashes in sorted numpy runs: ~8 bytes per id instead of ~70 for a set.

    Runs are merged when a newer one grows to the size of its predecessor (as in an LSM tree), so
    at most ~log2(n / chunk) runs are searched per chunk. Two different ids collide with
    probability ~n^2 / 2^65 (3e-7 for 3.3M ids); the hash is fixed, so any collision is repeatable.
    """

    def __init__(self) -> None:
        self._runs: list[np.ndarray] = []

    def __len__(self) -> int:
        return sum(len(r) for r in self._runs)

    def first_seen(self, keys: np.ndarray) -> np.ndarray:
        """bool [n]: True where ``keys[i]`` occurs neither earlier in ``keys`` nor in a previous call."""
        keys = np.asarray(keys, dtype=np.uint64)
        fresh = np.zeros(len(keys), dtype=bool)
        if not len(keys):
            return fresh
        _, first_index = np.unique(keys, return_index=True)
        fresh[first_index] = True
        for run in self._runs:
            pos = np.minimum(np.searchsorted(run, keys), len(run) - 1)
            fresh &= run[pos] != keys
        if fresh.any():
            self._runs.append(np.sort(keys[fresh]))
        while len(self._runs) > 1 and len(self._runs[-2]) <= len(self._runs[-1]):
            newer = self._runs.pop()
            self._runs[-1] = np.sort(np.concatenate([self._runs[-1], newer]), kind="stable")
        return fresh


def id_hash(example_id: str) -> int:
    """Deterministic 64-bit hash of an example id (blake2b), for :class:`SeenKeys`."""
    return int.from_bytes(hashlib.blake2b(example_id.encode("utf-8"), digest_size=8).digest(), "little")


class ImageChecker:
    """Checks the files a Row needs; caches per path when many rows share an image."""

    def __init__(self, *, full: bool, max_pixels: int, cache: bool) -> None:
        self.full = full
        self.max_pixels = max_pixels
        self._cache: dict[str, Problem | None] | None = {} if cache else None
        self.checked = 0

    def _image(self, path: str) -> Problem | None:
        if self._cache is not None and path in self._cache:
            return self._cache[path]
        self.checked += 1
        reason, detail = probe_image_detail(path, full=self.full, max_pixels=self.max_pixels)
        problem = (reason, detail) if reason else None
        if self._cache is not None:
            self._cache[path] = problem
        return problem

    @staticmethod
    def _aux(path: str) -> Problem | None:
        try:
            json.loads(Path(path).read_bytes())
        except FileNotFoundError:
            return MISSING_IMAGE, f"{path}: no such file"
        except (OSError, ValueError) as err:
            return UNREADABLE_IMAGE, f"{path}: not a readable JSON file ({err})"[:500]
        return None

    def check(self, row: Row) -> Problem | None:
        for path in row.images:
            if problem := self._image(path):
                return problem
        for path in row.aux_files:
            if self._cache is not None and path in self._cache:
                problem = self._cache[path]
            else:
                problem = self._aux(path)
                if self._cache is not None:
                    self._cache[path] = problem
            if problem:
                return problem
        return None


def _batches(items: Iterable, size: int) -> Iterator[list]:
    it = iter(items)
    while batch := list(itertools.islice(it, size)):
        yield batch


def _reject_record(dataset: str, rej: Reject) -> dict[str, str]:
    return {"dataset": dataset, "source_file": raw_text(rej.source_file), "locator": raw_text(rej.locator),
            "reason": rej.reason, "detail": raw_text(rej.detail), "raw_row": raw_text(rej.raw)}


def publish_all_or_none(record: RunRecord, run_file: Path, writers: Sequence[ParquetStreamWriter]) -> None:
    """Move the closed ``writers``' files and ``record`` into place: all of them, or none.

    Every byte (the record's too) is written to temporaries before anything is renamed, so a full
    disk leaves the previous outputs as they were. The old record goes before the first rename and
    the new one comes last, so a kill between the renames leaves no record: an unfinished run,
    never a record beside outputs of another run. On an error the temporaries are removed.
    """
    staged = None
    try:
        staged = stage_bytes(run_file, json_bytes(record.render()))
        run_file.unlink(missing_ok=True)
        for writer in writers:
            writer.publish()
        record.check_outputs(run_file)
        os.replace(staged, run_file)
    except BaseException:
        for writer in writers:
            writer.abort()
        if staged is not None:
            staged.unlink(missing_ok=True)
        raise


def _refuse_empty(result: IngestResult, record: RunRecord, run_file: Path, manifest: ParquetStreamWriter,
                  rejects: ParquetStreamWriter) -> None:
    """Raise SourceFormatError (exit status 2) for an ingest that kept no row: every row rejected, or
    a source without rows; a dataset with nothing kept is never what a user wants. The rejects file
    is published for the user to read; the manifest is not, and the old run record goes (as in
    :func:`publish_all_or_none`), so no record vouches for an earlier manifest beside these rejects."""
    name = f"ingest@{result.dataset}"
    if not result.rows_in:
        manifest.abort()
        rejects.abort()
        read = ", ".join(str(p) for p in record.inputs.values())
        raise SourceFormatError(f"{name}: the source holds no row (read: {read}); check that it is the "
                                "published file, not an empty download")
    run_file.unlink(missing_ok=True)
    manifest.abort()
    rejects.publish()
    top = ", ".join(f"{r} {n}" for r, n in sorted(result.rejects.items(), key=lambda kv: (-kv[1], kv[0]))[:3])
    raise SourceFormatError(f"{name}: 0 of {result.rows_in} rows kept; top reject reasons: {top}; "
                            f"every rejected row, with its reason and record: {result.rejects_path}")


def ingest_dataset(params, dataset: str, *, progress: bool | None = None) -> IngestResult:
    """Read ``dataset`` from ``params.sources`` and write its manifest, rejects and run record."""
    cfg = params.ingest
    reader = load_reader(dataset)
    out_dir = Path(params.paths.data) / "manifests"
    record = RunRecord(f"ingest@{dataset}", params.section_digest("sources", "ingest"))
    record.inputs.update({k: Path(v) for k, v in reader.input_files(params.sources).items()})
    ctx = ReadContext(params.sources, min_text_chars=cfg.min_text_chars, max_text_chars=cfg.max_text_chars,
                      progress=progress)
    checker = ImageChecker(full=cfg.full_image_check, max_pixels=cfg.max_image_pixels,
                           cache=reader.IMAGES_REPEAT) if cfg.check_images else None
    outputs = [out_dir / f"{dataset}{end}" for end in (".parquet", ".rejects.parquet", "._run.json")]
    for path in outputs:
        if path.is_dir() and not path.is_symlink():  # checked before the work, not found at its end
            raise ForeignDirectoryError(path, "replace with the stage's output file")
    for path in outputs:  # what a killed run of this dataset left (this dataset's lock is held)
        remove_stale_temp_files(path)
    seen, reasons, rows_in = SeenKeys(), Counter(), 0
    manifest = ParquetStreamWriter(out_dir / f"{dataset}.parquet", manifest_schema(reader.COLUMNS),
                                   chunk_rows=cfg.chunk_rows)
    rejects = ParquetStreamWriter(out_dir / f"{dataset}.rejects.parquet", REJECT_SCHEMA, chunk_rows=cfg.chunk_rows)
    try:
        for batch in _batches(reader.read(ctx), min(cfg.chunk_rows, BATCH_ROWS)):
            rows_in += len(batch)
            rows = [item for item in batch if isinstance(item, Row)]
            keys = np.fromiter((r.key if r.key is not None else id_hash(r.values["example_id"]) for r in rows),
                               dtype=np.uint64, count=len(rows))
            fresh = iter(seen.first_seen(keys).tolist())
            accepted: list[Row] = []
            for item in batch:
                if isinstance(item, Row):
                    if not next(fresh):
                        item = Reject(DUPLICATE_ID, f"example_id {item.values['example_id']} already seen "
                                      "(the first row with an id wins)", item.raw, item.source_file, item.locator)
                    elif checker is not None and (problem := checker.check(item)):
                        item = Reject(problem[0], problem[1], item.raw, item.source_file, item.locator)
                    else:
                        item.values["dataset"] = dataset
                        accepted.append(item)
                        continue
                reasons[item.reason] += 1
                rejects.append(_reject_record(dataset, item))
            # a value the manifest's columns cannot hold rejects its row, not the dataset
            for i, why in manifest.append_rows([row.values for row in accepted]):
                row = accepted[i]
                reason = NON_UTF8 if "Unicode" in why else MALFORMED_ROW
                reasons[reason] += 1
                rejects.append(_reject_record(dataset, Reject(reason, why, row.raw, row.source_file, row.locator)))
        manifest_rows = manifest.close()
        rejects.close()
    except BaseException:
        manifest.abort()
        rejects.abort()
        raise
    result = IngestResult(dataset, rows_in, manifest_rows, dict(sorted(reasons.items())), manifest.path,
                          rejects.path, dict(sorted(ctx.notes.items())))
    assert rows_in == result.manifest_rows + result.rejected, "a raw row was lost"
    if not manifest_rows:
        _refuse_empty(result, record, out_dir / f"{dataset}._run.json", manifest, rejects)
    record.counts.update(rows_in=rows_in, manifest_rows=manifest_rows, rejects=result.rejected,
                         rejects_by_reason=result.rejects, images_checked=checker.checked if checker else 0,
                         **ctx.notes)
    record.extra["outputs"] = {"manifest": str(manifest.path), "rejects": str(rejects.path)}
    publish_all_or_none(record, out_dir / f"{dataset}._run.json", (manifest, rejects))
    log.info(result.summary())
    return result


def check_item(params, item: str) -> None:
    """Refuse an ITEM that names no dataset (ParamsError); the CLI calls it before taking the locks."""
    load_reader(item)


def run(params, item: str | None = None) -> list[IngestResult]:
    """Stage entry: ingest ``item`` (a dataset name) or every dataset of ``params.ingest.datasets``."""
    datasets: Sequence[str] = [item] if item else list(params.ingest.datasets)
    if not datasets:
        raise ParamsError("ingest: ingest.datasets is empty: nothing to ingest; name the dataset "
                          "(`python -m pipeline ingest coco`) or list it in ingest.datasets")
    return [ingest_dataset(params, name) for name in datasets]
