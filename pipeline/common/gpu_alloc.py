"""Disjoint GPUs for concurrent tasks on one host: a file lock per device index.

Airflow's ``gpu`` pool only counts: with several slots, every stage would pick ``cuda:0`` (or
``0..workers-1``). A GPU task therefore asks :func:`allocate` for the number of devices it uses;
it gets free indices, hands them to its stage as ``CUDA_VISIBLE_DEVICES`` (the stage then sees
exactly those, numbered from 0) and gives them back when it ends.

How: ``<lock_dir>/gpu<i>.lock``, held with ``fcntl.flock``. The kernel drops a flock when the last
descriptor of it closes, so a task killed with SIGKILL (or a worker whose process group dies) frees
its devices without any clean-up. The descriptors are passed on to the stage's child process
(:attr:`Allocation.fds`), so the devices stay taken while either the task or its stage lives.
Devices are taken all at once or not at all (no task holds some while it waits for more: two tasks
each waiting for the other's device would wait forever).

Where: ``$UNITER_GPU_LOCK_DIR``, else ``$AIRFLOW_HOME/gpu_locks``. It must be local to the host
whose GPUs it guards (each Celery host has its own; processes on one host share it).
How many devices: ``$UNITER_GPU_COUNT`` (a fake count for tests on a CPU machine), else the
entries of ``$CUDA_VISIBLE_DEVICES``, else the ``/dev/nvidia<N>`` device files. With none, tasks
run unchanged (CPU).

Every acquisition and release is appended to ``<lock_dir>/allocations.jsonl`` (host, pid, label,
devices, time): what ran where, and the evidence that no two tasks shared a device.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

log = logging.getLogger(__name__)

COUNT_ENV = "UNITER_GPU_COUNT"
LOCK_DIR_ENV = "UNITER_GPU_LOCK_DIR"
WORKER_ENV = "UNITER_WORKER_NAME"
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
RECORD_FILE = "allocations.jsonl"


def worker_host() -> str:
    """This worker's name: ``$UNITER_WORKER_NAME`` (several workers on one machine), else the FQDN.
    Also Airflow's ``core.hostname_callable`` for the Celery workers of ``make airflow
    AIRFLOW_STACK=celery``, so task instances record which worker ran them."""
    return os.environ.get(WORKER_ENV) or socket.getfqdn()


def device_count(env: Mapping[str, str] = os.environ, dev: Path = Path("/dev")) -> int:
    """The GPUs this host offers to tasks (see the module doc for the order of sources)."""
    if env.get(COUNT_ENV, "").strip():
        count = int(env[COUNT_ENV])
        if count < 0:
            raise ValueError(f"{COUNT_ENV}={env[COUNT_ENV]}: expected a device count >= 0")
        return count
    if VISIBLE_ENV in env:
        return len([d for d in env[VISIBLE_ENV].split(",") if d.strip()])
    return len([p for p in dev.glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name)])


def lock_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where the device locks live: ``$UNITER_GPU_LOCK_DIR`` or ``$AIRFLOW_HOME/gpu_locks``."""
    if env.get(LOCK_DIR_ENV):
        return Path(env[LOCK_DIR_ENV])
    return Path(env.get("AIRFLOW_HOME") or Path.home() / "airflow") / "gpu_locks"


