"""One pretraining manifest decontaminated in Arrow record batches: no step holds the whole manifest.

The same result as :func:`pipeline.decontam.decontaminate.decontaminate_dataset` (the same clean
parquet bytes, the same report), for manifests of any length (CC12M- or LAION-sized):

1. **One read of the manifest**, ``batch_rows`` rows at a time: each batch's identity keys are
   looked up in the eval index (and, with a finder, its images' pHashes compared), the matches of
   every image are kept (a few per thousand images); the batch, sorted by ``example_id``, is
   written to a temporary run file, and its distinct image keys, sorted, to a key run. Without a
   finder, ``workers`` threads take batches while the next one is read (Arrow's kernels, the
   parquet reader and the run writer release the GIL); matches are merged in batch order.
2. **A merge of the runs** by ``example_id`` (:func:`merge_runs`: each round takes from every run
   the rows up to the smallest of their buffered last ids, so a round holds at most one buffer per
   run): rows of a matched image are dropped (and collected for the report), the others get their
   pretraining split and are written in row groups of :data:`ROW_GROUP` rows, as ``write_parquet``
   writes them, by a second thread while the next round is merged. The key runs are merged the
   same way, on a third thread, to count the distinct images exactly.

Memory is bounded by ``batch_rows`` (times the batches in flight) and :data:`MERGE_BUDGET`, not by
the manifest's length; what grows is what the report lists (one entry per removed image).

The temporary files lie in ``tmp_dir`` (on the same disk as the output: ~1.5x the manifest's parquet size).
"""

from __future__ import annotations

from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.decontam.arrow_sort import sort_indices
from pipeline.decontam.eval_set import IMAGE_COLUMNS, KEY_SEP, EvalIndex, image_key_array, string_columns
from pipeline.decontam.splits import pretrain_split
from pipeline.decontam.matching import ImageMatch, NearDuplicateFinder, find_key_matches, image_paths

BATCH_ROWS = 1 << 19  # rows read, matched and sorted at once (per worker thread): the memory bound
ROW_GROUP = 1 << 20  # the clean parquet's row groups (decontaminate.write_parquet's)
MERGE_BUDGET = 1 << 19  # rows the merge buffers over all runs (each run file is written in batches of its share)
# zstd level 1: 0.39x the raw bytes (lz4: 0.70x) for ~0.1 CPU-s more per 1M rows each way: at web scale
# the runs outgrow the page cache, and a ~200 MB/s disk writes lz4's bytes slower than the rows are
# computed (docs/decisions.md#decontam-streamed)
_RUN_OPTIONS = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=1))


@dataclass
class StreamedResult:
    """What :func:`decontaminate_file` found: the inputs of ``decontaminate_dataset``'s report."""

    matches: dict[str, ImageMatch]
    input_rows: int
    input_images: int
    kept_rows: int
    removed_rows: int
    removed_rows_table: pa.Table  # image_id, url, image_path of every removed row
    removed_keys: pa.Array  # their image keys (without the prefix)
    prefix: str


def open_parquet(path: Path) -> pq.ParquetFile:
    """A parquet file to read a batch at a time in bounded memory. Without ``pre_buffer=False``
    (pyarrow's default is True) the reader's range cache keeps every row group's compressed bytes
    until the file is closed: memory grew by the manifest's size on disk (~80 bytes a CC row)."""
    return pq.ParquetFile(path, pre_buffer=False)


def _prefix(pf: pq.ParquetFile) -> str:
    """``source + KEY_SEP`` when the manifest has one image source (keys are then ``image_id``), else ``""``."""
    sources: set = set()
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=["image_source"]):
        sources.update(pc.unique(batch.column(0)).to_pylist())
        if len(sources) > 1:
            return ""
    source = next(iter(sources), None)
    return "" if source is None else str(source) + KEY_SEP


