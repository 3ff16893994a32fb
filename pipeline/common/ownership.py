"""Ownership markers: the pipeline removes or replaces only directories that it created.

Every directory a stage may later clear (checkpoint roots, work directories, output directories
that are replaced whole, feature directories whose stale shards are pruned, dvclive directories)
carries an :data:`OWNER_FILE` written by the stage that created it: ``{"stage": ..., "params_digest":
...}``. Before removing or replacing a directory, a stage calls :func:`check_owned` (through
:func:`remove_owned` or :func:`claim_dir`): a non-empty directory without the marker is never
touched; the stage stops with :class:`ForeignDirectoryError` naming it. An empty directory holds
nothing to lose and may be taken over, and so may one holding only what a killed marker write left
(the marker's temporary file, :func:`is_marker_leftover`): a stage SIGKILLed between creating its
directory and renaming the marker into place must not lock its own retry out.

Why a marker and not only a check of the path: ``paths.data`` may point anywhere by design, so a
path inside the data directory can still be someone's own folder (``paths.data: ~`` by mistake).
The marker is the one fact that says "this pipeline wrote it".
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

from pipeline.common.runinfo import atomic_write_json, current_umask

OWNER_FILE = ".uniter-owner.json"
# pipeline.common.runinfo.atomic_write_bytes writes the marker as ".<name>.<random>.tmp", then renames it
_MARKER_TMP_PREFIX, _MARKER_TMP_SUFFIX = f".{OWNER_FILE}.", ".tmp"


class ForeignDirectoryError(RuntimeError):
    """A stage was about to remove or replace a directory that the pipeline did not create."""

    def __init__(self, path: Path, action: str) -> None:
        self.path = Path(path)
        super().__init__(
            f"refusing to {action} {self.path}: it is not empty and has no {OWNER_FILE} marker, so this pipeline "
            f"did not create it. Move it away, or point the stage elsewhere (paths.data, pretrain.out_name)")


def is_owned(path: Path | str) -> bool:
    """True when ``path`` is a directory carrying the pipeline's ownership marker."""
    return (Path(path) / OWNER_FILE).is_file()


def is_marker_leftover(entry: Path) -> bool:
    """True for the temporary file of a marker write that was killed before its rename."""
    name = entry.name
    return name.startswith(_MARKER_TMP_PREFIX) and name.endswith(_MARKER_TMP_SUFFIX) and entry.is_file() \
        and not entry.is_symlink()


def check_owned(path: Path | str, action: str = "remove") -> None:
    """Raise :class:`ForeignDirectoryError` unless ``path`` is absent, empty (but for marker
    leftovers), or carries the marker.

    A path that exists but is not a directory (a file, a link) is never the pipeline's directory.
    """
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise ForeignDirectoryError(path, action)
    if path.is_dir() and not is_owned(path) and any(not is_marker_leftover(e) for e in path.iterdir()):
        raise ForeignDirectoryError(path, action)


def write_marker(path: Path | str, stage: str, params_digest: str | None = None) -> None:
    """Write the marker into the existing directory ``path`` (deterministic bytes: no time, no pid)."""
    owner: dict[str, Any] = {"stage": stage}
    if params_digest is not None:
        owner["params_digest"] = params_digest
    atomic_write_json(Path(path) / OWNER_FILE, owner)


def claim_dir(path: Path | str, stage: str, params_digest: str | None = None) -> Path:
    """Create ``path`` (with parents) as a directory this pipeline may later clear, and return it.

    An existing directory must be empty or already marked (else :class:`ForeignDirectoryError`,
    raised before the stage does any work there). The marker is (re)written with ``stage``.
    """
    path = Path(path)
    check_owned(path, action="write into and later clear")
    path.mkdir(parents=True, exist_ok=True)
    write_marker(path, stage, params_digest)
    for entry in path.iterdir():  # what an earlier, killed marker write left
        if is_marker_leftover(entry):
            entry.unlink(missing_ok=True)
    return path


@contextlib.contextmanager
def atomic_dir(final: Path | str, *, stage: str) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``final``; on success it replaces ``final``.

    The temporary directory carries ``stage``'s ownership marker from the start, so the result
    does too, and so does what a killed build leaves behind (which a later run may then clear).
    An existing ``final`` is replaced only when the pipeline owns it (or it is empty): otherwise
    :class:`ForeignDirectoryError` is raised before any work, and again at the
    swap. On an exception the temporary directory is removed and ``final`` is left untouched.
    """
    final = Path(final)
    check_owned(final, action="replace")
    remove_stale_temps(final)  # what a killed earlier build (or its cleanup) left beside final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp creates 0700
    try:
        write_marker(tmp, stage)
        yield tmp
        check_owned(final, action="replace")
    except BaseException:
        with contextlib.suppress(OSError):
            remove_tree(tmp)
        raise
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old.{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        with contextlib.suppress(OSError):  # a leftover is removed by the next build of final
            remove_tree(old)


def remove_owned(path: Path | str) -> None:
    """Remove the directory ``path`` if the pipeline owns it; nothing to do when it is absent.

    Raises :class:`ForeignDirectoryError` (and removes nothing) for an unmarked non-empty directory.
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    check_owned(path, action="remove")
    remove_tree(path)


