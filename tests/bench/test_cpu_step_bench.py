"""bench/cpu_step.py on tiny settings: a row per thread count with its step time, FLOP rate and
speed-up, and with --profile the operator table and the matrix products' share."""

from __future__ import annotations

import re

import pytest
from helpers.bench import run_bench

pytestmark = pytest.mark.stage


def test_cpu_step_bench_times_each_thread_count_and_profiles_the_matrix_share():
    proc = run_bench("cpu_step.py", "--preset", "tiny", "--threads", "1", "2", "--rounds", "1", "--batch", "2",
                     "--precision", "fp32", "--profile", timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("preset tiny, fp32, batch 2 x") and "GFLOP a step" in lines[0], lines[0]
    header = lines.index(next(line for line in lines if line.split()[:1] == ["threads"]))
    rows = [line.split() for line in lines[header + 1:header + 3]]
    assert [r[0] for r in rows] == ["1", "2"] and float(rows[0][4]) == 1.0
    assert all(float(v) > 0 for r in rows for v in r[1:]), rows
    assert any("aten::addmm" in line or "aten::mm" in line for line in lines), proc.stdout[-3000:]
    share = re.search(r"matrix products \(aten::mm, aten::addmm, aten::bmm\): ([\d.]+)% of the CPU time, so ~(\d+) "
                      r"GFLOP/s inside them on 1 thread", lines[-1])
    assert share and 0 < float(share.group(1)) < 100 and int(share.group(2)) > 0, lines[-1]


def test_cpu_step_bench_refuses_zero_threads():
    proc = run_bench("cpu_step.py", "--threads", "0", timeout=60)
    assert proc.returncode == 2 and "--threads" in proc.stderr
