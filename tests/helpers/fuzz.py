"""The fuzz tests' shared budget: ``UNITER_FUZZ_EXAMPLES`` examples per target (default 12, what
`make test` runs; e.g. ``UNITER_FUZZ_EXAMPLES=500 pytest tests/pipeline/ingest/test_fuzz_readers.py``
for a longer search)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

DEFAULT_EXAMPLES = 12
EXAMPLES = int(os.environ.get("UNITER_FUZZ_EXAMPLES", str(DEFAULT_EXAMPLES)))


def fuzz_settings() -> settings:
    """Hypothesis settings of one fuzz target: ``EXAMPLES`` examples, no deadline and no example
    database; at the default budget the draw is fixed (derandomized) and a failing example is
    reported as found, without shrinking (each step runs a stage, so shrinking would take minutes)."""
    longer = EXAMPLES > DEFAULT_EXAMPLES
    return settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=not longer,
                    phases=[Phase.explicit, Phase.generate] + ([Phase.shrink] if longer else []),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])
