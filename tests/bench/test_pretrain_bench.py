"""bench/pretrain.py's stage world end to end on tiny settings: the world is built by the real
build_dbs stage, the four loops run in rotating rounds and the table has every row (docs/benchmarks.md)."""

from __future__ import annotations

import re

import pytest
from helpers.bench import run_bench

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

ROWS = ("bare", "plain", "engine", "loop", "loop+log")


def test_stage_bench_prints_every_loop_and_the_target_line():
    proc = run_bench("pretrain.py", "--preset", "tiny", "--images", "24", "--steps", "3", "--rounds", "2",
                     "--batch-tokens", "256", "--threads", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("loop ") and "tokens/s" in line)
    table = {}
    for line in lines[header + 1:header + 1 + len(ROWS)]:
        name, *_, tokens_s, step_ms, ratio, paired = line.split()
        table[name] = (float(tokens_s), float(step_ms), float(ratio), float(paired))
    assert tuple(table) == ROWS
    assert table["bare"][2] == table["bare"][3] == 1.0 and all(min(v) > 0 for v in table.values())
    for name, (tokens_s, _, ratio, _) in table.items():  # the ratio column is tokens/s over (a)'s
        assert abs(ratio - tokens_s / table["bare"][0]) < 0.002 + 1e-3 * ratio, name
    assert table["loop+log"][0] <= table["loop"][0] * 1.03  # the same run, more time counted (ms rounding)
    assert sum(line.startswith("round ") for line in lines) == 2
    assert re.search(r"^b/a = \d\.\d{3}$", proc.stdout, re.M)
    assert re.search(r"^c/a = \d\.\d{3}  target >= 0\.85: (met|NOT met)$", proc.stdout, re.M)


def test_synthetic_bench_hands_ds_config_to_deepspeed():
    """--ds-config is merged into the config DeepSpeed parses: the header names the change, and a
    key DeepSpeed does not know is refused by DeepSpeed's own validation (one run, ~6 s)."""
    proc = run_bench("pretrain.py", "--world", "synthetic", "--preset", "tiny", "--batch", "4", "--steps", "2",
                     "--rounds", "1", "--threads", "1", "--ds-config", '{"bf16": {"no_such_key": 1}}')
    assert 'DeepSpeed config + {"bf16": {"no_such_key": 1}}' in proc.stdout, proc.stdout[-2000:]
    assert proc.returncode != 0 and "no_such_key" in proc.stderr and "extra_forbidden" in proc.stderr
    # a key params own is refused as params refuse it, before anything runs
    owned = run_bench("pretrain.py", "--world", "synthetic", "--ds-config", '{"fp16": {}}')
    assert owned.returncode == 2 and "fp16 is set by pretrain.precision" in owned.stderr, owned.stderr[-2000:]
