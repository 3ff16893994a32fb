"""pretrain.recipe: the defaults it gives the keys it governs, explicit keys overriding it, and the
departures a run records (pipeline/params/pretrain.py RECIPE_DEFAULTS, apply_recipe)."""

from __future__ import annotations

import pytest

from pipeline.params.model import ModelConfig
from pipeline.params.parser import ParamsError, load_params
from pipeline.params.pretrain import RECIPE_DEFAULTS, RECIPES, PretrainConfig, recipe_default

# UNITER's own values, read off its code and configs (docs/fidelity.md), written out here once more
# so that a change of the recipe table has to be a deliberate change of this test too
UNITER = {"pretrain.first_phase_steps": 0, "pretrain.first_phase_dropout": None, "model.region_init": "random", "model.region_feature_norm": "none",
          "model.region_box_norm": "none", "model.region_box_start": "reference", "model.pooler_start": "checkpoint",
          "pretrain.itm_init_std": 0.02,
          "pretrain.mrc_kl_reduction": "mean", "pretrain.wra_words": "all", "pretrain.dataset_ratio": "reference",
          "pretrain.optim.grad_clip": 5.0, "pretrain.vcr.grad_clip": 0.0}


def _get(params, key):
    for part in key.split("."):
        params = getattr(params, part)
    return params


@pytest.mark.parametrize("recipe", RECIPES)
def test_null_keys_take_the_recipe_values(recipe):
    params = load_params(overrides=[f"pretrain.recipe={recipe}"], check_paths=False)
    assert params.pretrain.recipe == recipe
    for key, by_recipe in RECIPE_DEFAULTS.items():
        assert _get(params, key) == by_recipe[recipe], key


def test_uniter_recipe_is_uniter_and_project_departs_only_where_measured():
    assert {k: v["uniter"] for k, v in RECIPE_DEFAULTS.items()} == UNITER
    departures = {k for k, v in RECIPE_DEFAULTS.items() if v["project"] != v["uniter"]}
    # each measured on the mini world (docs/fidelity.md, docs/decisions.md)
    assert departures == {"pretrain.first_phase_steps", "pretrain.first_phase_dropout", "model.region_init",
                          "model.region_feature_norm", "model.region_box_start", "pretrain.itm_init_std"}


def test_dataclass_defaults_are_the_default_recipe():
    cfg, model = PretrainConfig(), ModelConfig()
    assert cfg.first_phase_steps == recipe_default("pretrain.first_phase_steps")
    assert cfg.first_phase_dropout == recipe_default("pretrain.first_phase_dropout") == 0.0
    assert cfg.optim.grad_clip == recipe_default("pretrain.optim.grad_clip")
    assert model.region_init == recipe_default("model.region_init")
    assert cfg.dataset_weights() == {"coco": 1.0, "vg": 1.0}


def test_explicit_keys_override_the_recipe_and_are_recorded():
    from pipeline.pretrain.plan import recipe_departures

    params = load_params(overrides=["pretrain.recipe=uniter", "pretrain.first_phase_steps=100",
                                    "pretrain.optim.grad_clip=2.0"], check_paths=False)
    assert params.pretrain.first_phase_steps == 100 and params.model.region_init == "random"
    assert recipe_departures(params) == {"pretrain.first_phase_steps": 100, "pretrain.optim.grad_clip": 2.0}
    assert recipe_departures(load_params(check_paths=False)) == {}


def test_the_first_stage_draws_from_the_corpora_build_dbs_built():
    """COCO + VG configured (no CC, SBU): pretrain.datasets=both read pretrain_outdomain_* (never
    built) and drew CC and SBU batches; it now draws from the in-domain corpora only."""
    from pipeline.pretrain.plan import plan_stage

    sets = ["pretrain.datasets=both", "ingest.datasets=[coco,vg]", "finetune.tasks=[]"]
    plan = plan_stage(load_params(overrides=sets, check_paths=False), "pretrain")
    assert [s.path.name for s in plan.train_sources] == ["pretrain_indomain_train"]
    assert [s.path.name for s in plan.val_sources] == ["pretrain_indomain_val"]
    assert plan.dataset_ratio == {"coco": 2.0, "vg": 3.0}  # UNITER's all-data ratios, of the corpora there
    full = plan_stage(load_params(overrides=["pretrain.datasets=both"], check_paths=False), "pretrain")
    assert len(full.train_sources) == 2 and full.dataset_ratio == {"coco": 2.0, "vg": 3.0, "cc": 3.0, "sbu": 2.0}
    with pytest.raises(ParamsError, match=r"pretrain.datasets: outdomain draws from cc, sbu, none of which is a "
                                          r"pretraining corpus in use \(coco, vg: "):
        plan_stage(load_params(overrides=[*sets, "pretrain.datasets=outdomain"], check_paths=False), "pretrain")


def test_dataset_ratio_forms():
    both = load_params(overrides=["pretrain.datasets=both"], check_paths=False).pretrain
    assert both.dataset_weights() == {"coco": 2.0, "vg": 3.0, "cc": 3.0, "sbu": 2.0}  # UNITER's all-data config
    assert load_params(overrides=["pretrain.dataset_ratio=size"], check_paths=False).pretrain.dataset_weights() is None
    own = load_params(overrides=["pretrain.dataset_ratio={coco: 1, vg: 4}"], check_paths=False).pretrain
    assert own.dataset_weights() == {"coco": 1.0, "vg": 4.0}
    with pytest.raises(ParamsError, match=r"pretrain.dataset_ratio: must give a ratio to exactly the datasets"):
        load_params(overrides=["pretrain.dataset_ratio={coco: 1, cc: 1}"], check_paths=False)
    with pytest.raises(ParamsError, match=r"pretrain.dataset_ratio"):
        load_params(overrides=["pretrain.dataset_ratio=merged"], check_paths=False)
    with pytest.raises(ParamsError, match=r"pretrain.recipe: expected one of \['uniter', 'project'\]"):
        load_params(overrides=["pretrain.recipe=paper"], check_paths=False)