def _row_keys(rows: pa.Table, prefix: str) -> pa.Array:
    return rows.column("image_id").combine_chunks().cast(pa.string()) if prefix else image_key_array(rows)


def _write_run(table: pa.Table, path: Path, chunk_rows: int) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema, options=_RUN_OPTIONS) as writer:
        writer.write_table(table, max_chunksize=chunk_rows)


class _Run:
    """A sorted run file read one record batch at a time; ``buffer`` holds what is not yet taken.

    The buffer is topped up to at least one whole batch (``low`` rows) after every take: with only
    what is left of one batch, each round's bound moved by a single run's batch and a round
    yielded ~1/k of the buffered rows, so k runs cost ~k times the rounds (quadratic in k)."""

    def __init__(self, path: Path, column: str) -> None:
        self._file = pa.OSFile(str(path), "rb")
        self._reader = pa.ipc.open_file(self._file)
        self._next, self.column = 0, column
        self.buffer: pa.Table | None = None
        self._low = self._reader.get_batch(0).num_rows if self._reader.num_record_batches else 0
        self._refill()

    def _refill(self) -> None:
        while ((self.buffer is None or self.buffer.num_rows < self._low)
               and self._next < self._reader.num_record_batches):
            batch = pa.Table.from_batches([self._reader.get_batch(self._next)])
            keep = self.buffer is not None and self.buffer.num_rows
            self.buffer = pa.concat_tables([self.buffer, batch]) if keep else batch
            self._next += 1
        if self.buffer is not None and self.buffer.num_rows == 0:
            self.buffer = None
        if self.buffer is None:
            self._file.close()

    def last(self) -> str:
        return self.buffer.column(self.column)[-1].as_py()

    def take_upto(self, bound: str) -> pa.Table:
        """The buffered rows whose id is <= ``bound`` (a prefix of the buffer, which is sorted)."""
        n = int(pc.sum(pc.less_equal(self.buffer.column(self.column), bound)).as_py() or 0)
        head, self.buffer = self.buffer.slice(0, n), self.buffer.slice(n)
        self._refill()
        return head


def merge_runs(paths: list[Path], column: str) -> Iterator[pa.Table]:
    """The rows of the sorted run files ``paths`` in ascending ``column`` order (no nulls), as tables.

    Every round takes, from each run, the buffered rows up to the smallest buffered last id of all
    runs, so no row still on disk can sort before what the round yields; the round's rows are
    sorted (they arrive as a few sorted pieces) and yielded.
    """
    runs = [run for run in (_Run(p, column) for p in paths) if run.buffer is not None]
    while runs:
        bound = min(run.last() for run in runs)
        pieces = [run.take_upto(bound) for run in runs]
        runs = [run for run in runs if run.buffer is not None]
        pieces = [p for p in pieces if p.num_rows]
        merged = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        if len(pieces) > 1:
            merged = merged.take(pa.array(sort_indices(merged.column(column))))
        yield merged


def _differs_from_previous(sorted_values: pa.Array) -> pa.Array:
    """For each value of ``sorted_values`` (at least one) after the first: whether it differs from the
    one before it. Equal values of a sorted array are neighbours, so each True starts a new value."""
    return pc.not_equal(sorted_values.slice(1), sorted_values.slice(0, len(sorted_values) - 1))


def sorted_distinct(values: pa.Array) -> pa.Array:
    """The distinct strings of ``values`` (no nulls), ascending: a sort of 64-bit prefix keys and a
    compare of neighbours, several times cheaper than hashing every string (``pc.unique``)."""
    values = values.take(pa.array(sort_indices(values))) if len(values) > 1 else values
    if len(values) < 2:
        return values
    return values.filter(pa.concat_arrays([pa.array([True]), _differs_from_previous(values)]))