def remove_tree(path: Path | str) -> None:
    """Remove the directory ``path`` with everything below it, its marker last, then ``path`` itself.

    A process killed at any step leaves a directory that still carries its marker, or an empty
    one; :func:`check_owned` lets a rerun remove either. (``shutil.rmtree`` removes entries in
    directory order: a kill after the marker went would lock every rerun out.)
    """
    path = Path(path)
    for entry in path.iterdir():
        if entry.name == OWNER_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    (path / OWNER_FILE).unlink(missing_ok=True)
    path.rmdir()


def remove_stale_temps(final: Path | str) -> None:
    """Delete what a killed earlier build of ``final`` left beside it: ``.<name>.*.tmp`` and
    ``.<name>.old.*`` directories.

    Only directories carrying the pipeline's ownership marker (or empty ones) go; any other raises
    :class:`ForeignDirectoryError` naming it. The stage lock keeps a second build of the same
    output from running meanwhile.
    """
    final = Path(final)
    if not final.parent.is_dir():
        return
    for stale in sorted(final.parent.glob(f".{glob.escape(final.name)}.*")):
        if stale.is_dir() and not stale.is_symlink() and (stale.name.endswith(".tmp") or
                                                            stale.name.startswith(f".{final.name}.old.")):
            remove_owned(stale)


def _is_temp_file_of(entry: Path, name: str) -> bool:
    """``entry`` is a plain file an atomic write of the file ``name`` left when killed before its rename:
    ``.<name>.<random>.tmp`` beside it, the random part as :func:`tempfile.mkstemp` names it."""
    own = re.fullmatch(rf"\.{re.escape(name)}\.[a-z0-9_]+\.tmp", entry.name)
    return own is not None and entry.is_file() and not entry.is_symlink()


def remove_stale_temp_files(final: Path | str) -> None:
    """Delete the files that atomic writes of the file ``final`` left when killed before their
    rename (:func:`_is_temp_file_of`). Nothing else matches (another file's temporaries, a directory,
    a link). The caller holds the lock of the stage writing ``final``, so no live write of it is
    running meanwhile.
    """
    final = Path(final)
    if not final.parent.is_dir():
        return
    for stale in sorted(final.parent.glob(f".{glob.escape(final.name)}.*.tmp")):
        if _is_temp_file_of(stale, final.name):
            stale.unlink(missing_ok=True)


def preflight(*paths: Path | str) -> None:
    """Check, before a stage does any work, every directory it will later clear or replace.

    The same checks run again at the moment of removal; this call only makes a foreign directory
    stop the stage at once instead of after minutes of training.
    """
    for path in paths:
        check_owned(path, action="clear or replace")


def strays(root: Path | str, keep: Iterable[str]) -> list[Path]:
    """The entries of ``root`` other than ``keep`` (names): what a run writing exactly ``keep`` into
    an empty ``root`` would not have there."""
    root, keep = Path(root), set(keep)
    return sorted(e for e in root.iterdir() if e.name not in keep) if root.is_dir() else []


def check_prunable(root: Path | str, keep: Iterable[str]) -> None:
    """Raise :class:`ForeignDirectoryError` unless :func:`prune` may remove every stray of ``root``:
    a directory the pipeline owns (or an empty one), or a temporary file of an atomic write of a
    kept name. Call before the work; :func:`prune` checks again."""
    keep = set(keep)
    for entry in strays(root, keep):
        if entry.is_dir() and not entry.is_symlink():
            check_owned(entry, action="remove as not written by this run")
        elif not any(_is_temp_file_of(entry, name) for name in keep):
            raise ForeignDirectoryError(entry, "remove as not written by this run")


def prune(root: Path | str, keep: Iterable[str]) -> None:
    """Remove every entry of ``root`` but ``keep``, so that it holds what a fresh run would write.

    For outputs DVC leaves in place (``persist: true``): a DB an earlier run wrote and this one
    does not (a dataset dropped, a skipped text DB) and a killed run's temporaries go, as if DVC
    had removed the directory before the run. Refuses (removing nothing) what :func:`check_prunable`
    refuses."""
    keep = set(keep)
    check_prunable(root, keep)
    for entry in strays(root, keep):
        if entry.is_dir():
            remove_owned(entry)
        else:
            entry.unlink()
