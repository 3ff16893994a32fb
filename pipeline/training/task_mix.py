"""The task schedule: which pretraining task every optimizer step runs.

UNITER samples one task per mini-batch by ``mix_ratio``. Here the draw for step ``s`` is a pure
function of ``(seed, s)``: every rank computes the same task without communicating, and a resumed
run needs no schedule state at all (the schedule is reproduced from the step number).
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

import numpy as np

# Distinguishes this RNG stream from every other stream derived from the root seed.
_TASK_MIX_STREAM = 0x7A5C


class _Mix:
    """Active tasks (sorted by name) and the cumulative distribution of one ``mix_ratio``."""

    def __init__(self, mix_ratio: Mapping[str, float], key: str) -> None:
        bad = {t: r for t, r in mix_ratio.items() if r < 0}
        if bad:
            raise ValueError(f"{key}: ratios must be >= 0, got {bad}")
        self.tasks: tuple[str, ...] = tuple(sorted(t for t, r in mix_ratio.items() if r > 0))
        if not self.tasks:
            raise ValueError(f"{key}: at least one task needs a ratio > 0, got {dict(mix_ratio)}")
        ratios = np.array([float(mix_ratio[t]) for t in self.tasks])
        self.probs = ratios / ratios.sum()
        self.cdf = np.cumsum(self.probs)
        self.cdf[-1] = 1.0

    def draw(self, u: float) -> str:
        return self.tasks[int(np.searchsorted(self.cdf, u, side="right"))]


class TaskSchedule:
    """Draws one task per optimizer step with probability proportional to ``mix_ratio``.

    Tasks with ratio 0 are never drawn (that is how task subsets are ablated). Tasks are ordered by
    name, so the schedule does not depend on the order of keys in params.yaml.

    With ``first_phase_steps`` > 0, steps ``1..first_phase_steps`` draw from ``first_phase_mix``
    instead (e.g. ITM alone before the mix: one shared AdamW state lets MLM's ~100x larger
    encoder gradients drown ITM's in the mix, while ITM learned first survives it). Every step uses
    the same uniform draw either way, so the steps after the first phase are those of the plain
    schedule.
    """

    def __init__(self, mix_ratio: Mapping[str, float], *, seed: int, first_phase_mix: Mapping[str, float] | None = None,
                 first_phase_steps: int = 0) -> None:
        self._mix = _Mix(mix_ratio, "mix_ratio")
        if first_phase_steps < 0:
            raise ValueError(f"first_phase_steps must be >= 0, got {first_phase_steps}")
        self.first_phase_steps = int(first_phase_steps) if first_phase_mix else 0
        self._first = _Mix(first_phase_mix, "first_phase_mix") if self.first_phase_steps else None
        first_tasks = self._first.tasks if self._first else ()
        self.tasks: tuple[str, ...] = tuple(sorted(set(self._mix.tasks) | set(first_tasks)))
        self.seed = int(seed)

    def task_at(self, step: int) -> str:
        """The task of optimizer step ``step`` (1-based, like the step counter of the loop)."""
        if step < 1:
            raise ValueError(f"TaskSchedule.task_at: steps count from 1, got {step}")
        u = np.random.default_rng([self.seed, _TASK_MIX_STREAM, step]).random()
        return (self._first if self._first is not None and step <= self.first_phase_steps else self._mix).draw(u)

    def tasks_for(self, first: int, last: int) -> list[str]:
        """Tasks of steps ``first..last`` inclusive."""
        return [self.task_at(s) for s in range(first, last + 1)]

    def counts(self, steps: int) -> dict[str, int]:
        """How many of steps ``1..steps`` each active task gets."""
        counts = Counter(self.tasks_for(1, steps))
        return {t: counts.get(t, 0) for t in self.tasks}
