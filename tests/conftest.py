"""Suite-wide ordering for `make test`'s two pytest-xdist workers (``--dist loadfile
--no-loadscope-reorder``): the two longest files, the tiny-world end-to-end run and the Airflow
run, go first, so each worker starts with one of them and the short files fill in behind."""

from __future__ import annotations

import os

import pytest

LONG_FIRST = ("tests/e2e/test_dvc_repro.py", "tests/dags/test_airflow_scheduler.py")


def _rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return LONG_FIRST.index(path) if path in LONG_FIRST else len(LONG_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: the order within each group is kept


# torch's load mode as the suite found it, before any fixture ran ``python -m pipeline``'s main()
_TORCH_LOAD_MODE = {name: os.environ.get(name)
                    for name in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")}


def _set_torch_load_mode() -> None:
    for name, value in _TORCH_LOAD_MODE.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _torch_load_mode_restored():
    """``python -m pipeline``'s entry forces weights-only ``torch.load`` through the environment
    (model/weights_file.py). A test, or a module fixture, that calls ``main()`` in process must not
    leave it set for the next test in the same worker (whose unsafe-load controls would then be
    made safe): each test starts and ends with the mode the suite started with."""
    _set_torch_load_mode()
    yield
    _set_torch_load_mode()
