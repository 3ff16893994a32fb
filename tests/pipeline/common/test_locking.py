"""One writer per output (pipeline/common/locking.py): the stage lock itself, RunRecord refusing to vouch
for missing outputs, and the issue's evidence: two concurrent ``build_dbs`` runs and two concurrent
``pretrain`` runs through the real CLI both exit 0 with complete outputs, identical to one run.

Unit tests use flock's per-open-file semantics: two ``stage_lock`` calls in one process exclude
each other like two processes do; the holder-pid and SIGKILL tests use a real second process.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers.dbs_synthetic import ROOT, built_world, params_for, write_world
from pipeline.common.locking import (BUSY_EXIT, LAUNCHER_ENV, WAIT_ENV, LockBusy, lock_path, read_holder, sanitize,
                                     stage_keys, stage_lock, stage_locks, wait_from_env)
from pipeline.common.runinfo import RunRecord, file_digest

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

HOLD = """
import sys, time
from pathlib import Path
from pipeline.common.locking import stage_lock
data, key, release = sys.argv[1:4]
with stage_lock(data, key, stage="holder"):
    print("held", flush=True)
    while not Path(release).exists():
        time.sleep(0.02)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV and k != WAIT_ENV}
    return {**env, "DS_ACCELERATOR": "cpu", "DVC_NO_ANALYTICS": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **extra}


@pytest.fixture
def holder(tmp_path):
    """Start a second process holding ``key`` under ``tmp_path/data``; yields (process, release file)."""
    procs = []

    def start(key: str) -> tuple[subprocess.Popen, Path]:
        release = tmp_path / f"release-{len(procs)}"
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "data"), key, str(release)], cwd=ROOT,
                                env=_env(), stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc, release

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


# ------------------------------------------------------------------------------------------
# the lock


def test_a_second_writer_waits_until_the_first_releases_and_says_for_whom(holder, tmp_path, caplog):
    proc, release = holder("build_dbs")
    released_at = []

    def release_later() -> None:
        time.sleep(0.6)
        released_at.append(time.monotonic())
        release.touch()

    threading.Thread(target=release_later, daemon=True).start()
    with caplog.at_level(logging.INFO, logger="pipeline.common.locking"):
        with stage_lock(tmp_path / "data", "build_dbs", stage="build_dbs", poll=0.02, log_every=0.2) as path:
            got_at = time.monotonic()
            assert read_holder(path)["pid"] == os.getpid()  # the new holder recorded itself
    assert released_at and got_at >= released_at[0]
    waiting = [r.getMessage() for r in caplog.records if "waiting for build_dbs" in r.getMessage()]
    assert waiting[0].startswith(f"waiting for build_dbs: held by pid {proc.pid} on ")
    assert "(stage holder)" in waiting[0] and len(waiting) >= 2  # first notice, then periodic ones
    assert any("still waiting" in m for m in waiting[1:])


def test_fail_fast_cli_exits_3_naming_the_holder(holder, tmp_path):
    proc, _ = holder("build_dbs")
    cmd = [sys.executable, "-m", "pipeline", "build_dbs", "--set", f"paths.data={tmp_path / 'data'}"]
    out = subprocess.run(cmd, cwd=ROOT, env=_env(**{WAIT_ENV: "0"}), capture_output=True, text=True, timeout=120)
    assert out.returncode == BUSY_EXIT, out.stderr[-2000:]
    assert f"held by pid {proc.pid} on " in out.stderr and "(stage holder)" in out.stderr
    assert str(lock_path(tmp_path / "data", "build_dbs")) in out.stderr
    assert not (tmp_path / "data" / "db").exists()  # the stage never started


def test_a_bounded_wait_gives_up_and_a_bad_setting_is_named(holder, tmp_path):
    holder("extract@coco")
    start = time.monotonic()
    with pytest.raises(LockBusy, match=r"extract@coco is being written by another run after waiting"):
        with stage_lock(tmp_path / "data", "extract@coco", wait=0.5, poll=0.05):
            pass
    assert 0.45 <= time.monotonic() - start < 5
    assert wait_from_env({}) is True and wait_from_env({WAIT_ENV: "0"}) is False
    assert wait_from_env({WAIT_ENV: "2.5"}) == 2.5
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(ValueError, match=WAIT_ENV):
            wait_from_env({WAIT_ENV: bad})


