"""Manifest and rejects parquet files: fixed column schemas (docs/design.md §6), streamed writes.

A manifest is written in row groups of ``chunk_rows`` rows as rows arrive, so ingest memory does
not grow with the input; the file appears at its final path only when complete (temporary file
in the same directory, then an atomic rename), so a killed stage never leaves half a manifest.
Same rows in the same order => byte-identical file (no timestamps in parquet metadata).
"""

from __future__ import annotations

import contextlib
import operator
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.common.failures import names_file_when_full
from pipeline.common.runinfo import chmod_as_open

CORE_FIELDS: tuple[pa.Field, ...] = (
    pa.field("example_id", pa.string(), nullable=False),
    pa.field("dataset", pa.string(), nullable=False),
    pa.field("split", pa.string(), nullable=False),
    pa.field("image_source", pa.string(), nullable=False),
    pa.field("image_id", pa.string(), nullable=False),
    pa.field("image_path", pa.string(), nullable=False),
    pa.field("url", pa.string(), nullable=True),
    pa.field("text", pa.string(), nullable=False),
)

REJECT_SCHEMA = pa.schema([
    pa.field("dataset", pa.string(), nullable=False),
    pa.field("source_file", pa.string(), nullable=False),
    pa.field("locator", pa.string(), nullable=False),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("detail", pa.string(), nullable=False),
    pa.field("raw_row", pa.string(), nullable=False),
])

COMPRESSION = "zstd"
BATCH_ROWS = 8192  # rows held as Python objects before they become an Arrow record batch


def manifest_schema(extra: Sequence[pa.Field]) -> pa.Schema:
    """The core columns in contract order followed by a dataset's own columns."""
    names = [f.name for f in CORE_FIELDS]
    clash = [f.name for f in extra if f.name in names]
    if clash:
        raise ValueError(f"dataset columns {clash} collide with core manifest columns")
    return pa.schema(list(CORE_FIELDS) + list(extra))


class ParquetStreamWriter:
    """Append rows (mappings with every schema column), flushed as row groups, committed atomically.

    Rows are converted to Arrow record batches every :data:`BATCH_ROWS` rows (compact, no Python
    objects), and the batches are written as one row group once ``chunk_rows`` rows have gathered,
    so memory is bounded by one row group of Arrow data whatever the input size.

    Use as a context manager: a clean exit renames the temporary file onto ``path``; an exception
    deletes it and leaves whatever was at ``path`` before untouched.
    """

    def __init__(self, path: Path | str, schema: pa.Schema, *, chunk_rows: int) -> None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.path = Path(path)
        self.schema = schema
        self.chunk_rows = chunk_rows
        self.rows_written = 0
        self._getter = operator.itemgetter(*schema.names)
        self._pending: list[tuple] = []
        self._batches: list[pa.RecordBatch] = []
        self._batched_rows = 0
        self._batch_rows = min(chunk_rows, BATCH_ROWS)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        os.close(fd)
        self._tmp = Path(tmp)
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(
            self._tmp, schema, compression=COMPRESSION, write_statistics=True
        )

    def append(self, row: Mapping[str, Any]) -> None:
        self._pending.append(self._values(row))
        if len(self._pending) >= self._batch_rows:
            self._to_batch()
            if self._batched_rows >= self.chunk_rows:
                self.flush()

    def _to_batch(self) -> None:
        """Pending Python rows -> one Arrow record batch (checked against the schema)."""
        if not self._pending:
            return
        self._add_batch(self._record_batch(self._pending))
        self._pending.clear()

    def _record_batch(self, rows: Sequence[tuple]) -> pa.RecordBatch:
        """Rows (tuples in schema order) -> a record batch; ValueError naming the column that cannot hold them."""
        arrays = []
        for fld, values in zip(self.schema, zip(*rows)):
            try:
                arrays.append(pa.array(values, type=fld.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, UnicodeError, TypeError, ValueError) as err:
                raise ValueError(f"{self.path.name}: column {fld.name!r} cannot hold its values "
                                 f"({type(err).__name__}: {str(err)[:200]})") from None
            if not fld.nullable and arrays[-1].null_count:
                raise ValueError(f"{self.path.name}: column {fld.name!r} must not be null")
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _add_batch(self, batch: pa.RecordBatch) -> None:
        self._batches.append(batch)
        self._batched_rows += batch.num_rows

    def append_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, str]]:
        """Append ``rows`` (after anything pending); a row the schema cannot hold (a lone surrogate
        in a string, an integer beyond int64, a float beyond float32) is left out. Returns those
        rows as (index in ``rows``, why), so the caller rejects them one by one."""
        self._to_batch()
        tuples = [self._values(row) for row in rows]
        left_out: list[tuple[int, str]] = []
        try:
            batch = self._record_batch(tuples) if tuples else None
        except ValueError:  # find the rows at fault; the others go in, in order
            fitting = []
            for i, values in enumerate(tuples):
                try:
                    self._record_batch([values])
                    fitting.append(values)
                except ValueError as err:
                    left_out.append((i, str(err)))
            batch = self._record_batch(fitting) if fitting else None
        if batch is not None:
            self._add_batch(batch)
            if self._batched_rows >= self.chunk_rows:
                self.flush()
        return left_out

    def _values(self, row: Mapping[str, Any]) -> tuple:
        try:
            values = self._getter(row)
        except KeyError as err:
            raise KeyError(f"{self.path.name}: row lacks column {err}") from None
        return values if len(self.schema) > 1 else (values,)

    def flush(self) -> None:
        """Write everything appended so far as one row group."""
        self._to_batch()
        if not self._batches or self._writer is None:
            return
        table = pa.Table.from_batches(self._batches, schema=self.schema)
        with names_file_when_full(self.path):
            self._writer.write_table(table, row_group_size=max(len(table), 1))
        self.rows_written += len(table)
        self._batches.clear()
        self._batched_rows = 0

    def commit(self) -> int:
        """Write what is pending, close, and move the file to ``path``; returns the row count."""
        rows = self.close()
        self.publish()
        return rows

    def close(self) -> int:
        """Write what is pending and close the temporary file (every byte is on disk, nothing is at
        ``path`` yet: :meth:`publish` moves it there); returns the row count."""
        self.flush()
        assert self._writer is not None, "writer already closed"
        with names_file_when_full(self.path):
            self._writer.close()
        self._writer = None
        chmod_as_open(self._tmp)
        return self.rows_written

    def publish(self) -> None:
        """Move the closed temporary file onto ``path`` (a rename: needs no space)."""
        assert self._writer is None, "close() first"
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()

    def __enter__(self) -> ParquetStreamWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()
