"""Run records, digests, atomic writes and completion markers shared by every stage.

Every output directory carries a ``_run.json`` (docs/design.md §13): stage, params digest, input
digests, code version, the machine, the mini world's version (docs/rig.md), counts, wall time, peak
memory. Writers go through :func:`atomic_write_bytes` (directories:
:func:`pipeline.common.ownership.atomic_dir`) so a killed stage never leaves a half-written file at
its final path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from pipeline.params.world import MINI_WORLD_VERSION

RUN_FILE = "_run.json"
DONE_SUFFIX = ".done"
# time.time() when the running stage began (set by stage_clock); None outside a stage
_stage_start: float | None = None


@contextlib.contextmanager
def stage_clock() -> Iterator[float]:
    """Mark the start of a stage: every :class:`RunRecord` written inside measures its
    ``wall_time_s`` from here, not from its own creation (most stages create their record only
    once the work is done). Yields the start time."""
    global _stage_start
    outer, _stage_start = _stage_start, time.time()
    try:
        yield _stage_start
    finally:
        _stage_start = outer


def file_digest(path: Path | str, chunk: int = 1 << 20) -> str:
    """sha256 hex of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def tree_digest(path: Path | str) -> str:
    """sha256 over (relative path, file digest) of every file below ``path``, in sorted order.

    Run records (``_run.json``, ``<name>._run.json``) are skipped: they hold wall times and would
    make digests unstable.
    """
    root = Path(path)
    if root.is_file():
        return file_digest(root)
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file() and not is_run_record(q)):
        h.update(str(p.relative_to(root)).encode())
        h.update(b"\0")
        h.update(file_digest(p).encode())
    return h.hexdigest()


def is_run_record(path: Path) -> bool:
    """True for ``_run.json``-style records (wall times inside), which digests must ignore."""
    return path.name.startswith("_run") or path.name.endswith("._run.json")


def code_version() -> str:
    """The git commit of the working tree (``+dirty`` when it has changes), or ``unknown``."""
    try:
        root = Path(__file__).resolve().parent.parent
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict[str, Any]:
    """What computed the numbers: CPU model, identity and count, and, when the stage loaded torch,
    its CPU kernel level and the GPU. Results repeat to the byte on one machine; two machines with
    the same CPU model name have given different pretrained models
    (docs/decisions.md#cpu-dependent-digits), so ``cpu_id`` and ``cpu_flags`` say more than ``cpu``
    whether two runs compare."""
    cpu = _cpu_fields()
    info: dict[str, Any] = {"cpu": cpu.get("model name") or platform.processor() or platform.machine(),
                            "cpus": os.cpu_count(), "platform": platform.platform(), **_cpu_identity(cpu)}
    torch = sys.modules.get("torch")  # never imported for this: light stages stay light
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        with contextlib.suppress(Exception):
            info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            info["gpu"] = torch.cuda.get_device_name(torch.cuda.current_device())
    return info


