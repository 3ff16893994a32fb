"""The anticipated errors of a command and their exit status: one line, no traceback.

``python -m pipeline`` (stages and tools) passes every error through :func:`describe`. An error
of a class listed in :data:`EXIT_STATUS` (or a subclass), or a disk that filled up anywhere,
becomes ``(status, one-line message)``; the message already names the file, row or key (each
class's own message does). Anything else is a bug and keeps its traceback. docs/safety.md lists
the same table.

Classes are named by ``module.QualName`` and matched along the error's MRO, so this module imports
nothing heavy and catching costs nothing; tests/pipeline/common/test_failures.py imports each name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Iterator

BAD_INPUT = 2  # bad parameters or a bad input file: fix the input, then rerun
MACHINE_STATE = 1  # the machine's state stops the stage: a foreign directory, a full disk, a failed download
BUSY = 3  # another run holds the stage's lock (UNITER_LOCK_WAIT said not to wait longer)

EXIT_STATUS: dict[str, int] = {
    # bad parameters
    "pipeline.params.parser.ParamsError": BAD_INPUT,
    # bad input files: a damaged source, a file that would run code, weights that do not fit
    "pipeline.common.source_records.SourceFormatError": BAD_INPUT,
    "pipeline.stores.uniter_release.formats.EntryFormatError": BAD_INPUT,
    "model.weights_file.UnsafeCheckpointError": BAD_INPUT,
    "model.weights_file.WeightsMismatchError": BAD_INPUT,
    "model.weights_file.UniterFormatError": BAD_INPUT,
    "pipeline.extract.detector.checkpoint.CheckpointError": BAD_INPUT,
    "pipeline.stores.readers.DamagedStoreError": BAD_INPUT,
    "pipeline.stores.tokenization.TokenizerError": BAD_INPUT,
    # the machine's state
    "pipeline.common.ownership.ForeignDirectoryError": MACHINE_STATE,
    "pipeline.stores.lmdb_store.DiskFullError": MACHINE_STATE,
    "pipeline.ingest.errors.DownloadError": MACHINE_STATE,
    "pipeline.common.runinfo.OutputsMissingError": MACHINE_STATE,
    "pipeline.common.runinfo.InputsMissingError": MACHINE_STATE,
    # a fine-tuning start that diverged (the divergence guard): not a result
    "pipeline.finetune.guard.DivergedError": MACHINE_STATE,
    # another writer
    "pipeline.common.locking.LockBusy": BUSY,
}

_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def disk_full_cause(err: BaseException) -> OSError | None:
    """The OSError saying that a disk is full (ENOSPC / EDQUOT) in ``err`` or its causes, or None."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and (err.errno in _DISK_FULL or "No space left on device" in str(err)):
            return err
        err = err.__cause__ or err.__context__
    return None


@contextlib.contextmanager
def names_file_when_full(path: str | os.PathLike) -> Iterator[None]:
    """Inside, an OSError of a full disk that names no file (pyarrow's, a plain write's) is raised
    again as one naming ``path`` (caused by the original): the user learns which write failed."""
    try:
        yield
    except OSError as err:
        if err.filename or disk_full_cause(err) is None:
            raise
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path)) from err


def _free_space(path: str | os.PathLike | None) -> str:
    """``N bytes free on <dir>`` for the existing directory nearest ``path`` ("" when unknown)."""
    if not path:
        return ""
    p = Path(os.fsdecode(path)).absolute()
    while not p.is_dir() and p != p.parent:
        p = p.parent
    try:
        return f"; {shutil.disk_usage(p).free} bytes free on {p}"
    except OSError:
        return ""


def describe(err: BaseException, *, data_dir: str | os.PathLike | None = None) -> tuple[int, str] | None:
    """``(exit status, one-line message)`` for an anticipated error; None for anything else.

    ``data_dir``: where the stage writes (``paths.data``); a full disk's message says how much is
    free there when the error names no file.
    """
    for cls in type(err).__mro__:
        status = EXIT_STATUS.get(_class_name(cls))
        if status is not None:
            return status, _one_line(str(err))
    full = disk_full_cause(err)
    if full is not None:
        where = full.filename or data_dir
        named = f"{os.fsdecode(full.filename)}: " if full.filename else ""
        return MACHINE_STATE, _one_line(f"disk full: {named}{full.strerror or full}{_free_space(where)}; "
                                        "free some space, then rerun the stage")
    return None
