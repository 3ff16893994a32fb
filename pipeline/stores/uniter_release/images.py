"""The release's image LMDBs -> this project's image DBs (one per image source, docs/design.md §9).

Several release directories can feed one DB (``coco_train2014`` + ``coco_val2014`` -> ``coco``).
Each entry is cut to the region count of the release's nbb file (or, where the release has no nbb
file, to the count its rule gives from the entry's ``conf``), converted by
:func:`~pipeline.stores.uniter_release.formats.image_record` and written in sorted id order. Entries that
cannot be converted are skipped and counted by reason, as are those whose feature or class count is
not the DB's (the most common in a sample of its entries); one that would need pickle stops the import.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import lmdb
import numpy as np

from pipeline.common.progress import track
from pipeline.common.ownership import atomic_dir
from pipeline.common.runinfo import RunRecord, atomic_write_json, file_digest
from pipeline.common.source_records import SourceFormatError
from pipeline.stores.image_db_builder import FORMAT_VERSION, PER_REGION
from pipeline.stores.lmdb_store import IMG_DB_KIND, META_FILE, NBB_FILE, LmdbWriter, encode_value
from pipeline.stores.uniter_release.formats import (KEYS_ENTRY, EntryFormatError, decode_image_entry, feature_db_name,
                                                    image_record, nbb_file_name, release_json, rule_num_bb)
from pipeline.stores.uniter_release.layout import image_id

log = logging.getLogger(__name__)
STAGE = "import_uniter_db"
SAMPLES_PER_REASON = 5  # skipped entries shown per reason in the report
SHAPE_SAMPLE = 64  # entries decoded up front to decide a DB's (D, C+1): one damaged entry is outvoted


@dataclass(frozen=True)
class Rule:
    """The region-count rule that names the release's LMDB and nbb file."""

    conf_th: float
    max_bb: int
    min_bb: int


@dataclass
class SkipLog:
    """Skipped entries by reason, with the first few details of each (for the report)."""

    counts: Counter = field(default_factory=Counter)
    samples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, detail: str) -> None:
        self.counts[reason] += 1
        shown = self.samples.setdefault(reason, [])
        if len(shown) < SAMPLES_PER_REASON:
            shown.append(detail)

    def as_dict(self) -> dict[str, Any]:
        return {"skipped": dict(sorted(self.counts.items())), "skipped_samples": dict(sorted(self.samples.items()))}


@dataclass(frozen=True)
class ReleaseImageDb:
    """One release directory's feature LMDB and nbb file (``nbb`` None: the release has none)."""

    directory: str
    lmdb_path: Path
    compressed: bool
    nbb: dict[str, int] | None


def find_release_db(release_dir: Path, rule: Rule) -> ReleaseImageDb | None:
    """The ``feat_th.._compressed`` LMDB of ``release_dir`` (else the msgpack one) and its nbb file."""
    base = feature_db_name(rule.conf_th, rule.max_bb, rule.min_bb)
    for path, compressed in ((release_dir / f"{base}_compressed", True), (release_dir / base, False)):
        if (path / "data.mdb").is_file():
            nbb_path = release_dir / nbb_file_name(rule.conf_th, rule.max_bb, rule.min_bb)
            # present but unreadable is an error, not "no nbb file" (the rule would count other regions)
            nbb = release_json(nbb_path, "a JSON object {image name: regions}") if nbb_path.exists() else None
            return ReleaseImageDb(release_dir.name, path, compressed, nbb)
    return None


def _open(path: Path) -> lmdb.Environment:
    return lmdb.open(str(path), readonly=True, lock=False, readahead=False, subdir=True, max_readers=1)


def lmdb_problem(path: Path) -> str | None:
    """Why the release LMDB directory ``path`` cannot be opened read-only (a data.mdb cut short or
    overwritten), or None."""
    try:
        _open(path).close()
    except lmdb.Error as err:
        return f"{path}: not a readable LMDB ({str(err).removeprefix(f'{path}: ')}); download or extract it again"
    return None


def _num_bb(db: ReleaseImageDb, fname: str, fields: dict[str, np.ndarray], rule: Rule) -> tuple[int, str]:
    """(regions to keep, where the count came from): the nbb file, or the rule where the release has none."""
    if db.nbb is None:
        conf = fields.get("conf")
        if conf is None:
            raise EntryFormatError("missing_field", f"{db.lmdb_path}: {fname!r} has no 'conf' to count regions by")
        return rule_num_bb(conf, rule.conf_th, rule.max_bb, rule.min_bb), "rule"
    if fname not in db.nbb:
        raise EntryFormatError("not_in_nbb", f"{db.lmdb_path}: {fname!r} has no count in the nbb file")
    return int(db.nbb[fname]), "nbb_file"


