"""docs/parameters.md's tables against params.yaml: every documented key exists and its default is the
value params.yaml really has (a reader copies these into `dvc exp run -S`, so a stale default misleads).

Rows are `| `key` | `default` | meaning |`; rows that list several keys in one cell, or point to
params.yaml ("see `params.yaml`"), are not single-value rows and are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "parameters.md"
ROW = re.compile(r"^\|\s*`([a-z_0-9.<>]+)`\s*\|\s*`([^`]*)`\s*\|", re.M)


def _params() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def _documented_rows() -> list[tuple[str, str]]:
    """(key, default) of the docs/parameters.md rows whose key names a params.yaml section."""
    sections = set(_params())
    rows = ROW.findall(DOC.read_text())
    return [(key, default) for key, default in rows if key.split(".")[0] in sections]


def _single_key_rows() -> list[tuple[str, str]]:
    """Documented rows naming one concrete key (not a ``<task>`` pattern)."""
    return [(key, default) for key, default in _documented_rows() if "<" not in key]


def _lookup(params: dict, key: str):
    node = params
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(part)
        node = node[part]
    return node


def _same(documented: str, actual) -> bool:
    parsed = yaml.safe_load(documented)
    if isinstance(actual, float) and isinstance(parsed, str):
        try:  # YAML 1.1 reads "1e-4" as a string; the tables write learning rates that way
            return float(parsed) == actual
        except ValueError:
            return False
    return parsed == actual


def test_parameters_md_documents_many_params_rows():
    assert len(_documented_rows()) > 100  # the pattern still matches the tables


def test_every_documented_key_exists_in_params_yaml():
    params = _params()
    missing = []
    for key, _ in _single_key_rows():
        try:
            _lookup(params, key)
        except KeyError:
            missing.append(key)
    assert not missing, f"docs/parameters.md documents keys params.yaml does not have: {missing}"


def test_documented_defaults_are_the_params_yaml_values():
    params = _params()
    stale = []
    for key, default in _single_key_rows():
        actual = _lookup(params, key)
        if not _same(default, actual):
            stale.append(f"{key}: docs/parameters.md says {default!r}, params.yaml has {actual!r}")
    assert not stale, "docs/parameters.md defaults differ from params.yaml:\n" + "\n".join(stale)