def _merge_matches(matches: dict[str, ImageMatch], found: dict[str, ImageMatch], near: dict[str, set[str]]) -> None:
    for key, match in found.items():
        into = matches.setdefault(key, ImageMatch())
        into.reasons |= match.reasons
        into.refs |= match.refs
    for key, refs in near.items():
        into = matches.setdefault(key, ImageMatch())
        into.reasons.add("near_duplicate")
        into.refs.update(refs)


def _spill(i: int, table: pa.Table, rows: pa.Table, prefix: str, index: EvalIndex, tmp_dir: Path,
           chunk_rows: int) -> tuple[dict[str, ImageMatch], Path, Path]:
    """One batch: (its key matches, its run file sorted by example_id, its sorted distinct image keys' file)."""
    keys = _row_keys(rows, prefix)
    found = find_key_matches(rows, index, workers=1, row_keys=(keys, prefix))
    run, key_run = tmp_dir / f"run{i:05d}.arrow", tmp_dir / f"keys{i:05d}.arrow"
    _write_run(table.take(pa.array(sort_indices(table.column("example_id")))), run, chunk_rows)
    _write_run(pa.table({"key": sorted_distinct(keys.drop_null())}), key_run, chunk_rows)
    return found, run, key_run


class _Done:
    """A finished result with a future's ``result()``."""

    def __init__(self, value) -> None:
        self.value = value

    def result(self):
        return self.value


