"""params.yaml parsing is strict: unknown keys, wrong types and missing paths name the key."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.params.parser import FrozenDict, ParamsError, apply_override, load_params, load_raw, parse_params, to_dict

REPO = Path(__file__).resolve().parents[3]
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
    """to_dict(parse(raw)) == raw: nothing in params.yaml is ignored or defaulted away (its null
    keys are pretrain.recipe's: they come back as the recipe's values)."""
    from pipeline.params.pretrain import apply_recipe

    raw = load_raw(PARAMS)
    dumped = yaml.safe_load(yaml.safe_dump(to_dict(load_params(PARAMS))))
    assert dumped == yaml.safe_load(yaml.safe_dump(apply_recipe(raw)))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("pretrain.stpes=3", "unknown key pretrain.stpes (did you mean 'pretrain.steps'?)"),
        ("extract.train.lrr=0.1", "unknown key extract.train.lrr"),
        ("pretrain.steps=ten", "pretrain.steps: must be an integer in [0, 10000000], got 'ten'"),
        ("pretrain.steps=true", "pretrain.steps: must be an integer in [0, 10000000], got True"),
        ("pretrain.optim.betas=[0.9, true]", "pretrain.optim.betas[1]: expected a number, got True"),
        ("pretrain.masking=random", "pretrain.masking: expected one of ['conditional', 'joint']"),
        ("pretrain.optim.betas=[0.9]", "pretrain.optim.betas: expected 2 items"),
        ("ingest.datasets=coco", "ingest.datasets: expected a list"),
        ("finetune.per_task.vqa.stepz=1", "unknown key finetune.per_task.vqa.stepz"),
        ("world=moon", "world: expected one of ['mini', 'real']"),
        ("pretrain.steps=50", "pretrain.first_phase_steps: 100 is more than pretrain.steps (50)"),
        ("pretrain.first_phase_steps=-1", "pretrain.first_phase_steps: must be an integer in [0, 10000000], got -1"),
        ("pretrain.steps=0", "pretrain.steps: 0 (no training) needs model.uniter_checkpoint"),
        ("pretrain.mask_prob=2.0", "pretrain.mask_prob: must be a finite number in (0, 1), got 2.0"),
        ("pretrain.optim.lr=.nan", "pretrain.optim.lr: must be a finite number in (0, 1], got nan"),
        ("pretrain.mix_ratio={mlm: .inf}", "pretrain.mix_ratio.mlm: expected a finite number, got inf"),
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


# The list (and the names rule): each is refused by the parser, naming this key.
BAD = [
    (["seed=-1"], "seed"),
    (["seed=4294967296"], "seed"),
    (["pretrain.batch_tokens=0"], "pretrain.batch_tokens"),
    (["pretrain.world_size=0"], "pretrain.world_size"),
    (["pretrain.optim.lr=.nan"], "pretrain.optim.lr"),
    (["pretrain.optim.lr=.inf"], "pretrain.optim.lr"),
    (["pretrain.optim.lr=-1"], "pretrain.optim.lr"),
    (["pretrain.vcr.lr=0"], "pretrain.vcr.lr"),
    (["finetune.per_task.vqa.lr=-.inf"], "finetune.per_task.vqa.lr"),
    (["extract.train.lr=-1.0"], "extract.train.lr"),
    (["pretrain.mask_prob=2.0"], "pretrain.mask_prob"),
    (["pretrain.mix_ratio={}"], "pretrain.mix_ratio"),
    (["pretrain.mix_ratio={mlm: -1.0, itm: 2.0}"], "pretrain.mix_ratio"),
    (["pretrain.mix_ratio={mlm: 0.0}"], "pretrain.mix_ratio"),
    (["pretrain.mix_ratio={mlmm: 1.0}"], "pretrain.mix_ratio"),
    (["pretrain.mix_ratio={mlm: .nan}"], "pretrain.mix_ratio.mlm"),
    (["pretrain.vcr.mix_ratio={itm: 1.0}"], "pretrain.vcr.mix_ratio"),
    (["pretrain.first_phase_mix={}"], "pretrain.first_phase_mix"),
    (["pretrain.optim.grad_accum=0"], "pretrain.optim.grad_accum"),
    (["ingest.chunk_rows=0"], "ingest.chunk_rows"),
    (["extract.shard_size=0"], "extract.shard_size"),
    (["extract.batch_size=0"], "extract.batch_size"),
    (["mini_world.n_coco=-10"], "mini_world.n_coco"),
    (["mini_world.n_coco=1e12"], "mini_world.n_coco"),  # YAML 1.1: a string, not a number
    (["mini_world.n_coco=1000000000000"], "mini_world.n_coco"),
    (["decontaminate.phash_max_distance=-1"], "decontaminate.phash_max_distance"),
    (["decontaminate.phash_max_distance=64"], "decontaminate.phash_max_distance"),
    (["build_dbs.max_txt_len=0"], "build_dbs.max_txt_len"),
    (["extract.detector=butd_r101", "extract.weights=/nonexistent"], "extract.weights"),
    (["extract.detector=butd_r101"], "extract.weights"),  # weights: null has no butd_r101 file
    (["pretrain.steps=1e26"], "pretrain.steps"),
    (["pretrain.steps=100000000000000000000000000"], "pretrain.steps"),
    (["pretrain.first_phase_steps=0", "pretrain.steps=-5"], "pretrain.steps"),
    (["pretrain.zero_stage=3"], "pretrain.zero_stage"),
    (["finetune.zero_stage=4"], "finetune.zero_stage"),
    (["extract.conf_th=1.5"], "extract.conf_th"),
    (["extract.max_boxes=5"], "extract.max_boxes"),  # fewer than min_boxes (10)
    (["extract.proposals=9"], "extract.proposals"),  # fewer than min_boxes (10)
    (["extract.proposals=0"], "extract.proposals"),
    (["model.dropout=1.0"], "model.dropout"),
    (["pretrain.optim.betas=[0.9, 1.0]"], "pretrain.optim.betas"),
    (["finetune.retrieval_neg_pool=2"], "finetune.retrieval_neg_pool"),  # fewer than hard_negatives (3)
    (["finetune.tasks=[vqa, vqa2]"], "finetune.tasks"),
    (["pretrain.vcr.views=[qa, qra]"], "pretrain.vcr.views"),
    (["extract.sources=[coco, ../x]"], "extract.sources"),
    (["ingest.max_text_chars=0"], "ingest.max_text_chars"),
    (["pretrain.hostfile=/nonexistent/hostfile"], "pretrain.hostfile"),
    *[([f"pretrain.out_name={name}"], "pretrain.out_name")
      for name in ("/abs/dir", "../../x", "a/b", ".", "..", "''", "a b")],
]


def _names_key(message: str, key: str) -> bool:
    """True when ``message`` blames ``key`` itself (not a longer key that ends or starts with it)."""
    return re.search(rf"(^|[:;] ){re.escape(key)}: ", message.split(": ", 1)[1]) is not None


@pytest.mark.parametrize(("overrides", "key"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_out_of_range_values_are_refused_naming_the_key(overrides, key):
    with pytest.raises(ParamsError) as err:
        load_params(PARAMS, overrides)
    assert _names_key(str(err.value), key), str(err.value)


def test_a_bad_steps_is_blamed_on_steps_not_on_the_first_phase():
    with pytest.raises(ParamsError) as err:
        load_params(PARAMS, ["pretrain.first_phase_steps=0", "pretrain.steps=-5"])
    assert "pretrain.steps: must be an integer in [0, 10000000], got -5" in str(err.value)
    assert "first_phase_steps" not in str(err.value)


@pytest.mark.parametrize("name", ["pretrain", "my-run_2.v1", "..a", "a.."])
def test_names_that_are_one_path_component_are_accepted(name):
    assert load_params(PARAMS, [f"pretrain.out_name={name}"]).pretrain.out_name == name


def test_the_name_pattern_is_exported_for_the_dag():
    from pipeline.params.checks import NAME_PATTERN, name_problem

    assert re.fullmatch(NAME_PATTERN, "run-1.a_b") and not re.fullmatch(NAME_PATTERN, "a/b")
    assert name_problem("ok") is None and NAME_PATTERN in name_problem("..")


def test_paths_that_are_paths_may_point_anywhere(tmp_path):
    weights = tmp_path / "butd.pkl"
    weights.write_bytes(b"")
    params = load_params(PARAMS, [f"paths.data={tmp_path}/../data", "mini_world.out_dir=/tmp/mini",
                                  "extract.detector=butd_r101", f"extract.weights={weights}"])
    assert params.extract.weights == weights


def test_the_task_lists_match_the_modules_that_use_them():
    """The model keeps its own copy of the pretraining task names (it imports nothing of pipeline/, and
    the config must not import torch): they agree."""
    from model.pretraining import PRETRAIN_TASKS
    from pipeline.params import pretrain as cfg
    from pipeline.finetune.tasks import TASK_CLASSES

    assert cfg.FIRST_STAGE_TASKS == PRETRAIN_TASKS
    assert set(cfg.VCR_TASKS) < set(PRETRAIN_TASKS)
    from pipeline.params.finetune import TASKS

    assert set(TASKS) == set(TASK_CLASSES)


def test_cli_out_of_range_value_exits_2_before_any_work(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pipeline", "pretrain", "--set", "pretrain.steps=0",
                          "--set", f"paths.data={tmp_path}/data"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert "pretrain.steps: 0 (no training) needs model.uniter_checkpoint" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "data").exists()


# --------------------------------------------------------------------------------------------
# `world: real` checks only the sources the configured stages read

PARTIAL = ("coco", "vg", "cc", "sbu")  # a user who downloaded the pretraining data only


def _real_world(tmp_path: Path, present=PARTIAL, **sections) -> dict:
    """params.yaml as `world: real` with every source under ``tmp_path``; only ``present`` datasets' files exist.

    ``sections`` replace keys of top-level sections (``ingest={"datasets": [...]}``).
    """
    raw = load_raw(PARAMS)
    raw["world"] = "real"
    for dataset, keys in raw["sources"].items():
        if dataset == "download":  # how download@ runs img2dataset: no paths to provide
            continue
        for key in [k for k in keys if k not in ("variant", "image_layout")]:
            path = tmp_path / dataset / key
            keys[key] = str(path)
            if dataset in present:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.mkdir() if key == "image_root" else path.write_text("")
    for section, values in sections.items():
        raw[section].update(values)
    return raw


PRETRAIN_ONLY = dict(ingest={"datasets": list(PARTIAL)}, extract={"sources": list(PARTIAL)},
                     decontaminate={"eval_splits": {"coco": ["test"]}}, finetune={"tasks": []})


def test_a_real_world_with_only_the_pretraining_sources_parses(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="pipeline.params.parser"):
        params = parse_params(_real_world(tmp_path, **PRETRAIN_ONLY))
    assert params.ingest.datasets == PARTIAL and params.finetune.tasks == ()
    assert not caplog.records  # with no fine-tuning task, nothing the configured stages read is missing


def test_a_missing_source_names_the_stage_that_reads_it(tmp_path):
    ingest = {"datasets": [*PARTIAL, "vqa"]}
    with pytest.raises(ParamsError) as err:
        parse_params(_real_world(tmp_path, **{**PRETRAIN_ONLY, "ingest": ingest}))
    message = str(err.value)
    assert f"sources.vqa.questions_train: path does not exist: {tmp_path}/vqa/questions_train (needed by ingest@vqa)" \
        in message
    assert "sources.vcr" not in message and "sources.flickr30k" not in message  # not read by any configured stage


def test_shared_image_roots_are_needed_by_the_datasets_that_borrow_them(tmp_path):
    raw = _real_world(tmp_path, present=(*PARTIAL, "snli_ve"), **PRETRAIN_ONLY)
    raw["ingest"]["datasets"] = [*PARTIAL, "snli_ve"]
    with pytest.raises(ParamsError, match=r"sources\.flickr30k\.image_root: path does not exist: .* "
                                          r"\(needed by ingest@snli_ve\)") as err:
        parse_params(raw)
    assert "sources.flickr30k.karpathy" not in str(err.value)  # ingest@snli_ve reads Flickr30k's images only


def test_eval_and_extract_image_roots_are_checked_for_their_stages(tmp_path):
    # default eval_splits and extract.sources
    raw = _real_world(tmp_path, ingest={"datasets": list(PARTIAL)}, finetune={"tasks": []})
    with pytest.raises(ParamsError) as err:
        parse_params(raw)
    message = str(err.value)
    assert "sources.flickr30k.image_root: path does not exist" in message
    assert "(needed by decontaminate, extract@flickr30k)" in message
    assert "sources.vcr.image_root" in message and "sources.vcr.train" not in message
    # without the pHash search decontamination reads no images; extract still reads its sources'
    raw["decontaminate"]["near_duplicates"] = False
    with pytest.raises(ParamsError) as err:
        parse_params(raw)
    assert "(needed by extract@flickr30k)" in str(err.value) and "decontaminate" not in str(err.value)


def test_the_mini_world_checks_no_sources_and_warns_about_nothing(caplog):
    with caplog.at_level("WARNING", logger="pipeline.params.parser"):
        load_params(PARAMS, ["sources.vqa.questions_train=/nope.json"])
    assert not caplog.records


def test_a_source_key_another_stage_reads_names_that_stage(tmp_path):
    raw = _real_world(tmp_path, **PRETRAIN_ONLY)
    raw["sources"]["coco"]["image_info_test"] = str(tmp_path / "nope.json")
    with pytest.raises(ParamsError, match=r"sources\.coco\.image_info_test: path does not exist: .*nope\.json "
                                          r"\(needed by decontaminate\)"):
        parse_params(raw)
    raw["sources"]["coco"]["image_info_test"] = None  # null: decontamination does without it
    assert parse_params(raw).sources.coco.image_info_test is None


def test_a_scored_split_decontamination_cannot_see_is_refused_naming_task_and_split(tmp_path):
    raw = _real_world(tmp_path, **(PRETRAIN_ONLY | {"finetune": {"tasks": ["vqa", "nlvr2"]}}))
    raw["ingest"]["datasets"].append("nlvr2")
    with pytest.raises(ParamsError) as err:
        parse_params(raw)
    message = str(err.value)
    assert ("finetune.tasks: vqa scores vqa val/test: not in ingest.datasets, so decontaminate cannot remove "
            "those images from pretraining (ingest ['vqa'] or drop ['vqa'] from finetune.tasks)") in message
    assert "nlvr2" not in message  # ingested: decontamination removes its dev and test images


def test_eval_splits_are_the_configured_ones_plus_every_scored_split():
    params = load_params(PARAMS)
    splits = params.eval_splits()
    assert splits["vqa"] == ("test", "val") and splits["coco"] == ("test",)
    assert set(splits["refcoco"]) == {"val", "testA", "testB", "test"}
    assert params.eval_split_origins()["flickr30k"]["val"] == ["decontaminate.eval_splits", "finetune retrieval_flickr dev"]
    kept = load_params(PARAMS, ["decontaminate.keep_dev_in_pretraining=[vqa]", "finetune.tasks=[vqa]",
                                "decontaminate.eval_splits={}"])
    assert kept.eval_splits() == {"vqa": ("test",)}  # the dev split stays; the test split never does
    with pytest.raises(ParamsError, match=r"decontaminate\.keep_dev_in_pretraining: \['vqaa'\] not allowed"):
        load_params(PARAMS, ["decontaminate.keep_dev_in_pretraining=[vqaa]"])
