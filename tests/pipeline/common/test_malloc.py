"""A stage process keeps freed memory for reuse (pipeline/common/malloc.py), checked through glibc's
own accounting (``mallinfo2``) in fresh processes: where a 64 MiB block came from, and where it went."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.common.malloc import CHOICE_ENV, TUNABLES_ENV, glibc_version, keep_freed_memory

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(glibc_version() is None, reason="glibc's malloc only")

# Allocates, touches and frees 64 MiB with libc's malloc, after SETUP; prints what glibc's
# accounting saw: bytes newly in mmap'd blocks while it was held, free bytes kept in the heap after.
PROBE = """
import ctypes, json, sys
SETUP
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks "
                                                 "fordblks keepcost").split()]
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = Info
size = 64 << 20
before = libc.mallinfo2().hblkhd  # blocks mmap'd before (the interpreter's own)
block = libc.malloc(size)
ctypes.memset(block, 1, size)
held = libc.mallinfo2().hblkhd - before
libc.free(block)
print(json.dumps({"set": SET, "mmapped_while_held": held, "kept_after_free": libc.mallinfo2().fordblks}))
"""


def probe(setup: str, result: str, **env: str) -> dict:
    code = PROBE.replace("SETUP", setup).replace("SET", result)
    base = {k: v for k, v in os.environ.items() if k not in (TUNABLES_ENV, CHOICE_ENV)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**base, **env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_glibcs_defaults_map_a_large_block_and_give_it_back():
    """The control: without the setting the test below would fail (mmap'd, then unmapped)."""
    seen = probe("", "None")
    assert seen["mmapped_while_held"] >= 64 << 20 and seen["kept_after_free"] < 64 << 20


def test_the_setting_keeps_a_freed_large_block_in_the_heap():
    seen = probe("from pipeline.common.malloc import keep_freed_memory\nset_ = keep_freed_memory()", "set_")
    assert seen == {"set": True, "mmapped_while_held": 0, "kept_after_free": seen["kept_after_free"]}
    assert seen["kept_after_free"] >= 64 << 20


@pytest.mark.parametrize("user", [{TUNABLES_ENV: "glibc.malloc.trim_threshold=131072"}, {CHOICE_ENV: "system"}])
def test_the_users_choice_wins(user):
    seen = probe("from pipeline.common.malloc import keep_freed_memory\nset_ = keep_freed_memory()", "set_", **user)
    assert seen["set"] is False and seen["mmapped_while_held"] >= 64 << 20


def test_a_misspelt_choice_is_an_error():
    with pytest.raises(ValueError, match="UNITER_MALLOC='sytem': expected keep or system"):
        keep_freed_memory({CHOICE_ENV: "sytem"})


def test_the_stage_entry_sets_it():
    """`python -m pipeline <stage>` (DVC, Airflow) sets it first: here a stage that stops at its params."""
    setup = ("from pipeline.__main__ import main\n"
             "status = main(['ingest', '--params', 'no-such-params.yaml'])")
    seen = probe(setup, "status")
    assert seen["set"] == 2 and seen["mmapped_while_held"] == 0 and seen["kept_after_free"] >= 64 << 20


# the stages' spawned children run in fresh interpreters, which inherit no malloc settings: each
# child's entry sets them (its training or detector work replaced by nothing here)
CHILD_ENTRIES = {
    "finetune start": ("import contextlib, types\nimport pipeline.finetune.finetune as f\n"
                       "f.train_run = f.run_plan = f.finetune_seed = f.exit_now = lambda *a, **k: None\n"
                       "f.open_task = lambda *a, **k: types.SimpleNamespace(task=None)\n"
                       "f.process_group = lambda *a: contextlib.nullcontext()\n"
                       "f._train_start_child(None, 'vqa', 'scratch', 1, 'fp32')\nran = True"),
    "budgets point": ("import pipeline.common.exiting as e\nimport pipeline.finetune.budget_sweep as b\n"
                      "e.end_at_interpreter_exit = lambda *a, **k: None\n"
                      "b._init_point_worker()\nran = True"),
    "extract worker": ("import pipeline.common.exiting as e\nimport pipeline.extract.detector.runner as r\n"
                       "r._init_worker = e.end_at_interpreter_exit = lambda *a, **k: None\n"
                       "r._init_spawned_worker(None)\nran = True"),
}


@pytest.mark.parametrize("entry", sorted(CHILD_ENTRIES))
def test_the_stages_spawned_children_set_it(entry):
    seen = probe(CHILD_ENTRIES[entry], "ran")
    assert seen["set"] is True and seen["mmapped_while_held"] == 0 and seen["kept_after_free"] >= 64 << 20