def _match_batches(pf: pq.ParquetFile, prefix: str, index: EvalIndex, finder: NearDuplicateFinder | None,
                   workers: int, tmp_dir: Path, batch_rows: int,
                   desc: str) -> tuple[dict[str, ImageMatch], list, list, int]:
    """Pass 1: (matches, run files, key run files, rows read).

    With a finder the batches run one after the other: pHash forks worker processes, which must
    not happen while another thread runs (and hashing images, not this, is then what takes the time).
    """
    matches: dict[str, ImageMatch] = {}
    runs, key_runs, rows_in = [], [], 0
    # a run buffers up to two of its batches while merged: each is half its share of MERGE_BUDGET
    chunk_rows = max(1024, MERGE_BUDGET // (2 * max(1, -(-pf.metadata.num_rows // batch_rows))))
    threads = 1 if finder is not None else max(1, workers)
    pending: deque = deque()  # (future, near matches) in batch order: matches merge in that order

    def collect() -> None:
        future, near = pending.popleft()
        found, run, key_run = future.result()
        _merge_matches(matches, found, near)
        runs.append(run)
        key_runs.append(key_run)

    pool = ThreadPoolExecutor(threads) if threads > 1 else None  # no thread at all beside pHash's forks
    try:
        for i, batch in enumerate(pf.iter_batches(batch_size=batch_rows, use_threads=threads == 1)):
            table = pa.Table.from_batches([batch])
            rows_in += table.num_rows
            rows = string_columns(table, IMAGE_COLUMNS)
            near = finder.find(*image_paths(rows), desc=f"{desc} batch {i}") if finder is not None else {}
            args = (i, table, rows, prefix, index, tmp_dir, chunk_rows)
            pending.append((pool.submit(_spill, *args) if pool else _Done(_spill(*args)), near))
            del table, rows, batch, args
            while len(pending) >= threads:  # at most `threads` batches held besides the one being read
                collect()
        while pending:
            collect()
    finally:
        if pool is not None:
            pool.shutdown()
    return matches, runs, key_runs, rows_in


def count_distinct_runs(paths: list[Path]) -> int:
    """Distinct keys over key runs (each sorted and distinct): a round's keys appear in no other round,
    and within a round (sorted) equal keys are neighbours."""
    distinct = 0
    for table in merge_runs(paths, "key"):
        keys = table.column("key").combine_chunks()
        distinct += 1 + int(pc.sum(_differs_from_previous(keys)).as_py() or 0)
    return distinct


class _GroupWriter:
    """Parquet written in row groups of :data:`ROW_GROUP` rows (the bytes ``write_parquet`` gives)."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path, self.schema = path, schema
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.Table] = []
        self._rows = 0

    def _flush(self, n: int) -> None:
        table = pa.concat_tables(self._pending)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, self.schema, compression="zstd")
        # one chunk per column, as write_parquet's table has: the writer's page and dictionary
        # boundaries follow the input's chunks, so pieces would give other bytes for the same rows
        self._writer.write_table(table.slice(0, n).combine_chunks(), row_group_size=ROW_GROUP)
        rest = table.slice(n)
        self._pending, self._rows = ([rest] if rest.num_rows else []), rest.num_rows

    def write(self, table: pa.Table) -> None:
        self._pending.append(table)
        self._rows += table.num_rows
        while self._rows >= ROW_GROUP:
            self._flush(ROW_GROUP)

    def close(self) -> None:
        if self._rows or self._writer is None:  # an empty manifest: write_table writes its schema alone
            pending = self._pending or [self.schema.empty_table()]
            self._pending = pending
            self._flush(self._rows)
        self._writer.close()


def decontaminate_file(dataset: str, manifest: Path, index: EvalIndex, out_path: Path, tmp_dir: Path, *,
                       finder: NearDuplicateFinder | None, val_coco_ids: set[str] | None = None, workers: int = 1,
                       batch_rows: int | None = None) -> StreamedResult:
    """Write the clean manifest of ``manifest`` to ``out_path``; returns what the report needs.

    ``tmp_dir`` (existing, emptied by the caller) receives the run files; ``batch_rows`` (default
    :data:`BATCH_ROWS`) bounds the rows held at once.
    """
    batch_rows = batch_rows or BATCH_ROWS

    pf = open_parquet(manifest)
    prefix = _prefix(pf)
    matches, runs, key_runs, rows_in = _match_batches(pf, prefix, index, finder, workers, tmp_dir, batch_rows,
                                                      f"phash {dataset}")
    removed_keys = pa.array(sorted(k[len(prefix):] for k in matches), pa.string())
    schema = pf.schema_arrow
    split_at = schema.get_field_index("split")
    writer = _GroupWriter(out_path, schema)
    removed_parts, removed_key_parts, kept = [], [], 0
    # two threads beside this one: the key runs' count, and the parquet writer (one write at a time)
    with ThreadPoolExecutor(2) as pool:
        input_images = pool.submit(count_distinct_runs, key_runs)
        written = None
        for table in merge_runs(runs, "example_id"):
            keys = _row_keys(string_columns(table, ("image_source", "image_id")), prefix)
            removed = pc.fill_null(pc.is_in(keys, value_set=removed_keys), False)
            if pc.any(removed).as_py():
                removed_parts.append(string_columns(table.filter(removed), ("image_id", "url", "image_path")))
                removed_key_parts.append(keys.filter(removed))
                table = table.filter(pc.invert(removed))
            table = table.set_column(split_at, schema.field(split_at),
                                     pretrain_split(table, dataset, val_coco_ids=val_coco_ids))
            kept += table.num_rows
            if written is not None:
                written.result()
            written = pool.submit(writer.write, table)
            del table
        if written is not None:
            written.result()
        writer.close()
        input_images = input_images.result()
    removed_rows = (pa.concat_tables(removed_parts) if removed_parts
                    else pa.table({c: pa.array([], pa.string()) for c in ("image_id", "url", "image_path")}))
    removed_key_array = pa.concat_arrays(removed_key_parts) if removed_key_parts else pa.array([], pa.string())
    return StreamedResult(matches, rows_in, input_images, kept, removed_rows.num_rows,
                          removed_rows, removed_key_array, prefix)


def count_rejects(path: Path) -> Counter:
    """``reason`` -> rows of an ingest rejects file, read a batch at a time."""
    counts: Counter = Counter()
    pf = open_parquet(path)
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=["reason"]):
        counts.update(dict(zip(*(c.to_pylist() for c in pc.value_counts(batch.column(0)).flatten()))))
    return counts


