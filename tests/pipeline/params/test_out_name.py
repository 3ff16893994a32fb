"""``pretrain.out_name`` may not name another stage's output: pretraining would replace it
(``data/models/detector/model_final.pth`` gone with ``out_name=detector``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.params.finetune import TASKS
from pipeline.params.parser import ParamsError, load_params

PARAMS = Path(__file__).resolve().parents[3] / "params.yaml"


@pytest.mark.parametrize("name", ["detector", "finetune", *TASKS])
def test_an_out_name_that_is_another_stages_output_is_refused(name):
    with pytest.raises(ParamsError, match=rf"pretrain.out_name: '{name}' names a pretraining output '{name}'"):
        load_params(PARAMS, [f"pretrain.out_name={name}"], check_paths=False)


def test_a_suffixed_output_that_clashes_is_refused_too():
    """out_name ``x`` also writes ``x_vcr``: with ``x_vcr`` a task's name, ``x`` is refused."""
    import pipeline.params.pretrain as pretrain

    original = pretrain.OTHER_STAGES_OUTPUTS
    pretrain.OTHER_STAGES_OUTPUTS = (*original, "mine_vcr")
    try:
        with pytest.raises(ParamsError, match="'mine' names a pretraining output 'mine_vcr'"):
            load_params(PARAMS, ["pretrain.out_name=mine"], check_paths=False)
    finally:
        pretrain.OTHER_STAGES_OUTPUTS = original


def test_other_names_are_accepted():
    assert load_params(PARAMS, ["pretrain.out_name=pretrain_b"], check_paths=False).pretrain.out_name == "pretrain_b"


def test_an_empty_path_is_refused_not_taken_for_the_working_directory():
    with pytest.raises(ParamsError, match=r"paths.data: expected a path, got an empty string"):
        load_params(PARAMS, ["paths.data="], check_paths=False)


def test_a_tokenizer_that_does_not_exist_is_refused_at_parse_time(tmp_path):
    with pytest.raises(ParamsError, match=r"build_dbs.tokenizer: path does not exist: /nonexistent"):
        load_params(PARAMS, ["build_dbs.tokenizer=/nonexistent"])
