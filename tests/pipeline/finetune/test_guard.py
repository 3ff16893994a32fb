"""The divergence guard (``pipeline.finetune.guard``): a tiny classifier that learns and is then
forced to collapse fails naming task, start and step; one that keeps what it learned, or whose
"peak" is a tiny dev split's noise, passes; checks survive a resume; bad params fail at parse time."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from pipeline.finetune.guard import GUARD_FILE, DivergedError, DivergenceGuard, check_steps
from pipeline.params.finetune import DivergenceGuardConfig
from pipeline.params.parser import ParamsError, load_params

PARAMS = Path(__file__).resolve().parents[3] / "params.yaml"
CHANCE = 50.0  # two balanced classes


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.randn(n, 8, generator=gen) + (y[:, None].float() * 2 - 1) * 1.5  # separable along every axis
    return x, y


class _Run:
    """A linear classifier trained by SGD for ``steps`` steps; ``collapse_at``: from that step its
    weights are zero and stay there (a collapsed model: one class for every input, chance on dev)."""

    def __init__(self, *, steps: int = 40, collapse_at: int | None = None, dev_size: int = 400):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(8, 2)
        self.train, self.dev = _data(256, 1), _data(dev_size, 2)
        self.steps, self.collapse_at = steps, collapse_at

    def score(self) -> tuple[float, float]:
        with torch.no_grad():
            p = float((self.model(self.dev[0]).argmax(-1) == self.dev[1]).float().mean())
        return 100 * p, 100 * math.sqrt(0.25 / len(self.dev[1]))  # as FinetuneTask.dev_score

    def step(self, step: int) -> None:
        if self.collapse_at is not None and step >= self.collapse_at:
            with torch.no_grad():
                for p in self.model.parameters():
                    p.zero_()
            return
        loss = torch.nn.functional.cross_entropy(self.model(self.train[0]), self.train[1])
        self.model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in self.model.parameters():
                p -= 0.5 * p.grad

    def train_with(self, guard: DivergenceGuard, *, start: int = 0) -> float:
        for step in range(start + 1, self.steps + 1):
            self.step(step)
            guard.after_step(step)
        return self.score()[0]


def _guard(run: _Run, tmp_path: Path, **cfg) -> DivergenceGuard:
    cfg = {"checks": 3, **cfg}
    return DivergenceGuard(DivergenceGuardConfig(**cfg), task="refcoco_plus", init="pretrained",
                           total_steps=run.steps, chance=CHANCE, score=run.score, work_dir=tmp_path)


def test_check_steps_are_spread_inside_the_run():
    assert check_steps(3, 40) == [10, 20, 30]
    assert check_steps(3, 3) == [1, 2]
    assert check_steps(2, 1) == []
    assert check_steps(0, 100) == []


def test_a_forced_collapse_fails_naming_task_start_and_step(tmp_path):
    run = _Run(collapse_at=25)
    guard = _guard(run, tmp_path)
    guard.resume(None)
    final = run.train_with(guard)
    assert final == pytest.approx(CHANCE)  # the collapsed model answers one class: chance
    assert [s for s, _, _ in guard.history] == [10, 20, 30] and guard.history[1][1] > 90
    with pytest.raises(DivergedError) as err:
        guard.finish(final)
    message = str(err.value)
    assert "finetune@refcoco_plus" in message and "pretrained start" in message
    assert "diverged at step 30" in message and "at step 20" in message
    assert json.loads((tmp_path / GUARD_FILE).read_text())["checks"][0][0] == 10


def test_a_run_that_keeps_what_it_learned_passes(tmp_path):
    run = _Run()
    guard = _guard(run, tmp_path)
    guard.resume(None)
    guard.finish(run.train_with(guard))
    assert len(guard.history) == 3


def test_off_and_tiny_dev_noise_do_not_trip(tmp_path):
    run = _Run(collapse_at=25)
    off = _guard(run, tmp_path, checks=0)
    off.resume(None)
    off.finish(run.train_with(off))
    assert off.history == []
    # a 10-item dev split: a 70% "peak" is 20 points above chance but under 3 standard errors (15.8 each)
    noisy = _guard(run, tmp_path)
    noisy.history = [(10, 70.0, 100 * math.sqrt(0.25 / 10))]
    noisy.finish(CHANCE)


def test_a_resumed_run_knows_the_checks_before_it(tmp_path):
    run = _Run(collapse_at=25)
    first = _guard(run, tmp_path)
    first.resume(None)
    for step in range(1, 26):  # killed after step 25 (checks at 10 and 20 made), resumed from step 20
        run.step(step)
        first.after_step(step)
    resumed = _guard(run, tmp_path)
    resumed.resume(20)
    assert [s for s, _, _ in resumed.history] == [10, 20]
    with pytest.raises(DivergedError, match="diverged at step 30"):
        resumed.finish(run.train_with(resumed, start=20))


@pytest.mark.parametrize("override, message", [
    ("finetune.divergence_guard.kept=1.0", "finetune.divergence_guard.kept: must be a finite number in [0, 1)"),
    ("finetune.divergence_guard.above_chance=0", "finetune.divergence_guard.above_chance: must be a finite number "
                                                 "in (0, 100]"),
    ("finetune.divergence_guard.checks=-1", "finetune.divergence_guard.checks: must be an integer in [0, 1000]"),
    ("finetune.divergence_guard.near=5", "unknown key finetune.divergence_guard.near"),
])
def test_bad_guard_params_fail_at_parse_time(override, message):
    with pytest.raises(ParamsError, match=None) as err:
        load_params(PARAMS, [override], check_paths=False)
    assert message in str(err.value)


def test_the_default_guard_is_on():
    cfg = load_params(PARAMS, check_paths=False).finetune.divergence_guard
    assert cfg.checks > 0 and 0 < cfg.kept < 1 and cfg.above_chance > 0


@pytest.mark.stage
def test_the_guard_checks_dev_and_leaves_training_unchanged(tmp_path_factory, monkeypatch):
    """The real stage with the guard's two dev checks and without any: the checks are made (steps 1
    and 2 of 3) and the trained weights are the same, bit for bit."""
    from safetensors.torch import load_file

    from helpers.finetune_world import budget, ft_params, world
    from pipeline.finetune.finetune import run

    checked: list[int] = []
    after_step = DivergenceGuard.after_step

    def observed(self, step):
        after_step(self, step)
        checked.extend(s for s, _, _ in self.history if s == step)

    monkeypatch.setattr(DivergenceGuard, "after_step", observed)
    weights = {}
    for checks in (0, 2):
        data = world(tmp_path_factory)
        run(ft_params(data, budget("snli_ve", steps=3), f"finetune.divergence_guard.checks={checks}"), "snli_ve")
        weights[checks] = load_file(str(data / "models" / "snli_ve" / "model.safetensors"))
        assert checked == ([] if checks == 0 else [1, 2])
    assert weights[0].keys() == weights[2].keys()
    assert all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])