def peak_rss_mb() -> dict[str, float]:
    """Peak resident memory in MB (2**20 bytes), from ``getrusage``: ``process``, this process's
    since it began (in a stage process: the stage's peak, imports included), and ``child``, the
    largest peak of the child processes it has waited for (fine-tuning starts, extraction workers,
    ranks), given only when it exceeds ``process``: on Linux a child started by fork counts the
    parent's resident size at that moment (even ``git``, run for the record), so a smaller child
    cannot be told apart. Children running at once add up: two fine-tuning starts hold up to twice
    ``child``. {} where the ``resource`` module is missing (Windows)."""
    try:
        import resource
    except ImportError:
        return {}
    unit = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    process, child = (round(resource.getrusage(who).ru_maxrss * unit / 2**20, 1)
                      for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return {"process": process, **({"child": child} if child > process else {})}


def _cpu_fields(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The first processor's ``key: value`` lines of /proc/cpuinfo ({} where there is none)."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text().splitlines():
            if not line.strip() and fields:  # the first block is enough: every core reports the same
                break
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return fields


def _cpu_identity(fields: Mapping[str, str]) -> dict[str, str]:
    """``cpu_id`` (family / model / stepping / microcode) and ``cpu_flags`` (a digest of the sorted
    flag list) from :func:`_cpu_fields`."""
    keys = [k for k in ("cpu family", "model", "stepping", "microcode") if k in fields]
    if not keys:
        return {}
    flags = " ".join(sorted(fields.get("flags", "").split()))
    return {"cpu_id": " ".join(f"{k} {fields[k]}" for k in keys),
            "cpu_flags": hashlib.sha256(flags.encode()).hexdigest()[:12]}


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory + rename."""
    tmp = stage_bytes(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def stage_bytes(path: Path | str, data: bytes) -> Path:
    """Write ``data`` (fsynced, mode as ``open()`` gives) to a temporary ``.<name>.<random>.tmp``
    beside ``path`` and return it; renaming it onto ``path`` is the caller's. A failed write
    (a full disk names ``path``) leaves no temporary file."""
    from pipeline.common.failures import names_file_when_full

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with names_file_when_full(path):
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        chmod_as_open(tmp)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return Path(tmp)


def atomic_write_json(path: Path | str, obj: Any, *, indent: int | None = 2) -> None:
    """Deterministic JSON (sorted keys, trailing newline) written atomically."""
    atomic_write_bytes(path, json_bytes(obj, indent=indent))


def json_bytes(obj: Any, *, indent: int | None = 2) -> bytes:
    """Deterministic JSON (sorted keys, trailing newline) as :func:`atomic_write_json` writes it."""
    return (json.dumps(obj, indent=indent, sort_keys=True, ensure_ascii=False, default=str) + "\n").encode("utf-8")


def mark_done(path: Path | str, info: Mapping[str, Any] | None = None) -> None:
    """Leave a completion marker ``<path>.done`` (JSON) after ``path`` was fully written."""
    atomic_write_json(Path(str(path) + DONE_SUFFIX), dict(info or {}))


def is_done(path: Path | str) -> bool:
    return Path(str(path) + DONE_SUFFIX).exists() and Path(path).exists()


class OutputsMissingError(RuntimeError):
    """A stage's listed outputs are gone before its ``_run.json`` is written (another run removed them)."""


class InputsMissingError(FileNotFoundError):
    """An input that an earlier stage writes is absent: that stage has not run (or ``paths.data``
    points at another tree). The message names the file and the stage to run first."""


class RunRecord:
    """Collects what a stage did and writes ``_run.json`` into its output directory.

    >>> rec = RunRecord("ingest@coco", params.section_digest("sources", "ingest"))
    >>> rec.inputs["captions"] = path; rec.counts["rows"] = 10
    >>> rec.write(out_dir)

    ``wall_time_s`` runs from the enclosing :func:`stage_clock` (the stage's start; the CLI sets
    it) or, outside one, from the record's creation.

    ``extra["outputs"]`` (name -> path, relative paths from the working directory) lists outputs
    written outside ``out_dir``; :meth:`write` refuses to record a run whose listed output (or a
    path of its ``require``) is missing.
    """

    def __init__(self, stage: str, params_digest: str) -> None:
        self.stage = stage
        self.params_digest = params_digest
        self.inputs: dict[str, Path | str] = {}
        self.counts: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}
        now = time.time()
        self._start = now if _stage_start is None else min(now, _stage_start)

    def write(self, out_dir: Path | str, name: str = RUN_FILE, *, require: Iterable[Path | str] = ()) -> dict[str, Any]:
        """Write the record as ``out_dir/name`` (atomically) and return it.

        ``require``: more paths that must exist (checked, not recorded). Raises RuntimeError naming
        the missing paths of ``extra["outputs"]`` and ``require`` before writing anything: a
        ``_run.json`` says the stage finished, so it must never stand beside missing outputs.
        """
        self.check_outputs(Path(out_dir) / name, require)
        record = self.render()
        atomic_write_json(Path(out_dir) / name, record)
        return record

    def render(self) -> dict[str, Any]:
        """The record as :meth:`write` writes it (digests of the inputs, counts, wall time so far)."""
        return {
            "stage": self.stage,
            "params_digest": self.params_digest,
            "input_digests": {k: tree_digest(v) if Path(v).exists() else None for k, v in sorted(self.inputs.items())},
            "code_version": code_version(),
            "machine": machine(),
            "rig": {"mini_world_version": MINI_WORLD_VERSION},  # docs/rig.md
            "counts": self.counts,
            "wall_time_s": round(time.time() - self._start, 3),
            "peak_rss_mb": peak_rss_mb(),
            **self.extra,
        }

    def check_outputs(self, target: Path, require: Iterable[Path | str] = ()) -> None:
        """Raise OutputsMissingError unless every path of ``extra["outputs"]`` and ``require`` exists
        (``target``: the record about to be written, for the message)."""
        listed = [(f"output {key!r}", str(path)) for key, path in sorted((self.extra.get("outputs") or {}).items())]
        missing = [f"{what} ({path})" for what, path in listed + [("required", str(p)) for p in require]
                   if not Path(path).exists()]
        if missing:
            shown = "; ".join(missing[:5]) + (f"; and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise OutputsMissingError(
                f"{self.stage}: not writing {target}: {len(missing)} listed output path(s) do not exist: {shown} "
                "(another run may have removed them, or the stage did not write them)")


def chmod_as_open(path: Path | str) -> None:
    """Give a file made by ``mkstemp`` (mode 0600) the mode a plain ``open()`` would: 0666 less
    the umask. Other users, e.g. an Airflow worker in docker, must be able to read stage outputs."""
    os.chmod(path, 0o666 & ~current_umask())
