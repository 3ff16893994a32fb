"""The ``uniter_pretraining`` DAG: it imports, its tasks and mapping are wired as docs/design.md §2
says, its Params refuse bad confs, and a conf becomes a run directory whose params drive a real
stage. The scheduler-driven run is in test_airflow_scheduler.py."""

from __future__ import annotations

import copy
import json
import os
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

import _uniter_runs as runs  # tests/dags/conftest.py puts dags/ on sys.path

REPO = Path(__file__).resolve().parents[2]
TINY = yaml.safe_load((REPO / "tests/e2e/tiny_overrides.yaml").read_text())
CHAIN = ["prepare", "mini_world", "ingest", "decontaminate", "extract", "merge_features", "build_dbs", "pretrain",
         "pretrain_vcr", "finetune", "results", "record"]
GPU_TASKS = {"train_detector", "extract", "pretrain", "pretrain_masking", "pretrain_vcr", "finetune"}
MAPPED = {"ingest": "dataset", "extract": "image_source", "finetune": "finetune_task"}


@cache
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def the_dag():
    return dagbag().dags["uniter_pretraining"]


def test_dag_folder_imports_cleanly_and_holds_only_the_dag():
    bag = dagbag()
    assert bag.import_errors == {}
    assert set(bag.dags) == {"uniter_pretraining"}
    # the helper is not a DAG file: .airflowignore keeps the dag-processor from parsing it
    assert [Path(f).name for f in bag.file_last_changed] == ["uniter_pretraining.py"]


def test_tasks_run_in_stage_order():
    dag = the_dag()
    assert set(dag.task_ids) == set(CHAIN) | {"train_detector", "pretrain_masking", "ablations", "plots",
                                              "datasets", "image_sources", "extract_items", "tasks"}
    for before, after in zip(CHAIN, CHAIN[1:]):
        assert before in dag.get_task(after).get_flat_relative_ids(upstream=True), f"{before} must precede {after}"
    extract_upstream = dag.get_task("extract").get_flat_relative_ids(upstream=True)
    assert {"train_detector", "image_sources"} <= extract_upstream
    assert "mini_world" in dag.get_task("train_detector").upstream_task_ids
    # plots draws every training run's curves: it waits for the masking ablation's too, so what it
    # draws does not depend on the order the executor ran the tasks in
    assert dag.get_task("plots").upstream_task_ids == {"prepare", "finetune", "pretrain_masking"}
    assert "plots" in dag.get_task("record").upstream_task_ids
    # the masking ablation needs only the stores; its table needs both first stages, and the
    # results table does not wait for it
    assert dag.get_task("pretrain_masking").upstream_task_ids == {"prepare", "build_dbs"}
    assert dag.get_task("ablations").upstream_task_ids == {"prepare", "pretrain", "pretrain_masking"}
    assert "pretrain_masking" not in dag.get_task("results").get_flat_relative_ids(upstream=True)
    assert "ablations" in dag.get_task("record").upstream_task_ids


def test_stages_map_over_datasets_sources_and_tasks():
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    dag = the_dag()
    for task_id, arg in MAPPED.items():
        task = dag.get_task(task_id)
        assert isinstance(task, MappedOperator), f"{task_id} is not mapped"
        assert set(task._get_specified_expand_input().value) == {arg}
    unmapped = set(dag.task_ids) - set(MAPPED)
    assert not any(isinstance(dag.get_task(t), MappedOperator) for t in unmapped)


def test_extraction_and_training_use_the_gpu_pool_and_retry():
    dag = the_dag()
    for task in dag.tasks:
        assert task.pool == ("gpu" if task.task_id in GPU_TASKS else "default_pool"), task.task_id
        # every stage task retries (stages are idempotent); a conf error does not
        assert task.retries == (0 if task.task_id == "prepare" else 2), task.task_id


def test_gpu_tasks_take_a_slot_per_gpu_and_run_on_allocated_devices(tmp_path):
    """pool_slots: the GPUs a stage uses with params.yaml's values, capped at the pool's size; at run
    time each GPU task holds that many devices of its own (a run's conf may ask for more)."""
    dag = the_dag()
    gpus = runs.gpus_per_stage(runs.parse_repo_params())
    assert set(gpus) == GPU_TASKS
    for task_id in GPU_TASKS:
        assert dag.get_task(task_id).pool_slots == max(1, min(gpus[task_id], int(os.environ.get(
            "AIRFLOW_GPU_SLOTS", "1")))), task_id
    run = runs.prepare_run({"run_name": "g", "overrides": {"pretrain.world_size": 2, "extract.workers": 3}}, "m",
                           repo_root=make_repo(tmp_path))
    assert run["gpus"] == {"train_detector": 1, "extract": 3, "pretrain": 2, "pretrain_masking": 2,
                           "pretrain_vcr": 2, "finetune": 1}


