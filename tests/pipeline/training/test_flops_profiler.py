"""The documented ``pretrain.deepspeed: {flops_profiler: {enabled: true, profile_step: N}}`` trains on
the CPU: DeepSpeed's backward timers are started for it (the run died with "timer is not started")."""

from __future__ import annotations

import pytest

import pipeline.training.engine as engine_module
from test_loop import run_toy  # pytest puts this test's directory on sys.path

pytestmark = pytest.mark.stage  # trains a model (not in `make test-unit`)


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_a_run_with_the_flops_profiler_trains(toy, tmp_path, monkeypatch, zero_stage):
    merge = engine_module.merge_config
    profiler = {"flops_profiler": {"enabled": True, "profile_step": 2}}
    monkeypatch.setattr(engine_module, "merge_config", lambda base, extra: merge(base, {**extra, **profiler}))
    _, result = run_toy(toy, tmp_path, total=3, zero_stage=zero_stage, checkpoint_every=0)
    assert result.start_step == 0 and result.last_val  # it trained all 3 steps and evaluated
