"""Fixtures for the reader tests (helpers live in tests/helpers/source_fixtures.py so tests can import them)."""

from helpers.source_fixtures import fixture_params  # noqa: F401  (a pytest fixture)
