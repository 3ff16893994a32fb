"""The divergence guard: a fine-tuning start that learned and then fell back to chance fails loudly.

A run *diverged* when its dev score was well above chance at some point and ends near chance
(``finetune.divergence_guard``): the best check's dev score is above chance by at least
``above_chance`` points and by at least ``MIN_Z`` of its standard errors (so a tiny dev split's
noise is not a peak), and the final dev score keeps at most ``kept`` of that margin. The dev score
is the mean of the task's headline metrics on its dev split, in percent (as ``python -m pipeline
budgets`` scores a point), with the largest binomial standard error its item count allows
(:meth:`FinetuneTask.dev_score`); chance is the task's own
chance level of those metrics on dev. The guard scores dev ``checks`` times, evenly spread over
the run, and reads the final score from the run's own evaluation. A diverged run raises
:class:`DivergedError` before its result is stored, so nothing downstream reports it: the stage
exits non-zero naming the task, the start and the step.

The checks are kept in ``<work_dir>/guard.json``, so a run resumed from a checkpoint knows the
scores before it. Scoring runs in eval mode without gradients and leaves torch's RNG as it was,
so a run with the guard trains exactly as one without it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pipeline.common.runinfo import atomic_write_json
from pipeline.params.finetune import DivergenceGuardConfig

log = logging.getLogger(__name__)

GUARD_FILE = "guard.json"
DIVERGED_EXIT = 4  # a start's training process that diverged (its parent raises DivergedError for it)
MIN_Z = 3.0  # a peak counts as "well above chance" only this many standard errors above it


class DivergedError(RuntimeError):
    """A fine-tuning start diverged (its message names the task, the start and the step)."""


def check_steps(checks: int, total_steps: int) -> list[int]:
    """The steps (in ``[1, total_steps - 1]``) at which the guard scores dev: ``checks`` evenly spread."""
    steps = {round(k * total_steps / (checks + 1)) for k in range(1, checks + 1)}
    return sorted(s for s in steps if 1 <= s < total_steps)


@dataclass
class DivergenceGuard:
    """One start's guard. ``score`` returns the current model's dev (score, standard error) in
    points; ``chance`` the dev chance level of the same score. Call :meth:`resume` once, then
    :meth:`after_step` after every training step and :meth:`finish` with the final dev score."""

    cfg: DivergenceGuardConfig
    task: str
    init: str
    total_steps: int
    chance: float
    score: Callable[[], tuple[float, float]]
    work_dir: Path
    is_main: bool = True
    history: list[tuple[int, float, float]] = field(default_factory=list)  # (step, score, SE)

    def __post_init__(self) -> None:
        self.steps = set(check_steps(self.cfg.checks, self.total_steps)) if self.cfg.checks else set()

    @property
    def path(self) -> Path:
        return self.work_dir / GUARD_FILE

    def resume(self, resume_step: int | None) -> None:
        """Read the checks made up to ``resume_step`` (None: a fresh run, nothing to read)."""
        self.history = []
        if resume_step is None or not self.path.is_file():
            return
        record = json.loads(self.path.read_text())
        self.history = [(int(s), float(v), float(e)) for s, v, e in record.get("checks", []) if int(s) <= resume_step]

    def after_step(self, step: int) -> None:
        if step not in self.steps:
            return
        import torch  # here: the CLI imports this module for DivergedError before it needs torch

        with torch.random.fork_rng(devices=[]), torch.no_grad():
            value, se = self.score()
        self.history.append((step, float(value), float(se)))
        log.info("%s (%s start): dev score %.2f ± %.2f at step %d (chance %.2f)", self.task, self.init, value, se,
                 step, self.chance)
        self._write()

    def _write(self) -> None:
        if self.is_main:
            atomic_write_json(self.path, {"chance": self.chance, "checks": self.history})

    def finish(self, final: float) -> None:
        """Raise :class:`DivergedError` if the run diverged, given its final dev score."""
        if not self.steps or not self.history:
            return
        best_step, best, best_se = max(self.history, key=lambda check: check[1])
        margin = best - self.chance
        learned = margin >= self.cfg.above_chance and margin >= MIN_Z * best_se
        if not learned or final - self.chance > self.cfg.kept * margin:
            return
        floor = self.chance + self.cfg.kept * margin
        scores = [*((s, v) for s, v, _ in self.history), (self.total_steps, float(final))]
        fell = next(s for s, v in scores if s > best_step and v <= floor)
        trace = ", ".join(f"{v:.1f} at step {s}" for s, v in scores)
        raise DivergedError(
            f"finetune@{self.task}: the {self.init} start diverged at step {fell}: its dev score was "
            f"{best:.1f} ± {best_se:.1f} at step {best_step}, {margin:.1f} points above chance ({self.chance:.1f}), "
            f"and ended at "
            f"{final:.1f} (step {self.total_steps}), within {self.cfg.kept:g} of that margin of chance "
            f"(finetune.divergence_guard). Dev scores: {trace}. The run is not reported; its checkpoints stay "
            f"in {self.work_dir}")