def test_a_holder_killed_with_sigkill_releases_the_lock_at_once(holder, tmp_path):
    proc, _ = holder("pretrain@pretrain")
    with pytest.raises(LockBusy):
        with stage_lock(tmp_path / "data", "pretrain@pretrain", wait=False):
            pass
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with stage_lock(tmp_path / "data", "pretrain@pretrain", wait=False) as path:
        assert read_holder(path)["pid"] == os.getpid()


def test_item_runs_share_the_stage_and_an_all_items_run_excludes_them(tmp_path):
    data = tmp_path / "data"
    with stage_locks(data, "extract", "coco", wait=False):
        with stage_locks(data, "extract", "vg", wait=False):  # another item: side by side
            pass
        with pytest.raises(LockBusy, match="extract@coco"):  # the same item: one writer
            with stage_locks(data, "extract", "coco", wait=False):
                pass
        with pytest.raises(LockBusy, match=r"^extract is being written"):  # all items write coco too
            with stage_locks(data, "extract", None, wait=False):
                pass
    with stage_locks(data, "extract", None, wait=False):
        with pytest.raises(LockBusy):
            with stage_locks(data, "extract", "vg", wait=False):
                pass


def test_keys_are_sanitized_and_launched_ranks_take_no_lock(tmp_path, monkeypatch):
    root = tmp_path / "data" / "cache" / "locks"
    assert lock_path(tmp_path / "data", "../../etc/passwd") == root / "_.._etc_passwd.lock"
    assert lock_path(tmp_path / "data", "finetune@vqa") == root / "finetune@vqa.lock"
    assert sanitize("..") == "_" and sanitize("a b/c") == "a_b_c" and len(sanitize("x" * 500)) == 200
    assert stage_keys("build_dbs") == [("build_dbs", False)]
    assert stage_keys("finetune", "vqa") == [("finetune", True), ("finetune@vqa", False)]
    assert stage_keys("pretrain_vcr", None, "big") == [("pretrain@big_vcr", False)]
    with pytest.raises(ValueError, match="out_name"):
        stage_keys("pretrain")

    with stage_lock(tmp_path / "data", "pretrain@pretrain"):
        for key in LAUNCHER_ENV:
            monkeypatch.setenv(key, "0")
        with stage_locks(tmp_path / "data", "pretrain", out_name="pretrain", wait=False) as paths:
            assert paths == []  # a rank of the launcher holding the lock: no deadlock


def test_lock_keys_follow_the_names_pretraining_writes():
    """locking mirrors two facts of the training code without importing torch: the output name of
    each pretraining stage and the launcher's environment."""
    from pipeline.common.locking import PRETRAIN_OUTPUTS
    from pipeline.pretrain.plan import plan_stage
    from pipeline.training.launch import LAUNCH_ENV

    assert tuple(LAUNCHER_ENV) == tuple(LAUNCH_ENV)
    params = params_for(Path("/nonexistent"), "pretrain.out_name=big")
    for stage in PRETRAIN_OUTPUTS:
        assert stage_keys(stage, None, "big") == [(f"pretrain@{plan_stage(params, stage).name}", False)]


# ------------------------------------------------------------------------------------------
# _run.json only beside its outputs


def test_run_record_refuses_when_a_listed_output_is_missing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    rec = RunRecord("pretrain", "digest")
    rec.extra["outputs"] = {"metrics": str(tmp_path / "metrics")}
    with pytest.raises(RuntimeError, match=r"not writing .*_run.json: .*output 'metrics' \(.*metrics\)"):
        rec.write(out)
    (tmp_path / "metrics").mkdir()
    with pytest.raises(RuntimeError, match=r"required \(.*db/data.mdb\)"):
        rec.write(out, require=[tmp_path / "metrics", tmp_path / "db" / "data.mdb"])
    assert not (out / "_run.json").exists()
    assert rec.write(out)["outputs"] == {"metrics": str(tmp_path / "metrics")}
    assert (out / "_run.json").is_file()