@dataclass(frozen=True)
class Allocation:
    """Devices held by this process: host indices (``devices``) and the lock descriptors (``fds``)."""

    devices: tuple[int, ...]
    fds: tuple[int, ...]

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` with ``CUDA_VISIBLE_DEVICES`` set to the devices (unchanged when none: CPU)."""
        out = dict(base)
        if self.devices:
            out[VISIBLE_ENV] = ",".join(str(d) for d in self.devices)
        return out


def _record(directory: Path, event: str, label: str, devices: tuple[int, ...]) -> None:
    line = json.dumps({"event": event, "host": worker_host(), "pid": os.getpid(), "label": label,
                       "devices": list(devices), "t": time.time()}) + "\n"
    fd = os.open(directory / RECORD_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one O_APPEND write: lines of concurrent tasks never interleave
    finally:
        os.close(fd)


def _try_take(directory: Path, n: int, count: int, label: str) -> dict[int, int]:
    """Lock ``n`` free devices, or none: returns {index: fd}, empty when fewer than ``n`` are free."""
    held: dict[int, int] = {}
    for index in range(count):
        fd = os.open(directory / f"gpu{index}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{label} pid {os.getpid()} on {worker_host()}\n".encode())  # for the waiting message
        held[index] = fd
        if len(held) == n:
            return held
    for fd in held.values():
        os.close(fd)
    return {}


@contextlib.contextmanager
def allocate(n: int, *, label: str, directory: Path | None = None, count: int | None = None,
             wait_s: float | None = None, poll_s: float = 1.0,
             emit: Callable[[str], None] = log.info) -> Iterator[Allocation]:
    """Hold ``n`` devices of this host for the ``with`` block (fewer if the host has fewer: a stage
    caps its own use at what it sees). Waits for them, at most ``wait_s`` seconds (None: forever),
    then raises TimeoutError. On a host without GPUs yields an empty allocation."""
    if n < 1:
        raise ValueError(f"allocate({n}) for {label}: expected at least one device")
    count = device_count() if count is None else count
    if count == 0:
        yield Allocation(devices=(), fds=())
        return
    directory = lock_dir() if directory is None else directory
    directory.mkdir(parents=True, exist_ok=True)
    want = min(n, count)
    if want < n:
        emit(f"{label}: wants {n} GPUs, this host has {count}; taking {count}")
    start, last_note = time.monotonic(), None
    while not (held := _try_take(directory, want, count, label)):
        waited = time.monotonic() - start
        if wait_s is not None and waited >= wait_s:
            raise TimeoutError(f"{label}: {want} of {count} GPUs not free within {wait_s:.0f} s (locks in {directory})")
        if last_note is None or waited - last_note >= 30:
            emit(f"{label}: waiting for {want} free GPUs of {count} (locks in {directory})")
            last_note = waited
        time.sleep(poll_s)
    devices = tuple(sorted(held))
    _record(directory, "acquire", label, devices)
    emit(f"{label}: GPUs {','.join(map(str, devices))} ({VISIBLE_ENV})")
    try:
        yield Allocation(devices=devices, fds=tuple(held[d] for d in devices))
    finally:
        _record(directory, "release", label, devices)
        for fd in held.values():
            os.close(fd)


@dataclass(frozen=True)
class Interval:
    """One holding of devices, from ``allocations.jsonl``; ``end`` None: never released (killed)."""

    host: str
    pid: int
    label: str
    devices: tuple[int, ...]
    start: float
    end: float | None


def read_intervals(path: Path) -> list[Interval]:
    """The holdings recorded in an ``allocations.jsonl``, paired acquire -> release per (host, pid, devices)."""
    open_: dict[tuple, dict] = {}
    out: list[Interval] = []
    for row, line in enumerate(path.read_text().splitlines(), 1):
        rec = json.loads(line)
        key = (rec["host"], rec["pid"], tuple(rec["devices"]))
        if rec["event"] == "acquire":
            open_[key] = rec
        elif key in open_:
            first = open_.pop(key)
            out.append(Interval(rec["host"], rec["pid"], rec["label"], key[2], first["t"], rec["t"]))
        else:
            raise ValueError(f"{path}:{row}: release of {key} without an acquire")
    out += [Interval(r["host"], r["pid"], r["label"], k[2], r["t"], None) for k, r in open_.items()]
    return sorted(out, key=lambda i: i.start)


def shared_devices(intervals: list[Interval], *, open_until: float = float("inf")) -> list[tuple[Interval, Interval, int]]:
    """Pairs of holdings that held one device at the same time (with the device). A holding never
    released counts until ``open_until`` (e.g. when its process was killed)."""
    clashes = []
    for i, a in enumerate(intervals):
        for b in intervals[i + 1:]:
            a_end = a.end if a.end is not None else open_until
            b_end = b.end if b.end is not None else open_until
            common = set(a.devices) & set(b.devices)
            if common and a.start < b_end and b.start < a_end:
                clashes.append((a, b, min(common)))
    return clashes
