"""params.yaml parsing is strict: unknown keys, wrong types and missing paths name the key."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.config import FrozenDict, ParamsError, apply_override, load_params, load_raw, parse_params, to_dict

REPO = Path(__file__).resolve().parents[2]
PARAMS = REPO / "params.yaml"


def test_default_params_parse_into_frozen_dataclasses():
    params = load_params(PARAMS)
    assert params.world == "mini"
    assert params.pretrain.optim.betas == (0.9, 0.98)
    assert isinstance(params.pretrain.mix_ratio, FrozenDict)
    with pytest.raises(AttributeError):
        params.seed = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        params.pretrain.mix_ratio["mlm"] = 0.0  # type: ignore[index]


def test_every_key_in_params_yaml_round_trips():
    """to_dict(parse(raw)) == raw: nothing in params.yaml is ignored or defaulted away."""
    raw = load_raw(PARAMS)
    dumped = yaml.safe_load(yaml.safe_dump(to_dict(load_params(PARAMS))))
    assert dumped == yaml.safe_load(yaml.safe_dump(raw))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("pretrain.stpes=3", "unknown key pretrain.stpes (did you mean 'pretrain.steps'?)"),
        ("extract.train.lrr=0.1", "unknown key extract.train.lrr"),
        ("pretrain.steps=ten", "pretrain.steps: expected an integer, got 'ten'"),
        ("pretrain.steps=true", "pretrain.steps: expected an integer"),
        ("pretrain.masking=random", "pretrain.masking: expected one of ['conditional', 'joint']"),
        ("pretrain.optim.betas=[0.9]", "pretrain.optim.betas: expected 2 items"),
        ("ingest.datasets=coco", "ingest.datasets: expected a list"),
        ("finetune.per_task.vqa.stepz=1", "unknown key finetune.per_task.vqa.stepz"),
        ("world=moon", "world: expected one of ['mini', 'real']"),
        ("pretrain.steps=50", "pretrain.first_phase_steps: 100 is more than steps (50)"),
        ("pretrain.first_phase_steps=-1", "pretrain.first_phase_steps: must be >= 0, got -1"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ParamsError) as err:
        load_params(PARAMS, [override])
    assert message in str(err.value)
    assert str(PARAMS) in str(err.value)


def test_a_first_phase_that_cannot_run_is_not_checked_against_steps():
    # MLM alone: the ITM-first phase drops out, so a short run is fine
    params = load_params(PARAMS, ["pretrain.steps=50", "pretrain.mix_ratio={mlm: 1.0}"])
    assert params.pretrain.first_phase() == ({}, 0)
    assert load_params(PARAMS).pretrain.first_phase() == ({"itm": 1.0}, 100)


def test_missing_key_is_an_error():
    raw = load_raw(PARAMS)
    del raw["seed"]
    with pytest.raises(ParamsError, match="missing key seed"):
        parse_params(raw)


def test_real_world_requires_existing_source_files(tmp_path):
    with pytest.raises(ParamsError) as err:
        load_params(PARAMS, ["world=real", f"sources.cc.train_tsv={tmp_path}/nope.tsv"])
    assert "sources.cc.train_tsv: path does not exist" in str(err.value)
    assert f"{tmp_path}/nope.tsv" in str(err.value)


def test_overrides_are_yaml_typed():
    raw: dict = {"a": {"b": 1}}
    apply_override(raw, "a.b=2.5")
    apply_override(raw, "a.c.d=null")
    apply_override(raw, "e=[1, 2]")
    assert raw == {"a": {"b": 2.5, "c": {"d": None}}, "e": [1, 2]}
    with pytest.raises(ParamsError, match="KEY=VALUE"):
        apply_override(raw, "a.b")
    with pytest.raises(ParamsError, match="a.b is not a section"):
        apply_override(raw, "a.b.c=1")


def test_params_pickle_and_digest_are_stable():
    a = load_params(PARAMS)
    b = pickle.loads(pickle.dumps(a))
    assert a == b and a.digest() == b.digest()
    assert a.digest() != load_params(PARAMS, ["seed=7"]).digest()
    assert a.section_digest("extract") == load_params(PARAMS, ["seed=7"]).section_digest("extract")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, capture_output=True, text=True)


def test_cli_help_lists_every_stage():
    from pipeline.stages import STAGES

    out = _cli("--help")
    assert out.returncode == 0
    for name in STAGES:
        assert name in out.stdout


def test_cli_misspelled_key_exits_nonzero_naming_it():
    out = _cli("mini_world", "--set", "mini_world.image_sise=64")
    assert out.returncode == 2
    assert "mini_world.image_sise" in out.stderr and "image_size" in out.stderr
