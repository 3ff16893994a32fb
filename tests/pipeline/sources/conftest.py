"""Fixtures for the reader tests (helpers live in source_fixtures.py so tests can import them)."""

from source_fixtures import fixture_params  # noqa: F401  (a pytest fixture)
