"""pretrain.deepspeed / finetune.deepspeed: a mapping or a JSON file below deploy/deepspeed/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipeline.params import deepspeed as ds
from pipeline.params.parser import ParamsError, load_params

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / ds.CONFIG_DIR).glob("*.json"))


def _load(*overrides: str):
    return load_params(REPO / "params.yaml", list(overrides))


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """cwd = a folder with deploy/deepspeed/ (the params' relative paths resolve against the cwd)."""
    (tmp_path / ds.CONFIG_DIR).mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path / ds.CONFIG_DIR


def test_the_example_files_are_accepted_by_both_stages_and_merged_by_the_engine(monkeypatch):
    import torch

    from pipeline.training.engine import EngineSettings, deepspeed_config

    assert {p.name for p in EXAMPLES} >= {"flops_profiler.json", "gpu_bf16.json"}
    monkeypatch.chdir(REPO)
    for path in EXAMPLES:
        rel = path.relative_to(REPO).as_posix()
        params = _load(f"pretrain.deepspeed={rel}", f"finetune.deepspeed={rel}")
        assert params.pretrain.deepspeed == Path(rel) and params.finetune.deepspeed == Path(rel)
        extra = ds.resolve(params.finetune.deepspeed)
        assert extra == json.loads(path.read_text())
        cfg = deepspeed_config(EngineSettings(
            device=torch.device("cpu"), precision="bf16", world_size=1, zero_stage=0, grad_accum=1, grad_clip=2.0,
            lr=1e-4, betas=(0.9, 0.98), weight_decay=0.01, warmup_steps=1, total_steps=2, extra=extra))
        for section, value in extra.items():  # merged over the generated config, the stage's keys kept
            assert cfg[section] == ({**value, "enabled": True} if section == "bf16" else value)
        assert cfg["gradient_clipping"] == 2.0 and cfg["train_micro_batch_size_per_gpu"] == 1


def test_a_mapping_still_works_and_the_default_is_empty():
    params = _load("finetune.deepspeed={flops_profiler: {enabled: true}}")
    assert ds.resolve(params.finetune.deepspeed) == {"flops_profiler": {"enabled": True}}
    assert ds.resolve(_load().finetune.deepspeed) == {} == ds.resolve(_load().pretrain.deepspeed)


def test_a_file_with_keys_the_stage_owns_is_refused_naming_the_file_and_every_key(in_tmp):
    (in_tmp / "bad.json").write_text(json.dumps({"train_batch_size": 8, "optimizer": {"type": "Adam"},
                                                "bf16": {"enabled": True}, "flops_profiler": {"enabled": True}}))
    with pytest.raises(ParamsError) as err:
        _load("finetune.deepspeed=deploy/deepspeed/bad.json")
    text = str(err.value)
    assert "finetune.deepspeed: deploy/deepspeed/bad.json:" in text
    for key, owner in (("train_batch_size", "finetune.per_task.<task>.batch_tokens"),
                       ("optimizer", "finetune.betas"), ("bf16.enabled", "finetune.precision")):
        assert f"{key} is set by" in text and owner in text, text
    with pytest.raises(ParamsError, match="gradient_clipping is set by pretrain.optim.grad_clip"):
        (in_tmp / "clip.json").write_text('{"gradient_clipping": 1.0}')
        _load("pretrain.deepspeed=deploy/deepspeed/clip.json")


def test_files_that_are_not_a_json_object_or_lie_elsewhere_are_refused(in_tmp, tmp_path):
    (in_tmp / "broken.json").write_text('{"flops_profiler": {"enabled": true,}}')
    with pytest.raises(ParamsError, match=r"pretrain.deepspeed: deploy/deepspeed/broken.json:1:\d+: not JSON"):
        _load("pretrain.deepspeed=deploy/deepspeed/broken.json")
    (in_tmp / "list.json").write_text("[1, 2]")
    with pytest.raises(ParamsError, match="list.json: expected a JSON object"):
        _load("pretrain.deepspeed=deploy/deepspeed/list.json")
    (tmp_path / "elsewhere.json").write_text("{}")
    with pytest.raises(ParamsError, match="must be a .json below deploy/deepspeed/"):
        _load("pretrain.deepspeed=elsewhere.json")
    with pytest.raises(ParamsError, match="finetune.deepspeed: path does not exist: deploy/deepspeed/missing.json"):
        _load("finetune.deepspeed=deploy/deepspeed/missing.json")
    with pytest.raises(ParamsError, match="pretrain.deepspeed: expected"):
        _load("pretrain.deepspeed=[1, 2]")


def test_dvc_yaml_tracks_the_config_folder_in_every_training_stage():
    """A file named by the deepspeed keys lies in a folder every training stage depends on."""
    graphs = {"dvc.yaml": ("pretrain", "pretrain_vcr", "finetune"), "ablations/dvc.yaml": ("pretrain_masking",)}
    for dvcfile, names in graphs.items():
        stages = yaml.safe_load((REPO / dvcfile).read_text())["stages"]
        for name in names:
            stage = stages[name].get("do", stages[name])
            assert str(ds.CONFIG_DIR) in stage["deps"], (dvcfile, name)
            section = "finetune" if name == "finetune" else "pretrain"
            assert f"{section}.deepspeed" in stage["params"], (dvcfile, name)
