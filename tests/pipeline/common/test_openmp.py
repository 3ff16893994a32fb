"""The OpenMP wait of stage processes (pipeline/common/openmp.py): a short spin unless the user chose."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from pipeline.common.openmp import POLICY_ENV, SPIN_ENV, STAGE_SPIN_COUNT, set_stage_wait_policy

ROOT = Path(__file__).resolve().parents[3]


def test_a_stage_spins_briefly_unless_the_user_chose(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # as in a fresh stage process (restored after)
    env: dict[str, str] = {}
    assert set_stage_wait_policy(env) == str(STAGE_SPIN_COUNT) and env == {SPIN_ENV: str(STAGE_SPIN_COUNT)}
    for chosen in ({POLICY_ENV: "PASSIVE"}, {SPIN_ENV: "0"}, {POLICY_ENV: "ACTIVE", SPIN_ENV: "5"}):
        env = dict(chosen)
        assert set_stage_wait_policy(env) is None and env == chosen


def test_a_process_with_torch_loaded_is_left_alone(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))  # libgomp has read its settings
    env: dict[str, str] = {}
    assert set_stage_wait_policy(env) is None and env == {}


@pytest.mark.parametrize("user", [{}, {POLICY_ENV: "PASSIVE"}])
def test_the_stage_entry_sets_it_before_torch_loads(user):
    """`python -m pipeline <stage>` chooses before anything imports torch (libgomp reads it then)."""
    probe = ("import json, os, sys\nfrom pipeline.__main__ import main\n"
             "status = main(['ingest', '--params', 'no-such-params.yaml'])\n"
             f"print(json.dumps([status, os.environ.get({SPIN_ENV!r}), 'torch' in sys.modules]))")
    env = {k: v for k, v in os.environ.items() if k not in (POLICY_ENV, SPIN_ENV)}
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**env, **user, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120, check=True)
    status, spin, torch_loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == 2 and not torch_loaded  # a bad params file: the stage never started
    assert spin == (None if user else str(STAGE_SPIN_COUNT))
