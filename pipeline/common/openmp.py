"""How long an idle OpenMP thread spins before it sleeps, set before torch loads.

torch runs its CPU kernels on a GNU OpenMP (libgomp) team. Between two parallel regions an idle
thread either spins, ready for the next region at once, or sleeps and has to be woken (a futex
call, slow in virtual machines); a small model's step has thousands of regions. libgomp reads the
choice once, when it loads with torch: ``OMP_WAIT_POLICY`` (PASSIVE sleeps at once, ACTIVE always
spins) or ``GOMP_SPINCOUNT`` (spin that many times, then sleep; libgomp's own default is 300,000).

Measured on 2 cores with two torch threads (docs/decisions.md#openmp-spin): a training step
alone on the machine is 25-37% faster with a short spin than with PASSIVE, and the same bits come
out (the wait changes when a thread starts its share, not the share). With two such processes on
two cores, spinning threads steal each other's cores: 10,000 spins cost 2.8x PASSIVE there, and
libgomp's default 4.4x. So a stage (one process with the machine to itself, as ``dvc repro`` and
Airflow run them) spins briefly, while the test suite, which runs two pytest workers side by side,
exports ``OMP_WAIT_POLICY=PASSIVE`` (Makefile). A user who sets either variable keeps it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

POLICY_ENV, SPIN_ENV = "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"
STAGE_SPIN_COUNT = 10_000  # ~0.1 ms of spinning on a ~GHz core (libgomp: ~100,000 spins per ms)


def set_stage_wait_policy(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Give a stage process's OpenMP threads a short spin (``GOMP_SPINCOUNT``) unless the user set
    ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``; returns the value set, or None when nothing was set.

    Only a process that has not imported torch yet can choose (libgomp reads the variables when it
    loads); in one that has (a test importing a bench script), nothing is set.
    """
    if POLICY_ENV in environ or SPIN_ENV in environ or "torch" in sys.modules:
        return None
    environ[SPIN_ENV] = str(STAGE_SPIN_COUNT)
    return environ[SPIN_ENV]
