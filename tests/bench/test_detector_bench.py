"""bench/detector.py on tiny settings: the preset and a changed arm train from equal losses and get a row."""

from __future__ import annotations

import ast

import pytest
from helpers.bench import run_bench

pytestmark = pytest.mark.stage  # trains a model (not in `make test-unit`)


def test_detector_bench_times_the_preset_beside_a_config_change_from_equal_losses():
    proc = run_bench("detector.py", "--rounds", "1", "--iters", "2", "--images", "8", "--threads", "1",
                     "--vs", "MODEL.UNITER.CHANNELS_LAST=False", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    losses = [ast.literal_eval(line.split("first losses ", 1)[1]) for line in lines if "first losses" in line]
    assert len(losses) == 2 and losses[0]
    # the same start and op, another memory layout: equal up to rounding (and near-tied proposals' order)
    assert losses[1].keys() == losses[0].keys()
    assert all(abs(losses[1][k] - v) <= 1e-2 * max(1.0, abs(v)) for k, v in losses[0].items())
    table = lines[lines.index(next(line for line in lines if line.startswith("arm "))) + 1:]
    assert [row.split()[0] for row in table] == ["preset", "MODEL.UNITER.CHANNELS_LAST=False"]
    assert float(table[0].split()[-2]) == 1.0 and all(float(row.split()[-3]) > 0 for row in table)


def test_detector_bench_refuses_a_change_without_a_value():
    proc = run_bench("detector.py", "--vs", "MODEL.UNITER.CHANNELS_LAST", timeout=120)
    assert proc.returncode == 2 and "expected KEY=VALUE" in proc.stderr
