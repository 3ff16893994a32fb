"""Ending a stage process without finalizing the interpreter.

Once a stage has written and closed its outputs, CPython's finalization still tears down every
module and object it loaded: with torch, DeepSpeed and detectron2 that took 1.3-2.0 s a process on
2 cores (docs/decisions.md#fast-exit), paid by every stage of ``dvc repro`` and by each
fine-tuning child or extraction worker, for nothing a stage needs. :func:`exit_now` runs what was registered to run at
exit (``atexit``: logging's final flush, multiprocessing's joins, ``weakref.finalize`` callbacks
such as temporary directories' removal), flushes the standard streams and ends the process with
``os._exit``. A file object left open would lose what it still buffers in Python, so every stage
writes its outputs through writers that close them (``pipeline.common.runinfo``'s atomic writes,
LMDB commits, dvclive's ``end``) before returning.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn


def exit_now(status: int) -> NoReturn:
    """Run the ``atexit`` handlers, flush stdout and stderr, and end the process with ``status``."""
    atexit._run_exitfuncs()  # noqa: SLF001  (what interpreter shutdown would run first; CPython keeps it)
    _flush_and_end(status)


def end_at_interpreter_exit() -> None:
    """For a process pool's worker, which ends through the interpreter's own shutdown once its pool
    lets it go: end it with status 0 as soon as the exit handlers start.

    By then ``multiprocessing`` has done its exit work (``Process._bootstrap`` runs it before it
    returns), and a pool worker's status is 0 whatever its jobs did (they report errors through
    their futures). Registered after the handlers of the modules already imported, it runs before
    them (``atexit`` runs last-in first-out): logging's flush is the standard streams' flush here.
    """
    atexit.register(_flush_and_end, 0)


def _flush_and_end(status: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: nothing left to flush
            pass
    os._exit(status)
