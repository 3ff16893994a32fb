"""One writer per stage output: an OS file lock per stage (and item) under the data directory.

DVC's own lock covers ``dvc repro`` only. An Airflow retry, a manual ``python -m pipeline`` and a
second terminal are separate processes writing the same outputs; two of them at once lose work
(one run's stale-temp cleanup deletes the other's half-built directory). ``python -m pipeline``
therefore takes the lock of its stage before the stage runs and holds it until the stage returns
(:func:`pipeline.__main__.main`), so every caller of the CLI is covered in one place.

Where: ``<paths.data>/cache/locks/<key>.lock``. Under the data directory, so Airflow runs (each with
its own ``runs/<name>/data``) never block each other; under ``cache/``, which no stage writes as an
output (DVC does not track it and the Airflow ``outputs.json`` record skips it), because the files
hold the current holder (pid, host, stage, start time: informational only, for the waiting message).
The files are never deleted: removing a lock file while someone holds it would let a third process
lock a fresh file of the same name.

How: ``fcntl.flock``. The kernel releases it when the holder's last descriptor closes, so a run
killed with SIGKILL (or a crashed machine's process) never leaves a stale lock. Caveat: a process
forked by the holder (not exec'd) shares the descriptor and keeps the lock while it lives.

Keys (:func:`stage_keys`):

- a stage without ITEM: its name (``build_dbs``, ``decontaminate``; ``import_uniter_db`` takes
  ``build_dbs``, whose outputs it writes);
- a stage with ITEM, run for one item: ``<stage>@<item>`` exclusive (``extract@coco``) plus
  ``<stage>`` *shared*; run for all items (no ITEM): ``<stage>`` exclusive. So Airflow's mapped
  ``extract@coco`` / ``extract@vg`` tasks run side by side, and ``extract`` (all sources) excludes
  any single-source run, as both write the same outputs;
- the pretraining stages: ``pretrain@<output name>``, the directory they write under
  ``data/{models,metrics,checkpoints}`` (``pretrain.out_name``, ``<out_name>_masking_ablation``,
  ``<out_name>_vcr``); different ``out_name`` values write different outputs and run side by side.

Ranks started by the ``deepspeed`` / torchrun launcher (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
and MASTER_PORT all set) take no lock: the process that launched them holds it, and they would wait
for it forever.

Waiting: by default a second writer waits, logging ``waiting for <key>: held by pid P on HOST since
T (stage S)`` once and every 30 s after, so retries and second terminals serialise. The environment
variable ``UNITER_LOCK_WAIT`` changes that: ``0`` fails at once, ``N`` (seconds) waits at most N;
the CLI then exits with status :data:`BUSY_EXIT` (3) and a message naming the holder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from pipeline.params.pretrain import PRETRAIN_OUTPUTS, output_name

log = logging.getLogger(__name__)

LOCK_DIR = Path("cache") / "locks"
WAIT_ENV = "UNITER_LOCK_WAIT"
BUSY_EXIT = 3
LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # = training.launch.LAUNCH_ENV


class LockBusy(RuntimeError):
    """The lock was held by another writer and this one would not (or no longer) wait."""

    def __init__(self, key: str, path: Path, holder: Mapping[str, Any] | None, waited_s: float) -> None:
        self.key, self.path, self.holder = key, path, holder
        waited = f" after waiting {waited_s:.1f}s" if waited_s >= 0.05 else ""
        setting = os.environ.get(WAIT_ENV)
        hint = f", or unset {WAIT_ENV} (now {setting!r}) to queue behind it" if setting else ""
        super().__init__(f"{key} is being written by another run{waited}: {path} is held by {describe(holder)}. "
                         f"Run again when it has finished (the lock goes when it ends, even if killed){hint}")


def sanitize(key: str) -> str:
    """A file-name-safe form of ``key``: characters outside ``[A-Za-z0-9._@+=-]`` become ``_``,
    leading dots are dropped (no hidden or ``..`` names), at most 200 characters."""
    safe = re.sub(r"[^A-Za-z0-9._@+=-]", "_", key).lstrip(".")[:200]
    return safe or "_"


def lock_path(data_dir: Path | str, key: str) -> Path:
    """``<data_dir>/cache/locks/<sanitized key>.lock``."""
    return Path(data_dir) / LOCK_DIR / f"{sanitize(key)}.lock"


# stages that write another stage's outputs take its lock: import_uniter_db writes build_dbs's DBs
SAME_OUTPUTS = {"import_uniter_db": "build_dbs"}


def stage_keys(stage: str, item: str | None = None, out_name: str | None = None) -> list[tuple[str, bool]]:
    """The ``(key, shared)`` locks one run of ``stage`` [``item``] takes, in acquisition order
    (always stage before item, so no two runs can wait on each other in a cycle)."""
    stage = SAME_OUTPUTS.get(stage, stage)
    if stage in PRETRAIN_OUTPUTS:
        if not out_name:
            raise ValueError(f"{stage}: the lock key needs pretrain.out_name, got {out_name!r}")
        return [(f"pretrain@{output_name(stage, out_name)}", False)]
    if item is None:
        return [(stage, False)]
    items = sorted({item, *also_written(stage, item)})  # sorted: one acquisition order for every run
    return [(stage, True), *((f"{stage}@{i}", False) for i in items)]


def also_written(stage: str, item: str) -> tuple[str, ...]:
    """Other items whose outputs a run of ``stage`` ``item`` writes too: ``extract coco`` writes
    ``features/coco_gt`` (and ``vcr`` ``vcr_gt``), so it holds their locks as well."""
    if stage == "extract":
        from pipeline.params.extract import GIVEN_BOX_SETS

        if item in GIVEN_BOX_SETS:
            return (GIVEN_BOX_SETS[item],)
    return ()


def wait_from_env(env: Mapping[str, str] | None = None) -> bool | float:
    """``UNITER_LOCK_WAIT`` as ``stage_lock``'s ``wait``: unset/empty -> True (forever), ``0`` ->
    False, a positive number -> that many seconds. Raises ValueError naming the variable otherwise."""
    raw = (os.environ if env is None else env).get(WAIT_ENV, "").strip()
    if not raw:
        return True
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if seconds < 0 or seconds != seconds:
        raise ValueError(f"{WAIT_ENV}={raw!r}: expected 0 (fail at once) or a number of seconds to wait")
    return seconds if seconds > 0 else False


def in_launched_worker(env: Mapping[str, str] | None = None) -> bool:
    """True inside a rank started by the deepspeed/torchrun launcher (whose parent holds the lock)."""
    env = os.environ if env is None else env
    return all(k in env for k in LAUNCHER_ENV)


def read_holder(path: Path) -> dict[str, Any] | None:
    """What the current holder wrote into the lock file, or None when unreadable or empty."""
    try:
        first = path.read_text(encoding="utf-8", errors="replace").partition("\n")[0]
        holder = json.loads(first)
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def describe(holder: Mapping[str, Any] | None) -> str:
    """``pid P on HOST since T (stage S)``, or a plain phrase when the holder wrote nothing yet."""
    if not holder:
        return "another process (holder not recorded yet)"
    return (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('since', '?')} "
            f"(stage {holder.get('stage', '?')})")


def _try_lock(fd: int, shared: bool) -> bool:
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        return True
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


def _record_holder(fd: int, stage: str | None) -> None:
    """One JSON line at offset 0 (a reader takes the first line, so a shorter rewrite by a shared
    co-holder leaves it valid)."""
    info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "stage": stage}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info, sort_keys=True) + "\n").encode(), 0)


def _acquire(fd: int, path: Path, key: str, *, shared: bool, wait: bool | float, log_every: float,
             poll: float) -> None:
    """Take the lock on ``fd``, polling while another writer holds it; raise LockBusy when ``wait``
    runs out. Polling (not a blocking flock) lets the waiter log who it waits for."""
    start = time.monotonic()
    deadline = None if wait is True else start + (0.0 if wait is False else float(wait))
    last_log = None
    while not _try_lock(fd, shared):
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise LockBusy(key, path, read_holder(path), now - start)
        if last_log is None or now - last_log >= log_every:
            what = f"still waiting for {key} ({now - start:.0f}s)" if last_log is not None else f"waiting for {key}"
            log.warning("%s: held by %s (lock %s)", what, describe(read_holder(path)), path)
            last_log = now
        time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - now)))
    if last_log is not None:
        log.info("got %s after waiting %.1fs", key, time.monotonic() - start)


@contextlib.contextmanager
def stage_lock(data_dir: Path | str, key: str, *, wait: bool | float = True, shared: bool = False,
               stage: str | None = None, log_every: float = 30.0, poll: float = 0.2) -> Iterator[Path]:
    """Hold the lock ``key`` under ``data_dir`` for the ``with`` block; yields the lock file's path.

    ``wait``: True waits as long as it takes, False fails at once, a number of seconds waits that
    long; failing raises :class:`LockBusy` naming the holder. ``shared`` takes a shared lock
    (several shared holders at once, no exclusive one). ``stage`` is recorded for the waiting
    message. The lock is released when the block exits, or by the OS when the process dies.
    """
    path = lock_path(data_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        _acquire(fd, path, key, shared=shared, wait=wait, log_every=log_every, poll=poll)
        _record_holder(fd, stage)
        try:
            yield path
        finally:
            if not shared:  # a shared co-holder may still be running: leave its record
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing the descriptor releases the lock


@contextlib.contextmanager
def stage_locks(data_dir: Path | str, stage: str, item: str | None = None, *, out_name: str | None = None,
                wait: bool | float = True) -> Iterator[list[Path]]:
    """Every lock of :func:`stage_keys` for one run of ``stage`` [``item``], held together; yields
    their paths. Launched worker ranks take none (their launcher holds them): yields []."""
    if in_launched_worker():
        yield []
        return
    where = f"{stage}@{item}" if item else stage
    with contextlib.ExitStack() as stack:
        paths = [stack.enter_context(stage_lock(data_dir, key, wait=wait, shared=shared, stage=where))
                 for key, shared in stage_keys(stage, item, out_name)]
        yield paths
