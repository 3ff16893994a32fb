"""Loading a pickle that may only hold plain data (RefCOCO's ``refs(unc).p``).

Pickles can run arbitrary code when loaded, so :class:`PlainUnpickler` builds only plain containers
and scalars and refuses any pickle that names a class or function (:class:`UnsafePickleError` names
the file and the global). Shared by the RefCOCO reader (ingest) and the detector's training boxes
(extract).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from pipeline.common.source_records import SourceFormatError


class UnsafePickleError(pickle.UnpicklingError, SourceFormatError):
    """A pickle that would build something other than plain data (and could run code)."""


class PlainUnpickler(pickle.Unpickler):
    """Unpickles only dicts, lists, tuples, sets, str, bytes, int, float, bool and None.

    Those are built directly by pickle opcodes; every other object needs ``find_class`` (GLOBAL /
    STACK_GLOBAL / extension codes) or ``persistent_load``, and both refuse. So no callable ever
    reaches REDUCE/BUILD/INST/OBJ and nothing runs. Python 2 pickles (the real refs files) have
    their byte strings decoded as UTF-8 with ``surrogateescape`` so bad bytes surface per record.
    """

    def __init__(self, file, *, source: str) -> None:
        super().__init__(file, encoding="utf-8", errors="surrogateescape")
        self.source = source

    def find_class(self, module: str, name: str):
        raise UnsafePickleError(
            f"{self.source}: refusing to unpickle global '{module}.{name}': only plain containers and "
            "scalars are allowed (the file may be malicious or not a refs file)"
        )

    def persistent_load(self, pid):
        raise UnsafePickleError(f"{self.source}: refusing a persistent id in the pickle: {pid!r}"[:300])


def load_plain_pickle(path: Path | str) -> Any:
    """Load ``path`` with :class:`PlainUnpickler`; raises UnsafePickleError naming the file."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return PlainUnpickler(io.BytesIO(data), source=str(path)).load()
    except UnsafePickleError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as err:
        raise SourceFormatError(f"{path}: not a readable pickle ({type(err).__name__}: {err})") from None