def _index(dbs: Sequence[ReleaseImageDb], txns: Sequence[Any], skips: SkipLog) -> list[tuple[bytes, int, str]]:
    """(project id, release DB index, release name) of every mappable entry, sorted by id."""
    seen: dict[str, str] = {}
    entries = []
    for d, (db, txn) in enumerate(zip(dbs, txns)):
        for raw in txn.cursor().iternext(keys=True, values=False):
            try:
                name = bytes(raw).decode("utf-8")
            except UnicodeDecodeError:
                skips.add("unmapped_name", f"{db.lmdb_path}: key {bytes(raw)!r} is not UTF-8")
                continue
            if name == KEYS_ENTRY:
                continue
            iid = image_id(name, db.directory)
            if iid is None:
                skips.add("unmapped_name", f"{db.lmdb_path}: {name!r} is not <{db.directory}>_<id>.npz")
            elif iid in seen:
                skips.add("duplicate_image", f"{db.lmdb_path}: {name!r} is image {iid}, already read from {seen[iid]}")
            else:
                seen[iid] = f"{db.directory}/{name}"
                entries.append((iid.encode("utf-8"), d, name))
    entries.sort()
    return entries


@dataclass
class _Tally:
    """What one image DB received: regions kept per image, regions dropped, where counts came from."""

    nbb: dict[str, int] = field(default_factory=dict)
    beyond_nbb: int = 0
    nbb_from: Counter = field(default_factory=Counter)
    shape: tuple[int, int] | None = None  # (D, C+1) of the DB: expected_shape()

    def counts(self) -> dict[str, Any]:
        return {"images": len(self.nbb), "regions": sum(self.nbb.values()), "regions_beyond_nbb": self.beyond_nbb,
                "nbb_from": dict(sorted(self.nbb_from.items()))}


def _convert(db: ReleaseImageDb, txn: Any, fname: str, rule: Rule) -> tuple[dict[str, Any], int, str, int]:
    """(project record, regions kept, where the count came from, regions stored) of one release entry;
    raises :class:`EntryFormatError` when it does not convert."""
    fields = decode_image_entry(txn.get(fname.encode("utf-8")), compressed=db.compressed, db=db.lmdb_path, key=fname)
    nbb, how = _num_bb(db, fname, fields, rule)
    return image_record(fields, nbb, db=db.lmdb_path, key=fname), nbb, how, fields["features"].shape[0]


def _dims(rec: dict[str, Any]) -> tuple[int, int]:
    return rec["features"].shape[1], rec["soft_labels"].shape[1]


