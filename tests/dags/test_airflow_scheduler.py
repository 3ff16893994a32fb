"""Real Airflow 3 runs of the DAG on the tiny world, both stacks of scripts/airflow_local.sh started
exactly as `make airflow` and `make airflow AIRFLOW_STACK=celery` start them, each from its own
fresh checkout of the repository (what `git clone` gives):

- local: SQLite + LocalExecutor (the embedded default);
- celery: PostgreSQL + CeleryExecutor + Redis broker with two Celery workers (deploy/airflow.env, the
  settings docker-compose.yml reads), a fake count of 2 GPUs shared by both workers; while a mapped
  ``extract`` runs, its worker's process group is killed with SIGKILL.

Both runs get the same conf and run at the same time, each in its checkout's ``runs/`` (params.yaml's
relative ``paths.runs``, so both record the same paths); the Celery run's outputs must be
byte-identical to the local run's: neither the executor, a killed worker nor where the project
lives changes a byte.
The Celery tests are skipped, naming the service, where PostgreSQL or Redis is missing. Always stops
the processes it started and drops the database it created."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

sys.path.append(str(Path(__file__).resolve().parents[1] / "e2e"))
# one definition of "byte-identical" and of a fresh checkout (and its environment) for both
from test_dvc_repro import content_digest, fresh_copy, stage_env  # noqa: E402

from airflow_stacks import (REPO, Stack, drop_database, kill_worker_during, make_stack, missing_service, task_log,
                            wait_for_retry)
from pipeline.common import gpu_alloc
from pipeline.stages import STAGES

TINY = yaml.safe_load((REPO / "tests/e2e/tiny_overrides.yaml").read_text())
CONF = {"run_name": "tiny", "seed": 1234, "overrides": TINY}  # run dir: runs/tiny in each stack's checkout
RUN_ID = "tiny-run"
RUN_TIMEOUT_S = 45 * 60
FAKE_GPUS = 2
RETRY_DELAY_S = 3
# where .ci/run collects which stacks ran (unset: nowhere)
STACKS_REPORT_ENV = "UNITER_AIRFLOW_STACKS_REPORT"

MISSING = sorted({s.entry.split(":")[0] for s in STAGES.values() if importlib.util.find_spec(s.entry.split(":")[0]) is None})
pytestmark = [
    pytest.mark.airflow,
    pytest.mark.timeout(RUN_TIMEOUT_S + 900),
    pytest.mark.skipif(bool(MISSING), reason=f"stage modules not written yet: {', '.join(MISSING)}"),
]


def dvc_outputs() -> list[str]:
    """Every output path dvc.yaml declares (relative to the data dir's parent), as DVC resolves them."""
    from dvc.repo import Repo

    with Repo(str(REPO)) as repo:
        return sorted(o.def_path for stage in repo.index.stages for o in stage.outs)


def report_stack(line: str) -> None:
    if os.environ.get(STACKS_REPORT_ENV):
        with open(os.environ[STACKS_REPORT_ENV], "a") as f:
            f.write(line + "\n")


def start(stack: Stack) -> None:
    started = stack.script("start", check=False)
    assert started.returncode == 0, f"{stack.name}: {started.stdout}{started.stderr}"


def run_on(stack: Stack) -> dict:
    """Trigger the tiny run (on Celery: kill the worker of a running mapped extract, and bring it
    back once its task runs elsewhere), wait for it, and collect Airflow's records of it."""
    t0 = time.monotonic()
    assert stack.script("trigger", json.dumps(CONF), RUN_ID).stdout.strip() == RUN_ID
    out = {}
    if stack.name == "celery":
        out["killed"] = kill_worker_during(stack, RUN_ID, "extract", settle_s=2, timeout_s=RUN_TIMEOUT_S)
        out["retry"] = wait_for_retry(stack, RUN_ID, out["killed"], timeout_s=600)
        start(stack)
    out["waited"] = stack.script("wait", RUN_ID, str(RUN_TIMEOUT_S), check=False, timeout=RUN_TIMEOUT_S + 120)
    out["task_instances"] = stack.task_instances(RUN_ID) if stack.database else []
    out["wall_s"] = time.monotonic() - t0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The local run and (where its services exist) the Celery run with the same conf, both at once,
    each stack deployed from its own fresh checkout; ``{name: (stack, result, run dir)}`` and why
    the Celery stack did not run (None when it ran)."""
    base = tmp_path_factory.mktemp("airflow")
    why_not = missing_service()
    env = stage_env()  # what the Makefile exports: the venv first on PATH, the shared DeepSpeed op build
    # the killed extract's retry need not wait deploy/airflow.env's 30 s: the run's critical path
    quick_retry = {"AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": str(RETRY_DELAY_S)}
    local_repo = fresh_copy(tmp_path_factory.mktemp("checkout_local"))
    stacks = {"local": make_stack("local", base, local_repo, env, **quick_retry)}
    if why_not is None:
        stacks["celery"] = make_stack("celery", base, fresh_copy(tmp_path_factory.mktemp("checkout_celery")), env,
                                      UNITER_GPU_COUNT=str(FAKE_GPUS), AIRFLOW_GPU_SLOTS=str(FAKE_GPUS),
                                      AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT="30", **quick_retry)
    try:
        with ThreadPoolExecutor(len(stacks)) as pool:
            list(pool.map(start, stacks.values()))
            refused = stacks["local"].script("trigger", json.dumps({"model_preset": "huge"}), "bad-conf", check=False)
            results = dict(zip(stacks, pool.map(run_on, stacks.values())))
        results["local"]["refused"] = refused
        report_stack("local (SQLite + LocalExecutor): ran")
        report_stack("celery (PostgreSQL + CeleryExecutor + Redis, 2 workers): "
                     + ("ran" if why_not is None else f"SKIPPED: {why_not}"))
        yield {name: (stacks[name], results[name], stacks[name].runs_dir / CONF["run_name"]) for name in results}, why_not
    finally:
        with ThreadPoolExecutor(len(stacks)) as pool:  # each stop waits for its processes to exit
            list(pool.map(lambda stack: stack.script("stop", check=False, timeout=120), stacks.values()))
        for stack in stacks.values():
            leftover = sorted(p.stem for p in (stack.home / "pids").glob("*.pid"))
            drop_database(stack)
            assert not leftover, f"{stack.name}: {leftover} still have pid files after stop"


def succeeded(stack: Stack, result: dict, run_dir: Path) -> Path:
    waited = result["waited"]
    assert waited.returncode == 0, (f"{stack.name}: {waited.stdout}{waited.stderr}"
                                    + task_log(stack.home, RUN_ID, "results"))
    return run_dir


def celery_run(runs) -> tuple[Stack, dict, Path]:
    stacks, why_not = runs
    if why_not is not None:
        pytest.skip(f"celery stack not run: {why_not}")
    return stacks["celery"]


def test_local_run_makes_every_dvc_output_in_its_run_dir(runs):
    stack, result, run_dir = runs[0]["local"]
    assert result["refused"].returncode != 0, "a conf that breaks the Params schema must not create a run"
    succeeded(stack, result, run_dir)
    params = yaml.safe_load((run_dir / "params.yaml").read_text())
    # inside the checkout's runs/ (params.yaml's paths.runs), relative: the stages run in the checkout
    assert params["paths"]["data"] == f"runs/{CONF['run_name']}/data"
    assert params["model"]["preset"] == "tiny"
    for out in dvc_outputs():  # everything dvc repro would make, made inside the run
        assert (run_dir / out).exists(), f"the run did not produce {out}"
    record = json.loads((run_dir / "outputs.json").read_text())
    assert {"data/raw/mini", "data/db/img", "data/models/pretrain", "data/reports/results.md"} <= set(record["outputs"])
    cleaning_log = task_log(stack.home, RUN_ID, "decontaminate")
    assert "cleaning reports:" in cleaning_log and "total" in cleaning_log


def test_celery_run_spreads_over_both_workers_and_matches_the_local_run_byte_for_byte(runs):
    stack, result, run_dir = celery_run(runs)
    succeeded(stack, result, run_dir)
    for out in dvc_outputs():
        assert (run_dir / out).exists(), f"the Celery run did not produce {out}"
    hosts = {ti["hostname"].split("@")[0] for ti in result["task_instances"] if ti["hostname"]}
    assert hosts == {"worker1", "worker2"}, f"task instances ran on {hosts}"
    pids = {(ti["hostname"], ti["pid"]) for ti in result["task_instances"] if ti["pid"]}
    assert len({h for h, _ in pids}) == 2 and len(pids) > 2
    local_dir = succeeded(*runs[0]["local"])
    assert (local_dir / "params.yaml").read_text() == (run_dir / "params.yaml").read_text()
    local = json.loads((local_dir / "outputs.json").read_text())["outputs"]
    assert sorted(json.loads((run_dir / "outputs.json").read_text())["outputs"]) == sorted(local)
    # the e2e test's digest: bytes of every file, less wall times (_run.json, measured throughput)
    differ = [out for out in sorted(local) if content_digest(local_dir / out) != content_digest(run_dir / out)]
    assert differ == [], "outputs differ between the executors"


def test_a_killed_worker_s_extract_is_retried_on_the_other_worker(runs):
    stack, result, run_dir = celery_run(runs)
    succeeded(stack, result, run_dir)
    killed = result["killed"]
    tries = sorted((ti for ti in result["task_instances"]
                    if ti["task_id"] == "extract" and ti["map_index"] == killed["map_index"]),
                   key=lambda ti: ti["try_number"])
    assert tries[0]["try_number"] == killed["try_number"] and tries[0]["state"] != "success", tries
    assert tries[0]["hostname"].split("@")[0] == killed["worker"]
    last = tries[-1]
    assert last["state"] == "success" and last["try_number"] > killed["try_number"], tries
    assert last["hostname"].split("@")[0] != killed["worker"], f"the retry ran on the killed {killed['worker']}"


def test_concurrent_gpu_tasks_on_two_workers_never_share_a_device(runs):
    stack, result, run_dir = celery_run(runs)
    succeeded(stack, result, run_dir)
    intervals = gpu_alloc.read_intervals(stack.home / "gpu_locks" / gpu_alloc.RECORD_FILE)
    unreleased = [iv for iv in intervals if iv.end is None]
    # the extract killed with its worker died holding its device (nothing of it lived on); the
    # kernel freed the lock for the tasks after it
    assert [(iv.host.split("@")[0], iv.label.split("@")[0]) for iv in unreleased] == \
        [(result["killed"]["worker"], "tiny:extract")], unreleased
    assert gpu_alloc.shared_devices(intervals, open_until=result["killed"]["killed_at"]) == []
    assert {iv.host.split("@")[0] for iv in intervals} == {"worker1", "worker2"}
    assert {d for iv in intervals for d in iv.devices} == set(range(FAKE_GPUS))
    together = [(a, b) for i, a in enumerate(intervals) for b in intervals[i + 1:]
                if a.end and b.end and a.start < b.end and b.start < a.end]
    assert together, "no two GPU tasks ran at the same time: the check above checked nothing"
