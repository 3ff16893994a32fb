"""Typed sections of ``params.yaml``: one frozen dataclass module per stage family.

Each stage owns its section file; :mod:`pipeline.params.parser` assembles them into ``Params`` and parses
strictly. Keep these modules import-light (no torch, no detectron2): the CLI parses params before
it imports the stage.

Checks live beside the keys they check: :func:`bounded` puts a key's allowed range on its field
(the parser checks every such field), and a section's ``problems()`` says the rules that involve
more than one key or a collection, using the helpers below. Every message names the allowed range.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

# One path component that names an artifact (data/models/<name>, runs/<run_name>): no separator,
# nothing that climbs out of its parent. The Airflow DAG reuses it for run_name.
NAME_PATTERN = r"[A-Za-z0-9._-]+"
_NAME = re.compile(NAME_PATTERN)

# upper bounds where a larger value means "runs forever" or "allocates without limit"
MAX_STEPS = 10_000_000
MAX_COUNT = 1_000_000
MAX_TOKENS = 10_000_000
MAX_SEED = 2**32 - 1  # numpy.random.RandomState and other 32-bit seeded generators take no more


def must_exist(default: Any = dataclasses.MISSING, *, kind: str | None = None, **kwargs: Any) -> Any:
    """A dataclass field holding a path that must exist on disk when the config is validated;
    ``kind`` (``file`` or ``dir``), when given, is what it must be."""
    meta = {"must_exist": True, **({"kind": kind} if kind else {})}
    if default is dataclasses.MISSING:
        return field(metadata=meta, **kwargs)
    return field(default=default, metadata=meta, **kwargs)


def path_or_hub_id(files: str, default: Any = None, *, kind: str | None = None) -> Any:
    """A field holding a path that must exist (a ``kind``, as :func:`must_exist`), or a Hugging Face
    id that the local hub cache must hold (pipeline/common/hf_cache.py; ``files``: which of its file
    lists, ``bert`` or ``tokenizer``)."""
    return field(default=default, metadata={"must_exist": True, "hub_id": files, **({"kind": kind} if kind else {})})


def _number(x: float) -> str:
    """``10000000`` for whole numbers (as a reader types them), ``0.5``/``inf`` otherwise."""
    return str(int(x)) if math.isfinite(x) and float(x).is_integer() else f"{x:g}"


@dataclass(frozen=True)
class Range:
    """An allowed interval for a number; ``lo_open``/``hi_open`` exclude that end."""

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False

    def __str__(self) -> str:
        return f"{'(' if self.lo_open else '['}{_number(self.lo)}, {_number(self.hi)}{')' if self.hi_open else ']'}"

    def contains(self, value: float) -> bool:
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return math.isfinite(value) and above and below

    def problem(self, value: Any) -> str | None:
        """None when ``value`` lies in the range, else the message (``must be an integer in [1, 5], got 0``)."""
        if self.contains(value):
            return None
        kind = "an integer" if isinstance(value, int) else "a finite number"
        return f"must be {kind} in {self}, got {value!r}"


def bounded(default: Any, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> Any:
    """A dataclass field whose number must lie in [lo, hi] (ends excluded when open); the parser checks it.

    ``default`` may be ``dataclasses.MISSING``: the key is then required (params.yaml holds the value)."""
    meta = {"range": Range(lo, hi, lo_open, hi_open)}
    if default is dataclasses.MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def range_problems(obj: Any) -> list[tuple[str, str]]:
    """(field, message) for every :func:`bounded` field of dataclass ``obj`` whose value is out of range
    (None passes: an optional key left null)."""
    out = []
    for f in dataclasses.fields(obj):
        rng, value = f.metadata.get("range"), getattr(obj, f.name)
        message = rng.problem(value) if rng is not None and value is not None else None
        if message:
            out.append((f.name, message))
    return out


def name_problem(value: str) -> str | None:
    """None when ``value`` is a single path component (:data:`NAME_PATTERN`, not ``.``/``..``), else the message."""
    if _NAME.fullmatch(value) and value not in (".", ".."):
        return None
    return f"must be a single name matching {NAME_PATTERN} (not '.' or '..'), got {value!r}"


def subset_problem(values: Iterable[str], allowed: Iterable[str], *, nonempty: bool = True) -> str | None:
    """None when ``values`` are among ``allowed`` (and, with ``nonempty``, there is one), else the message."""
    values, allowed = list(values), list(allowed)
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        return f"{unknown} not allowed; expected a subset of {allowed}"
    if nonempty and not values:
        return f"must name at least one of {allowed}"
    return None


def weights_problem(weights: Mapping[str, float], allowed: Iterable[str], where: str = "") -> str | None:
    """None when ``weights`` maps known tasks to finite ratios >= 0, one of them > 0; else the message.

    ``where`` (e.g. ``" in pretrain_vcr"``) says which stage the allowed tasks belong to."""
    allowed = list(allowed)
    unknown = sorted(set(weights) - set(allowed))
    if unknown:
        return f"task(s) {unknown} not allowed{where}; expected a subset of {allowed}"
    bad = {k: v for k, v in weights.items() if not Range(0, math.inf, hi_open=True).contains(v)}
    if bad:
        return f"ratios must be finite numbers >= 0, got {bad}"
    if not any(v > 0 for v in weights.values()):
        return f"at least one task needs a ratio > 0, got {dict(weights)}"
    return None


def zero_stage_problem(stage: int, supported: tuple[int, ...]) -> str | None:
    """None when ``stage`` is a ZeRO stage in ``supported``, else the message."""
    if stage in supported and not isinstance(stage, bool):
        return None
    allowed = ", ".join(map(str, supported[:-1])) + f" or {supported[-1]}"
    return f"zero_stage must be {allowed}, got {stage!r}"


def betas_problem(betas: tuple[float, float]) -> str | None:
    """None when both AdamW betas lie in [0, 1), else the message."""
    if all(0 <= b < 1 for b in betas):
        return None
    return f"each beta must be a finite number in [0, 1), got {list(betas)}"


def checked(**messages: str | None) -> list[tuple[str, str]]:
    """The (key, message) pairs whose message is not None, in the order given."""
    return [(key, message) for key, message in messages.items() if message]
