"""bench/detector.py on tiny settings: every variant trains, starts from equal losses, and gets a row."""

from __future__ import annotations

import ast

import pytest
from helpers.bench import run_bench

pytestmark = pytest.mark.stage  # trains a model (not in `make test-unit`)


def test_detector_bench_times_every_variant_from_equal_losses():
    proc = run_bench("detector.py", "--rounds", "1", "--iters", "2", "--images", "8", "--threads", "1", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    losses = [ast.literal_eval(line.split("first losses ", 1)[1]) for line in lines if "first losses" in line]
    assert len(losses) == 4 and losses[0]
    for other in losses[1:]:  # the same op and start: equal up to rounding (and near-tied proposals' order)
        assert other.keys() == losses[0].keys()
        assert all(abs(other[k] - v) <= 1e-2 * max(1.0, abs(v)) for k, v in losses[0].items())
    table = lines[lines.index(next(line for line in lines if line.lstrip().startswith("ROIAlign"))) + 1:]
    assert [row.split()[0] for row in table] == ["torchvision", "matrix", "torchvision", "matrix"]
    assert float(table[0].split()[-2]) == 1.0 and all(float(row.split()[-3]) > 0 for row in table)
