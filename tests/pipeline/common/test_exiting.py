"""exit_now: a stage process ends with its status, its atexit work done and its output flushed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_exit_now_runs_atexit_flushes_and_keeps_the_status(tmp_path):
    marker = tmp_path / "atexit.txt"
    probe = (
        "import atexit, logging, sys, tempfile, weakref\n"
        "from pipeline.common.exiting import exit_now\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
        f"scratch = tempfile.TemporaryDirectory(dir={str(tmp_path)!r})\n"  # removed by its weakref finalizer
        "logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
        "logging.getLogger('probe').info('logged')\n"
        "sys.stdout.write('no newline, still buffered')\n"
        "exit_now(3)\n"
        "print('not reached')\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={"PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert done.stdout == "no newline, still buffered"
    assert "INFO:probe:logged" in done.stderr
    assert marker.read_text() == "ran"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["atexit.txt"]  # the temporary directory is gone


def test_the_stage_entry_exits_with_the_stage_status(tmp_path):
    """`python -m pipeline` with a bad params file: status 2 and the message, through exit_now."""
    done = subprocess.run([sys.executable, "-m", "pipeline", "ingest", "--params", str(tmp_path / "none.yaml")],
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "error:" in done.stderr


def test_a_pool_worker_ends_at_interpreter_exit_with_its_results_delivered():
    probe = (
        "import multiprocessing as mp\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "from pipeline.common.exiting import end_at_interpreter_exit\n"
        "if __name__ == '__main__':\n"
        "    pool = ProcessPoolExecutor(1, mp_context=mp.get_context('spawn'), initializer=end_at_interpreter_exit)\n"
        "    print([pool.submit(pow, 2, k).result() for k in range(3)])\n"
        "    workers = list(pool._processes.values())\n"
        "    pool.shutdown(wait=True)\n"
        "    print([w.exitcode for w in workers])\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={"PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[1, 2, 4]", "[0]"]
