"""bench/malloc.py on tiny settings: both workers run, compute the same losses, and the table has both rows."""

from __future__ import annotations

import pytest
from helpers.bench import run_bench

from pipeline.common.malloc import glibc_version

pytestmark = [pytest.mark.stage, pytest.mark.skipif(glibc_version() is None, reason="glibc's malloc only")]


def test_malloc_bench_compares_both_workers_on_equal_losses():
    proc = run_bench("malloc.py", "--steps", "2", "--rounds", "1", "--batch", "4", "--threads", "1", timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "losses equal to the bit in every round" in proc.stdout
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()[-2:]}
    assert set(rows) == {"glibc", "kept"} and float(rows["glibc"][1]) == 1.0
    assert all(float(ms) > 0 and int(faults) >= 0 for ms, _, faults in rows.values())