def test_extraction_maps_over_each_source_s_parts_and_merges_before_build_dbs(tmp_path, monkeypatch):
    """``extract.parts`` = K (a conf override) makes K extract tasks per source (docs/scaling.md) and
    ``merge_features`` then runs the merge (``extract`` without ITEM); K = 1 maps over the sources."""
    monkeypatch.setenv(runs.RUNS_DIR_ENV, str(tmp_path / "runs"))
    dag = the_dag()
    assert dag.get_task("extract_items").upstream_task_ids == {"prepare", "image_sources"}
    assert dag.get_task("merge_features").upstream_task_ids == {"prepare", "extract"}
    items = dag.get_task("extract_items").python_callable
    merge = dag.get_task("merge_features").python_callable
    root = make_repo(tmp_path)
    one = runs.prepare_run({"run_name": "k1"}, "m", repo_root=root)
    three = runs.prepare_run({"run_name": "k3", "overrides": {"extract.parts": 3}}, "m", repo_root=root)
    assert items(one, ["coco", "cc"]) == ["coco", "cc"]
    assert items(three, ["coco", "cc"]) == ["coco:1/3", "coco:2/3", "coco:3/3", "cc:1/3", "cc:2/3", "cc:3/3"]
    calls = []
    monkeypatch.setattr(runs, "run_stage", lambda stage, item, params, **kw: calls.append((stage, item, params)))
    merge(one)
    assert calls == []
    merge(three)
    assert calls == [("extract", None, three["params"])]


def test_param_defaults_are_params_yaml_and_validate():
    dag = the_dag()
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    values = dag.params.validate()
    assert values["seed"] == raw["seed"]
    assert values["model_preset"] == raw["model"]["preset"]
    assert values["task_mix"] == raw["pretrain"]["mix_ratio"]
    assert values["finetune_tasks"] == raw["finetune"]["tasks"]


@pytest.mark.parametrize("conf", [
    {"model_preset": "huge"},
    {"task_mix": {"mlm": -1.0}},
    {"task_mix": {"mlm": 1.0, "vqa": 1.0}},
    {"pretrain_data": "everything"},
    {"masking": "random"},
    {"pretrain_steps": 0},
    {"seed": "one"},
    {"run_name": "../escape"},
    {"run_name": "has space"},
    {"finetune_tasks": ["vqa", "coco_captioning"]},
    {"finetune_tasks": []},
    {"overrides": {"Not A Key": 1}},
    {"overrides": {"paths.data": "/some/absolute/dir"}},
    {"overrides": {"paths.runs": ".."}},
    {"overrides": {"paths": {"data": "/elsewhere"}}},
])
def test_params_schema_rejects_a_bad_conf(conf):
    from airflow.sdk.exceptions import ParamValidationError

    params = copy.deepcopy(the_dag().params)
    with pytest.raises(ParamValidationError):
        for key, value in conf.items():
            params[key] = value
        params.validate()


def test_a_good_conf_validates():
    params = copy.deepcopy(the_dag().params)
    for key, value in {"run_name": "abl-joint_1", "masking": "joint", "model_preset": "tiny", "seed": 7,
                       "task_mix": {"mlm": 1.0, "itm": 1.0}, "finetune_tasks": ["vqa"], "finetune_steps": 5,
                       "overrides": TINY}.items():
        params[key] = value
    assert params.validate()["overrides"] == TINY


# ---------------------------------------------------------------------------------------------
# conf -> run directory -> stage


