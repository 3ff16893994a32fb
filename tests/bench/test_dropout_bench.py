"""bench/dropout.py on tiny settings: every dropout variant is timed, and the attention table names
the mask generators and the key mask's two applications."""

from __future__ import annotations

import pytest
from helpers.bench import run_bench

pytestmark = pytest.mark.stage


def test_dropout_bench_times_every_variant_against_torch():
    proc = run_bench("dropout.py", "--steps", "2", "--rounds", "1", "--batch", "4", "--threads", "1", timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[lines.index(next(
        line for line in lines if line.startswith("dropout "))) + 1:]}
    assert list(rows) == ["torch", "int32", "zeroing", "model", "none"] and float(rows["torch"][1]) == 1.0
    assert all(float(ms) > 0 for ms, _ in rows.values())


def test_dropout_bench_attention_table_times_each_mask_generator():
    proc = run_bench("dropout.py", "--attention", "--steps", "1", "--rounds", "1", "--threads", "1", timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    masks = proc.stdout.splitlines()[-1]
    assert masks.startswith("one mask of 393216 elements:")
    assert all(f"{name} " in masks for name in ("bernoulli_", "int32", "drop_mask", "keep_multiplier"))
    header = next(line for line in proc.stdout.splitlines() if line.startswith("B x L"))
    assert header.split()[-2:] == ["masked_fill", "p=0.1"]  # the key mask's former application, side by side
