"""Read a torch-format weights file without running code from it.

``torch.load(weights_only=True)`` builds tensors and plain containers only; a file whose pickle
names anything else (a class, a function such as ``os.system``) is refused. Torch's own message
for that names no file and suggests loading again with the unsafe setting, so this module
replaces it with :class:`UnsafeCheckpointError`, which names the file and what was refused.
Torch is imported inside :func:`load_plain_torch` so that catching the error class stays cheap.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any

__all__ = ["UniterFormatError", "UnsafeCheckpointError", "WeightsMismatchError", "force_weights_only_loads",
           "load_plain_torch", "refused"]

# what torch's weights-only unpickler names when it refuses: "GLOBAL posix.system", "operand 149"
_GLOBAL_RE = re.compile(r"GLOBAL ([\w.]+)")
_OPERAND_RE = re.compile(r"Unsupported operand (\d+)")
# torch.load reads these at each call: the first makes every load weights-only, even one that asks
# for weights_only=False (DeepSpeed's checkpoint engine and zero_to_fp32 do); the second, the
# opposite, would make torch refuse every load while the first is set
FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
FORCE_UNSAFE = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


def force_weights_only_loads() -> None:
    """Make every ``torch.load`` of this process and its children weights-only (the stage entry
    calls this first: a library that asks for an unsafe load gets a safe one)."""
    os.environ.pop(FORCE_UNSAFE, None)
    os.environ[FORCE_WEIGHTS_ONLY] = "1"


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A weights file holds pickled Python objects beyond tensors and plain containers; not loaded."""


class UniterFormatError(ValueError):
    """A checkpoint does not fit the UNITER format or the run it is loaded into (names what and why).

    Defined here, without torch, so that the CLI can catch it cheaply (model/uniter_format.py)."""


class WeightsMismatchError(ValueError):
    """A weights file loaded safely but does not fit the model (missing keys, wrong shapes)."""


def refused(path: Path | str, torch_message: str) -> UnsafeCheckpointError:
    """The error for ``path``, naming the global or pickle opcode torch refused (when it says)."""
    if found := _GLOBAL_RE.search(torch_message):
        what = f"it names {found.group(1)}"
    elif found := _OPERAND_RE.search(torch_message):
        what = f"it uses pickle opcode {found.group(1)}, which a plain tensor file does not"
    else:
        what = "it is not a plain tensor file"
    return UnsafeCheckpointError(
        f"{path}: refused to load as unsafe: it holds pickled Python objects beyond tensors and plain "
        f"containers ({what}), and unpickling those could run code; convert it to safetensors or to a "
        "plain state dict of tensors"
    )


def load_plain_torch(path: Path | str, *, allow: tuple[Any, ...] = ()) -> Any:
    """Load a torch file (``torch.save`` output) onto the CPU: tensors and plain containers only,
    plus the classes or functions in ``allow`` (each one that builds plain data, never runs code).

    Raises :class:`UnsafeCheckpointError` naming ``path`` when the file holds anything else;
    nothing from the file runs.
    """
    import torch

    try:
        with torch.serialization.safe_globals(list(allow)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        # from None: torch's message (in the chained traceback) recommends the unsafe retry
        raise refused(path, str(err)) from None
