"""Typed sections of ``params.yaml``: one frozen dataclass module per stage family.

Each stage owns its section file; :mod:`pipeline.config` assembles them into ``Params`` and parses
strictly. Keep these modules import-light (no torch, no detectron2): the CLI parses params before
it imports the stage.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any


def must_exist(default: Any = dataclasses.MISSING, **kwargs: Any) -> Any:
    """A dataclass field holding a path that must exist on disk when the config is validated."""
    meta = {"must_exist": True}
    if default is dataclasses.MISSING:
        return field(metadata=meta, **kwargs)
    return field(default=default, metadata=meta, **kwargs)
