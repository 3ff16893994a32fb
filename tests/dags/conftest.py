"""Airflow reads its configuration when first imported: point it at a throwaway home (no
~/airflow, no example DAGs) before any test here imports it."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
if str(DAGS) not in sys.path:
    sys.path.append(str(DAGS))  # the DAG's helper module, `_uniter_runs`
