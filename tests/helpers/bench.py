"""Running a ``bench/`` script as a user would: the venv's Python, from the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python bench/<script> ARGS`` in the repository root, output captured as text (not checked)."""
    return subprocess.run([sys.executable, str(REPO / "bench" / script), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, check=False)