def expected_shape(dbs: Sequence[ReleaseImageDb], txns: Sequence[Any], entries: list[tuple[bytes, int, str]],
                   rule: Rule) -> tuple[tuple[int, int], int] | None:
    """(the DB's (D, C+1), entries it was decided from): the most common among up to
    :data:`SHAPE_SAMPLE` entries spread evenly over ``entries`` (a tie: the one met first), so one
    damaged entry cannot set the shape that all others are measured by. None: no sampled entry converts."""
    seen: Counter = Counter()
    for _, d, fname in entries[::max(1, len(entries) // SHAPE_SAMPLE)][:SHAPE_SAMPLE]:
        try:
            seen[_dims(_convert(dbs[d], txns[d], fname, rule)[0])] += 1
        except EntryFormatError:  # counted when the entry's turn comes
            continue
    return (seen.most_common(1)[0][0], seen.total()) if seen else None


def _records(dbs: Sequence[ReleaseImageDb], txns: Sequence[Any], entries: list[tuple[bytes, int, str]], rule: Rule,
             skips: SkipLog, tally: _Tally) -> Iterator[tuple[bytes, str, dict[str, Any]]]:
    """(key, release name, project record) of each entry that converts and has the DB's (D, C+1)
    (:func:`expected_shape`; the first converted entry's where no sampled one converts); the
    others go to ``skips``."""
    decided = expected_shape(dbs, txns, entries, rule)
    tally.shape, basis = decided if decided else (None, 0)
    why = f"the most common in {basis} sampled entries" if basis else "its first entry converted"
    for key, d, fname in entries:
        db = dbs[d]
        try:
            rec, nbb, how, stored = _convert(db, txns[d], fname, rule)
        except EntryFormatError as err:
            skips.add(err.reason, str(err))
            continue
        dims = _dims(rec)
        if tally.shape is not None and dims != tally.shape:
            skips.add("bad_shape", f"{db.lmdb_path}: {fname!r} has D, C+1 = {dims}, the DB {tally.shape} ({why})")
            continue
        tally.shape = dims
        tally.nbb[key.decode("utf-8")] = nbb
        tally.nbb_from[how] += 1
        tally.beyond_nbb += stored - nbb
        yield key, fname, rec


def _image_meta(name: str, dbs: Sequence[ReleaseImageDb], rule: Rule, tally: _Tally, class_names: list[str] | None,
                build: dict[str, Any]) -> dict[str, Any]:
    dim, classes = tally.shape
    if class_names is not None and len(class_names) + 1 != classes:
        raise SourceFormatError(f"build_dbs.uniter_release.class_names lists {len(class_names)} classes, but the "
                                f"soft labels of {name} have {classes} columns (classes + background)")
    return {"kind": IMG_DB_KIND, "name": name, "format_version": FORMAT_VERSION, "feature_dim": dim,
            "num_classes": classes,
            "class_names": ["__background__", *class_names] if class_names is not None else None,
            "detector": "uniter_release", "mode": "detected", "num_images": len(tally.nbb),
            "num_regions": sum(tally.nbb.values()), "build": build,
            "dtypes": {k: np.dtype(v).name for k, v in PER_REGION.items()},
            "boxes": "normalized corners (the release stores no image size; image_h = image_w = 1)",
            "source": {"uniter_release": [str(db.lmdb_path) for db in dbs], "rule": vars(rule)},
            "value": "compressed msgpack map; arrays as {data: raw bytes, dtype, shape}"}


def convert_image_db(name: str, dbs: Sequence[ReleaseImageDb], out_dir: Path, rule: Rule, *,
                     class_names: list[str] | None, compression: str, commit_every: int,
                     params_digest: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Write image DB ``name`` at ``out_dir`` from the release DBs ``dbs``.

    Returns (report entry, {release image name: qualified id ``"<name>/<id>"``} of every image
    written). When no entry converts, nothing is written (an earlier DB at ``out_dir`` stays).
    """
    skips, tally, written = SkipLog(), _Tally(), {}
    envs = [_open(db.lmdb_path) for db in dbs]
    try:
        txns = [env.begin(buffers=True) for env in envs]
        entries = _index(dbs, txns, skips)
        run = RunRecord(STAGE, params_digest)
        with atomic_dir(out_dir, stage=STAGE) as tmp:
            writer = LmdbWriter(tmp / ".work", commit_every=commit_every, name=str(out_dir))
            try:
                records = _records(dbs, txns, entries, rule, skips, tally)
                for key, fname, rec in track(records, desc=f"import image DB {name}", unit="img", mininterval=2.0):
                    writer.put(key, encode_value(rec, compression))
                    written[fname] = f"{name}/{key.decode('utf-8')}"
                if not written:
                    raise _NothingWritten()
                mdb = writer.finish(tmp)
            except BaseException:
                writer.abort()
                raise
            build = {"compression": compression, "commit_every": commit_every}
            atomic_write_json(tmp / META_FILE, _image_meta(name, dbs, rule, tally, class_names, build))
            atomic_write_json(tmp / NBB_FILE, tally.nbb, indent=None)
            run.counts.update(tally.counts(), **skips.as_dict(), db_bytes=mdb.stat().st_size)
            run.extra["data_mdb_sha256"] = file_digest(mdb)
            run.write(tmp)
    except _NothingWritten:
        return {"written": False, "why": "no entry could be converted", "images": 0, **skips.as_dict()}, {}
    finally:
        for env in envs:
            env.close()
    log.info("image DB %s: %d images imported, %d skipped", name, len(written), sum(skips.counts.values()))
    report = {"written": True, "release_dbs": [str(db.lmdb_path) for db in dbs], **tally.counts(), **skips.as_dict()}
    return report, written


class _NothingWritten(Exception):
    """No entry of a DB converted: its directory is left as it was (atomic_dir discards the temp)."""