def make_repo(tmp_path: Path) -> Path:
    """A repo root holding only params.yaml, with runs/ below it (prepare_run writes nothing else)."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "params.yaml").write_text((REPO / "params.yaml").read_text())
    return root


def test_conf_becomes_the_run_params_with_every_artifact_inside_the_run(tmp_path):
    from pipeline.params.parser import load_params

    root = make_repo(tmp_path)
    conf = {"run_name": "r1", "masking": "joint", "seed": 9, "model_preset": "tiny", "task_mix": {"mlm": 1.0},
            "finetune_tasks": ["vqa", "vcr"], "finetune_steps": 4, "overrides": {"pretrain.steps": 3}}
    run = runs.prepare_run(conf, "manual__x", repo_root=root)
    assert run["run_dir"] == "runs/r1" and run["params"] == "runs/r1/params.yaml"
    assert run["tasks"] == ["vqa", "vcr"] and run["world"] == "mini" and run["detector"] == "mini"
    params = load_params(root / run["params"], check_paths=False)
    assert params.pretrain.masking == "joint" and params.seed == 9 and params.model.preset == "tiny"
    assert dict(params.pretrain.mix_ratio) == {"mlm": 1.0} and params.pretrain.steps == 3
    assert params.finetune.per_task["vqa"].steps == 4 and params.finetune.per_task["vcr"].steps == 4
    default_nlvr2 = yaml.safe_load((REPO / "params.yaml").read_text())["finetune"]["per_task"]["nlvr2"]["steps"]
    assert params.finetune.per_task["nlvr2"].steps == default_nlvr2 != 4  # not a chosen task: untouched
    assert str(params.paths.data) == "runs/r1/data"
    assert str(params.mini_world.out_dir) == "runs/r1/data/raw/mini"
    assert str(params.sources.coco.karpathy) == "runs/r1/data/raw/mini/coco/karpathy/dataset_coco.json"
    assert str(params.sources.refcoco.refs) == "runs/r1/data/raw/mini/refcoco+/refs(unc).p"
    assert json.loads((root / "runs/r1/conf.json").read_text()) == conf
    # a retry of `prepare` with the same conf is a no-op; another conf under the same name is refused
    assert runs.prepare_run(conf, "manual__x", repo_root=root) == run
    with pytest.raises(runs.RunConflict):
        runs.prepare_run({**conf, "seed": 10}, "manual__x", repo_root=root)


def test_real_world_sources_stay_where_they_are():
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["world"] = "real"
    raw["sources"]["cc"]["train_tsv"] = "/datasets/cc/Train_GCC-training.tsv"
    raw["sources"]["coco"]["karpathy"] = "/datasets/karpathy/dataset_coco.json"
    runs.relocate(raw, "runs/r2/data")
    assert raw["paths"]["data"] == "runs/r2/data"
    assert raw["sources"]["cc"]["train_tsv"] == "/datasets/cc/Train_GCC-training.tsv"
    assert raw["sources"]["coco"]["karpathy"] == "/datasets/karpathy/dataset_coco.json"
    # the mini world (what the mini detector trains on) is still generated inside the run
    assert raw["mini_world"]["out_dir"] == "runs/r2/data/raw/mini"


@pytest.mark.parametrize("key", ["paths.data", "paths.runs"])
def test_an_override_may_not_move_the_run_out_of_its_directory(tmp_path, key):
    """The conf schema refuses these keys (above); prepare refuses them too, before writing anything."""
    root = make_repo(tmp_path)
    with pytest.raises(ValueError, match=f"overrides.{key}: a run's paths are fixed"):
        runs.prepare_run({"run_name": "r4", "overrides": {key: ".."}}, "m", repo_root=root)
    assert not (root / "runs").exists() and not (tmp_path / "r4").exists()


def test_the_deployment_chooses_where_runs_live(tmp_path, monkeypatch):
    monkeypatch.setenv(runs.RUNS_DIR_ENV, str(tmp_path / "elsewhere"))
    run = runs.prepare_run({"run_name": "r5"}, "m", repo_root=make_repo(tmp_path))
    assert run["run_dir"] == f"{tmp_path}/elsewhere/r5" and (tmp_path / "elsewhere/r5/params.yaml").is_file()


def test_run_name_defaults_to_the_airflow_run_id():
    assert runs.run_name_for({}, "manual__2026-01-02T03:04:05+00:00") == "manual__2026-01-02T03-04-05-00-00"
    assert runs.run_name_for({"run_name": "mine"}, "manual__x") == "mine"


def test_a_misspelled_override_fails_in_prepare_naming_the_key(tmp_path):
    from pipeline.params.parser import ParamsError

    with pytest.raises(ParamsError, match="pretrain.stepz"):
        runs.prepare_run({"run_name": "bad", "overrides": {"pretrain.stepz": 3}}, "m", repo_root=make_repo(tmp_path))


@pytest.mark.parametrize("stage, item", [("extract", "coco"), ("build_dbs", None), ("plots", None)])
def test_a_task_runs_the_same_stage_command_as_dvc(stage, item):
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][stage]
    dvc_cmd = (dvc["do"]["cmd"] if "do" in dvc else dvc["cmd"]).replace("${key}", str(item))
    cmd = runs.stage_command(stage, item, "runs/r/params.yaml")
    assert cmd[0] == sys.executable
    assert " ".join(["python", *cmd[1:]]) == dvc_cmd + " --params runs/r/params.yaml"


@pytest.mark.stage  # runs the mini_world stage
def test_run_stage_streams_a_real_stage_and_records_its_outputs(tmp_path, monkeypatch):
    """The mini_world stage through the task helper, in a tiny run dir: its log lines reach the task
    log, the world lands inside the run, and outputs.json holds its digest."""
    from pipeline.common.runinfo import tree_digest

    root = make_repo(tmp_path)
    runs_dir = tmp_path / "runs"
    monkeypatch.setenv(runs.RUNS_DIR_ENV, str(runs_dir))
    run = runs.prepare_run({"run_name": "tiny", "overrides": TINY}, "m", repo_root=root)
    lines: list[str] = []
    runs.run_stage("mini_world", None, str(runs_dir / "tiny/params.yaml"), emit=lines.append)
    assert lines[0].startswith("$ ") and any("mini_world finished" in line for line in lines)
    world = runs_dir / "tiny/data/raw/mini"
    assert (world / "planted.json").is_file()
    record = runs.record_outputs(run, repo_root=root)
    assert record["outputs"] == {"data/raw/mini": tree_digest(world)}
    assert json.loads((runs_dir / "tiny/outputs.json").read_text()) == record


def test_a_failing_stage_fails_the_task_with_its_last_lines(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text((REPO / "params.yaml").read_text() + "\nunknown_section: 1\n")
    with pytest.raises(runs.StageFailed, match="unknown_section"):
        runs.run_stage("mini_world", None, str(bad), emit=lambda line: None)


def _trigger(tmp_path, *args: str):
    """``scripts/airflow_local.sh trigger ARGS`` with AIRFLOW_LOCAL_DRY_RUN=1: prints the run id, triggers nothing."""
    import os
    import subprocess

    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW_LOCAL_DRY_RUN": "1"}
    return subprocess.run(["bash", str(REPO / "scripts/airflow_local.sh"), "trigger", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_trigger_uses_the_run_name_as_the_run_id_so_wait_finds_it(tmp_path):
    out = _trigger(tmp_path, '{"run_name": "small", "masking": "joint"}')
    assert out.returncode == 0, out.stderr
    assert out.stdout == "small\n"  # what `scripts/airflow_local.sh wait small` looks for
    assert out.stderr.strip().endswith("--run-id small")
    explicit = _trigger(tmp_path, '{"run_name": "small"}', "small-retry")  # an explicit RUN_ID wins
    assert explicit.stdout == "small-retry\n", explicit.stderr
    for conf in ("", "{}", '{"run_name": null}'):  # no run_name: Airflow's manual__ id, the DAG names the run after it
        run_id = _trigger(tmp_path, conf).stdout.strip()
        assert run_id.startswith("manual__") and runs.run_name_for({}, run_id) == run_id


def test_trigger_refuses_a_conf_that_is_not_a_json_object(tmp_path):
    for conf, message in (("{bad", "CONF is not JSON"), ("[1]", "CONF must be a JSON object")):
        out = _trigger(tmp_path, conf)
        assert out.returncode == 2 and message in out.stderr and not out.stdout


# ---------------------------------------------------------------------------------------------
# the example confs in deploy/airflow/ (the docs trigger with them)

CONFS = REPO / "deploy/airflow"


def test_the_example_confs_validate_and_tiny_is_the_tests_world():
    confs = {p.stem: json.loads(p.read_text()) for p in sorted(CONFS.glob("*.json"))}
    assert set(confs) == {"tiny", "full", "joint"}
    for name, conf in confs.items():
        params = copy.deepcopy(the_dag().params)
        for key, value in conf.items():
            params[key] = value
        assert params.validate()["run_name"] == name
    assert confs["tiny"]["overrides"] == TINY  # the world the e2e and scheduler tests run
    assert confs["joint"]["masking"] == "joint" != yaml.safe_load((REPO / "params.yaml").read_text())["pretrain"]["masking"]
    assert confs["full"] == {"run_name": "full"}  # params.yaml as it is


def test_trigger_reads_a_conf_file():
    import tempfile

    with tempfile.TemporaryDirectory() as home:
        out = _trigger(Path(home), "deploy/airflow/joint.json")
    assert out.returncode == 0 and out.stdout == "joint\n", out.stderr
    assert '"masking": "joint"' in out.stderr  # the file's JSON went to `airflow dags trigger --conf`


def test_the_dag_logs_under_its_own_name():
    """Airflow imports the DAG file as unusual_prefix_<hash>_uniter_pretraining: the logger's name
    must not come from the module name."""
    the_dag()
    module = next(m for m in list(sys.modules.values())
                  if getattr(m, "__file__", None) == str(REPO / "dags/uniter_pretraining.py") and hasattr(m, "log"))
    assert module.__name__ != "uniter_pretraining"  # loaded as Airflow loads it
    assert module.log.name == "uniter_pretraining" == module.DAG_ID
