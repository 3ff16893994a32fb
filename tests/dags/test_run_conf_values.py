"""Values of a trigger conf reach the run's params as the numbers they are: JSON writes small
floats without a dot (``5e-05``), which YAML 1.1 reads as a string."""

from __future__ import annotations

from pathlib import Path

import _uniter_runs as runs  # tests/dags/conftest.py puts dags/ on sys.path

REPO = Path(__file__).resolve().parents[2]


def test_small_floats_of_a_conf_stay_floats(tmp_path):
    from pipeline.params.parser import load_params

    root = tmp_path / "repo"
    root.mkdir()
    (root / "params.yaml").write_text((REPO / "params.yaml").read_text())
    conf = {"run_name": "floats", "task_mix": {"mlm": 1.0, "itm": 5e-05},
            "overrides": {"pretrain.optim.lr": 5e-05, "pretrain.optim.weight_decay": 1e-3}}
    run = runs.prepare_run(conf, "manual__x", repo_root=root)
    params = load_params(root / run["params"], check_paths=False)
    assert params.pretrain.optim.lr == 5e-05 and params.pretrain.optim.weight_decay == 1e-3
    assert dict(params.pretrain.mix_ratio) == {"mlm": 1.0, "itm": 5e-05}


def test_the_cli_reads_a_float_without_a_dot():
    from pipeline.params.parser import load_params

    params = load_params(REPO / "params.yaml", ["pretrain.optim.lr=5e-05", "pretrain.optim.weight_decay=1E-2"],
                         check_paths=False)
    assert (params.pretrain.optim.lr, params.pretrain.optim.weight_decay) == (5e-05, 0.01)


def test_an_unknown_conf_key_is_refused_naming_it(tmp_path):
    import pytest

    root = tmp_path / "repo"
    root.mkdir()
    (root / "params.yaml").write_text((REPO / "params.yaml").read_text())
    with pytest.raises(ValueError, match=r"conf key\(s\) \['pretrain_stepz'\] unknown"):
        runs.prepare_run({"run_name": "typo", "pretrain_stepz": 3}, "manual__x", repo_root=root)
    assert not (root / "runs" / "typo").exists()


def test_more_extract_parts_than_airflow_can_map_are_refused_before_any_work(tmp_path, monkeypatch):
    import pytest

    monkeypatch.delenv("AIRFLOW__CORE__MAX_MAP_LENGTH", raising=False)
    root = tmp_path / "repo"
    root.mkdir()
    (root / "params.yaml").write_text((REPO / "params.yaml").read_text())
    with pytest.raises(ValueError, match=r"extract.parts: 4096 parts x 7 image sources = 28672 mapped extract "
                                         r"tasks, over Airflow's max_map_length 1024; use at most 146 parts"):
        runs.prepare_run({"run_name": "wide", "overrides": {"extract.parts": 4096}}, "manual__x", repo_root=root)
    assert not (root / "runs" / "wide").exists()
    runs.prepare_run({"run_name": "ok", "overrides": {"extract.parts": 146}}, "manual__y", repo_root=root)


def test_a_deepspeed_output_path_outside_the_run_is_refused(tmp_path):
    import pytest

    root = tmp_path / "repo"
    root.mkdir()
    (root / "params.yaml").write_text((REPO / "params.yaml").read_text())
    for path in ("/tmp/elsewhere", "logs", "runs/mon/../../escape"):
        conf = {"run_name": "mon", "overrides": {"pretrain.deepspeed": {"csv_monitor": {"enabled": True,
                                                                                     "output_path": path}}}}
        with pytest.raises(ValueError, match="pretrain.deepspeed.csv_monitor.output_path: .* is outside the run"):
            runs.prepare_run(conf, "manual__x", repo_root=root)
    inside = {"run_name": "mon", "overrides": {"pretrain.deepspeed": {"csv_monitor": {
        "enabled": True, "output_path": "runs/mon/data/metrics/ds"}}}}
    runs.prepare_run(inside, "manual__x", repo_root=root)


def test_moving_the_mini_world_out_of_the_run_is_refused(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="overrides.mini_world.out_dir: a run's mini world lives in"):
        runs.conf_to_overrides({"overrides": {"mini_world.out_dir": "elsewhere/mini"}})
    with pytest.raises(ValueError, match="overrides.mini_world: a run.s mini world lives in"):
        runs.conf_to_overrides({"overrides": {"mini_world": {"out_dir": "elsewhere/mini"}}})
