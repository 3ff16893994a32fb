"""The task schedule: which pretraining task, and which dataset's stream, every optimizer step runs.

UNITER's ``MetaLoader`` (ChenRocks/UNITER data/loader.py) keeps one loader per (task, dataset) and
draws one per optimizer step with probability proportional to that dataset's ratio for that task;
its configs give every dataset the same task mix times a dataset weight, so the draw is a task by
``mix_ratio`` and, independently, a dataset by ``pretrain.dataset_ratio``. Here both draws for step
``s`` are a pure function of ``(seed, s)``: every rank computes the same stream without
communicating, and a resumed run needs no schedule state at all.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

import numpy as np

from pipeline.params.checks import weights_problem

# Distinguishes this RNG stream from every other stream derived from the root seed.
_TASK_MIX_STREAM = 0x7A5C
STREAM_SEP = "/"  # stream names: "<task>" (datasets merged) or "<task>/<dataset>"


def stream_task(stream: str) -> str:
    """``"mlm/coco"`` -> ``"mlm"``; ``"mlm"`` -> ``"mlm"``."""
    return stream.split(STREAM_SEP, 1)[0]


def stream_dataset(stream: str) -> str | None:
    """``"mlm/coco"`` -> ``"coco"``; ``"mlm"`` (datasets merged) -> None."""
    parts = stream.split(STREAM_SEP, 1)
    return parts[1] if len(parts) == 2 else None


class _Mix:
    """Active tasks (sorted by name) and the cumulative distribution of one ``mix_ratio``."""

    def __init__(self, mix_ratio: Mapping[str, float], key: str) -> None:
        problem = weights_problem(mix_ratio, mix_ratio)  # the parser's rule for every ratio mapping
        if problem:
            raise ValueError(f"{key}: {problem}")
        self.tasks: tuple[str, ...] = tuple(sorted(t for t, r in mix_ratio.items() if r > 0))
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

    With ``dataset_ratio`` (dataset -> weight), each step also draws a dataset (a second uniform of
    the same generator, so the task sequence is the same with or without it) and runs the stream
    ``"<task>/<dataset>"``; without it, the stream is ``"<task>"`` over the datasets merged.
    """

    def __init__(self, mix_ratio: Mapping[str, float], *, seed: int, first_phase_mix: Mapping[str, float] | None = None,
                 first_phase_steps: int = 0, dataset_ratio: Mapping[str, float] | None = None) -> None:
        self._mix = _Mix(mix_ratio, "mix_ratio")
        if first_phase_steps < 0:
            raise ValueError(f"first_phase_steps must be >= 0, got {first_phase_steps}")
        self.first_phase_steps = int(first_phase_steps) if first_phase_mix else 0
        self._first = _Mix(first_phase_mix, "first_phase_mix") if self.first_phase_steps else None
        first_tasks = self._first.tasks if self._first else ()
        self.tasks: tuple[str, ...] = tuple(sorted(set(self._mix.tasks) | set(first_tasks)))
        self._datasets = _Mix(dataset_ratio, "dataset_ratio") if dataset_ratio else None
        datasets = self._datasets.tasks if self._datasets else ()
        self.streams: tuple[str, ...] = tuple(f"{t}{STREAM_SEP}{d}" for t in self.tasks for d in datasets) \
            if datasets else self.tasks
        self.seed = int(seed)

    def _uniforms(self, step: int) -> tuple[float, float]:
        if step < 1:
            raise ValueError(f"TaskSchedule: steps count from 1, got {step}")
        u = np.random.default_rng([self.seed, _TASK_MIX_STREAM, step]).random(2)
        return float(u[0]), float(u[1])

    def task_at(self, step: int) -> str:
        """The task of optimizer step ``step`` (1-based, like the step counter of the loop)."""
        u = self._uniforms(step)[0]
        return (self._first if self._first is not None and step <= self.first_phase_steps else self._mix).draw(u)

    def stream_at(self, step: int) -> str:
        """The stream of optimizer step ``step``: ``"<task>/<dataset>"``, or ``"<task>"`` without dataset ratios."""
        task = self.task_at(step)
        if self._datasets is None:
            return task
        return f"{task}{STREAM_SEP}{self._datasets.draw(self._uniforms(step)[1])}"

    def stream_counts(self, steps: int) -> dict[str, int]:
        """How many of steps ``1..steps`` each stream gets."""
        counts = Counter(self.stream_at(s) for s in range(1, steps + 1))
        return {name: counts.get(name, 0) for name in self.streams}

    def tasks_for(self, first: int, last: int) -> list[str]:
        """Tasks of steps ``first..last`` inclusive."""
        return [self.task_at(s) for s in range(first, last + 1)]

    def counts(self, steps: int) -> dict[str, int]:
        """How many of steps ``1..steps`` each active task gets."""
        counts = Counter(self.tasks_for(1, steps))
        return {t: counts.get(t, 0) for t in self.tasks}
