"""Each fact once: a default in pipeline/params/*.py either equals params.yaml's value or does not exist."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.params.parser import load_params, to_dict

PARAMS = Path(__file__).resolve().parents[3] / "params.yaml"


def _defaults_that_differ(obj, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), prefix + f.name
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            try:
                default = f.default_factory()
            except TypeError:  # a section whose own keys have no defaults: no default either
                default = dataclasses.MISSING
        else:
            default = dataclasses.MISSING
        if default is not dataclasses.MISSING and to_dict(default) != to_dict(value):
            out.append(f"{key}: default {to_dict(default)!r}, params.yaml {to_dict(value)!r}")
        if dataclasses.is_dataclass(value):
            out += _defaults_that_differ(value, key + ".")
        elif isinstance(value, dict):
            for name, item in value.items():
                if dataclasses.is_dataclass(item):
                    out += _defaults_that_differ(item, f"{key}.{name}.")
    return out


def test_every_dataclass_default_equals_params_yaml_or_does_not_exist():
    assert not _defaults_that_differ(load_params(PARAMS))


def test_the_check_sees_a_drifted_default(monkeypatch):
    from pipeline.params.pretrain import PretrainConfig

    steps = next(f for f in dataclasses.fields(PretrainConfig) if f.name == "steps")
    monkeypatch.setattr(steps, "default", load_params(PARAMS).pretrain.steps + 1)
    assert any(d.startswith("pretrain.steps: default") for d in _defaults_that_differ(load_params(PARAMS)))