def test_run_record_names_the_machine(tmp_path):
    """Issue #19 §5: CPU kernels differ between CPU models, so a record says what computed it."""
    import torch  # a training stage has torch loaded: the record then has its kernel level too

    written = RunRecord("pretrain", "digest").write(tmp_path)["machine"]
    assert written["cpus"] == os.cpu_count() and written["cpu"] and written["platform"]
    assert written["torch"] == torch.__version__ and written["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert written["torch_threads"] == torch.get_num_threads()


# ------------------------------------------------------------------------------------------
# the evidence: two concurrent runs of the real CLI


def files_below(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith("_run")}


def tsv_rows(path: Path) -> list[list[str]]:
    with path.open() as fh:
        return [row[:2] for row in list(csv.reader(fh, delimiter="\t"))[1:]]  # step, value


def tsv_steps(path: Path) -> list[int]:
    return [int(row[0]) for row in tsv_rows(path)]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """The synthetic world with its DBs built once, in-process: the single-run reference."""
    return built_world(tmp_path_factory.mktemp("locking") / "data")


def _cli(stage: str, data: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", stage,
            *(a for o in (f"paths.data={data}", *overrides) for a in ("--set", o))]


def run_twice(cmd: list[str], lock: Path, timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """Start ``cmd``; once it holds ``lock``, start it again; wait for both (stderr captured)."""
    first = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             text=True)
    deadline = time.time() + timeout
    while first.poll() is None and read_holder(lock) is None and time.time() < deadline:
        time.sleep(0.01)
    second = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              text=True)
    try:
        out = [(p, *p.communicate(timeout=max(1.0, deadline - time.time()))) for p in (first, second)]
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
    return [subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr) for p, stdout, stderr in out]


def test_two_concurrent_build_dbs_runs_both_finish_with_every_db(world, tmp_path):
    data = tmp_path / "data"
    write_world(data)
    first, second = run_twice(_cli("build_dbs", data), lock_path(data, "build_dbs"))
    for n, proc in enumerate((first, second)):
        assert proc.returncode == 0, f"run {n + 1}: {proc.stderr[-3000:]}"
    assert "waiting for build_dbs: held by pid" in second.stderr  # it queued instead of racing
    for db in (p for p in (data / "db" / "txt").iterdir() if p.is_dir() and not p.name.startswith(".")):
        assert (db / "data.mdb").is_file() and (db / "_run.json").is_file(), db
    assert not list((data / "db" / "txt").glob(".*")) and not list((data / "db" / "img").glob(".*"))
    assert files_below(data / "db") == files_below(world / "db")


@pytest.mark.slow
def test_two_concurrent_pretrain_runs_write_one_set_of_metrics(world):
    from pipeline.pretrain.pretrain import run

    fast = ["model.preset=tiny", "model.init_from_bert=false", "pretrain.batch_tokens=400", "pretrain.val_batches=1",
            "pretrain.log_every=1", "pretrain.num_workers=0", "pretrain.first_phase_steps=0", "pretrain.steps=4",
            "pretrain.val_every=2", "pretrain.checkpoint_every=2", "pretrain.optim.warmup_steps=1"]
    first, second = run_twice(_cli("pretrain", world, *fast, "pretrain.out_name=twice"),
                              lock_path(world, "pretrain@twice"))
    for n, proc in enumerate((first, second)):
        assert proc.returncode == 0, f"run {n + 1}: {proc.stderr[-3000:]}"
    assert "waiting for pretrain@twice: held by pid" in second.stderr
    plots = world / "metrics/twice/plots/metrics"
    for name in ("train/loss.tsv", "train/mlm/loss.tsv"):
        assert tsv_steps(plots / name) == [1, 2, 3, 4], name  # one row per step, not one per run
    assert tsv_steps(plots / "val/mlm/mlm_acc.tsv") == [2, 4]
    model = world / "models/twice"
    assert sorted(p.name for p in model.iterdir() if not p.name.startswith(".")) == \
        ["_run.json", "eval.json", "model.safetensors", "model_config.json"]
    assert json.loads((model / "_run.json").read_text())["counts"]["steps"] == 4
    assert not (world / "checkpoints/twice").exists()

    run(params_for(world, *fast, "pretrain.out_name=once"))  # one run alone: the same result
    for name in ("train/loss.tsv", "val/mlm/mlm_acc.tsv"):
        assert tsv_rows(plots / name) == tsv_rows(world / "metrics/once/plots/metrics" / name), name
    for name in ("model.safetensors", "eval.json"):
        assert file_digest(model / name) == file_digest(world / "models/once" / name), name
