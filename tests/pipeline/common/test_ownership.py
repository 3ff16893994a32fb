"""The pipeline removes or replaces only directories it created (pipeline/common/ownership.py).

Every place that clears a directory is tried against a *decoy*: a folder with a file in it and no
ownership marker, standing exactly where the stage would clear. The stage must stop with an error
naming the decoy, and the decoy must be intact afterwards. Stage entries are called for real; each
refuses before doing any work, so these tests take seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from helpers.dbs_synthetic import ROOT, built_world, params_for
from pipeline.common.ownership import (OWNER_FILE, ForeignDirectoryError, atomic_dir, claim_dir, is_owned, remove_owned,
                                       write_marker)

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)


def decoy(path: Path) -> Path:
    """A user's folder: one file and a subfolder, no marker."""
    (path / "sub").mkdir(parents=True)
    (path / "sentinel.txt").write_text("precious\n")
    return path


def intact(path: Path) -> bool:
    return (path / "sentinel.txt").read_text() == "precious\n" and (path / "sub").is_dir()


# ---------------------------------------------------------------------------------------------
# the primitives


def test_remove_owned_refuses_an_unmarked_directory_and_removes_a_marked_one(tmp_path):
    with pytest.raises(ForeignDirectoryError, match=str(tmp_path / "user")):
        remove_owned(decoy(tmp_path / "user"))
    assert intact(tmp_path / "user")
    mine = claim_dir(tmp_path / "mine", "test", "abc")
    (mine / "file").write_text("x")
    assert json.loads((mine / OWNER_FILE).read_text()) == {"stage": "test", "params_digest": "abc"}
    remove_owned(mine)
    assert not mine.exists()
    remove_owned(tmp_path / "absent")  # nothing to do


def test_empty_directories_may_be_taken_over_files_and_links_never(tmp_path):
    (tmp_path / "empty").mkdir()
    assert is_owned(claim_dir(tmp_path / "empty", "test"))
    (tmp_path / "file").write_text("precious\n")
    with pytest.raises(ForeignDirectoryError):
        remove_owned(tmp_path / "file")
    target = decoy(tmp_path / "target")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(ForeignDirectoryError):
        claim_dir(tmp_path / "link", "test")
    assert intact(target) and (tmp_path / "file").read_text() == "precious\n"


_KILLED_MARKER_WRITE = """
import os, signal, sys
from pipeline.common import ownership
real_replace = os.replace
def replace(src, dst):  # SIGKILL between writing the marker's temporary file and renaming it
    if str(dst).endswith(ownership.OWNER_FILE):
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)
os.replace = replace
ownership.claim_dir(sys.argv[1], "extract@coco")
"""


def test_a_stage_killed_during_its_marker_write_can_claim_its_directory_again(tmp_path):
    # The Celery kill-a-worker test once hit this: the retry of a SIGKILLed extract found
    # features/coco holding only the marker's temporary file and refused to touch it.
    target = tmp_path / "features" / "coco"
    proc = subprocess.run([sys.executable, "-c", _KILLED_MARKER_WRITE, str(target)], cwd=ROOT)
    assert proc.returncode == -9
    leftovers = list(target.iterdir())
    assert len(leftovers) == 1 and leftovers[0].name.startswith(f".{OWNER_FILE}.") and not is_owned(target)
    assert is_owned(claim_dir(target, "extract@coco"))
    assert sorted(p.name for p in target.iterdir()) == [OWNER_FILE]  # the leftover is tidied away
    leftovers[0].write_text("")  # a leftover beside anything else: the directory is not ours
    (target / OWNER_FILE).unlink()
    (target / "sentinel.txt").write_text("precious\n")
    with pytest.raises(ForeignDirectoryError):
        claim_dir(target, "extract@coco")


def test_atomic_dir_refuses_to_replace_a_foreign_directory_before_the_work(tmp_path):
    final = decoy(tmp_path / "out")
    ran = []
    with pytest.raises(ForeignDirectoryError, match="refusing to replace"):
        with atomic_dir(final, stage="test"):
            ran.append(True)
    assert not ran and intact(final)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary left beside it


def test_atomic_dir_marks_its_result_and_replaces_what_it_wrote(tmp_path):
    for text in ("first", "second"):
        with atomic_dir(tmp_path / "out", stage="test") as tmp:
            (tmp / "f").write_text(text)
    assert (tmp_path / "out/f").read_text() == "second" and is_owned(tmp_path / "out")


def test_a_foreign_directory_that_appears_during_the_work_is_not_replaced(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(ForeignDirectoryError):
        with atomic_dir(final, stage="test") as tmp:
            (tmp / "f").write_text("result")
            decoy(final)  # e.g. a user's copy made while the stage ran
    assert intact(final) and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_checkpoints_of_another_run_are_removed_only_from_a_marked_root(tmp_path):
    from pipeline.training.checkpointing import FINGERPRINT, Checkpointer
    from pipeline.training.launch import DistInfo

    dist = DistInfo(rank=0, world_size=1, local_rank=0, local_world_size=1)
    root = decoy(tmp_path / "ckpt")
    (root / FINGERPRINT).write_text('{"other": 1}')  # even one that looks like checkpoints
    with pytest.raises(ForeignDirectoryError, match=str(root)):
        Checkpointer(root, stage="test", fingerprint={"run": 1}, keep=1, dist=dist).prepare()
    assert intact(root)

    mine = tmp_path / "mine"
    assert Checkpointer(mine, stage="test", fingerprint={"run": 1}, keep=1, dist=dist).prepare() is None
    (mine / "step_0000005").mkdir()
    assert Checkpointer(mine, stage="test", fingerprint={"run": 2}, keep=1, dist=dist).prepare() is None
    assert sorted(p.name for p in mine.iterdir()) == [OWNER_FILE, FINGERPRINT]  # the other run's are gone


def test_stale_temporaries_go_only_when_they_are_the_pipelines(tmp_path):
    from pipeline.common.ownership import remove_stale_temps

    final = tmp_path / "db"
    ours = claim_dir(tmp_path / ".db.abc.tmp", "build_dbs")
    (ours / "data.mdb").write_bytes(b"partial")
    remove_stale_temps(final)
    assert not ours.exists()
    theirs = decoy(tmp_path / ".db.user.tmp")
    with pytest.raises(ForeignDirectoryError):
        remove_stale_temps(final)
    assert intact(theirs)


# ---------------------------------------------------------------------------------------------
# the stages, each with a decoy where it would clear


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    return built_world(tmp_path_factory.mktemp("ownership") / "data")


@pytest.mark.parametrize("where", ["checkpoints/pretrain", "models/pretrain", "metrics/pretrain"])
def test_pretrain_refuses_a_foreign_directory_before_training(world, where):
    from pipeline.pretrain.pretrain import run

    target = decoy(world / where)
    try:
        with pytest.raises(ForeignDirectoryError, match=str(target)):
            run(params_for(world, "model.preset=tiny", "pretrain.steps=2", "pretrain.first_phase_steps=0"))
        assert intact(target)
    finally:
        _cleanup(target)


def test_build_dbs_refuses_to_rebuild_over_a_foreign_db_directory(world):
    from pipeline.stores.build_dbs import run

    db = next(p for p in sorted((world / "db" / "txt").iterdir()) if p.is_dir())
    with decoy_in_place_of(db) as target:
        with pytest.raises(ForeignDirectoryError, match=str(target)):
            run(params_for(world))
        assert intact(target)


def test_finetune_refuses_a_foreign_work_directory(world):
    from pipeline.finetune.finetune import run

    target = decoy(world / "checkpoints" / "finetune" / "vqa")
    try:
        with pytest.raises(ForeignDirectoryError, match=str(target)):
            run(params_for(world), "vqa")
        assert intact(target)
    finally:
        _cleanup(target)


def test_extract_refuses_to_prune_shards_in_a_foreign_directory(tmp_path):
    from pipeline.extract.extract import run

    target = decoy(tmp_path / "data" / "features" / "coco")
    (target / "shard-00007.safetensors").write_bytes(b"not ours")  # what pruning would delete
    with pytest.raises(ForeignDirectoryError, match=str(target)):
        run(params_for(tmp_path / "data"), "coco")
    assert intact(target) and (target / "shard-00007.safetensors").exists()


def test_mini_world_refuses_to_replace_a_foreign_out_dir(tmp_path):
    from pipeline.mini_world import run

    target = decoy(tmp_path / "raw")
    with pytest.raises(ForeignDirectoryError, match=str(target)):
        run(params_for(tmp_path / "data", f"mini_world.out_dir={target}"))
    assert intact(target)


def test_train_detector_refuses_a_foreign_model_directory_before_training(tmp_path):
    from pipeline.extract.train_detector import run

    target = decoy(tmp_path / "data" / "models" / "detector")
    with pytest.raises(ForeignDirectoryError, match=str(target)):
        run(params_for(tmp_path / "data", f"mini_world.out_dir={tmp_path / 'no-world'}"))
    assert intact(target)


def test_plots_refuse_to_replace_a_foreign_report_directory(tmp_path):
    from pipeline.report.plots import run

    target = decoy(tmp_path / "data" / "reports" / "plots")
    with pytest.raises(ForeignDirectoryError, match=str(target)):
        run(params_for(tmp_path / "data"))
    assert intact(target)


def _cleanup(target: Path) -> None:
    """Remove a test's own decoy (marked first, so the production helper is the one removing it)."""
    if target.exists():
        write_marker(target, "test")
        remove_owned(target)


@contextlib.contextmanager
def decoy_in_place_of(target: Path) -> Iterator[Path]:
    """A user's folder (:func:`decoy`) where the pipeline's ``target`` was: the output, if there is
    one, is moved aside and put back afterwards."""
    moved = target.with_name(target.name + ".built") if target.exists() else None
    if moved:
        target.rename(moved)
    decoy(target)
    try:
        yield target
    finally:
        _cleanup(target)
        if moved:
            moved.rename(target)


# ---------------------------------------------------------------------------------------------
# the command line, as the issue tried it


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "UNITER_LOCK_WAIT": "0"}
    return subprocess.run([sys.executable, "-m", "pipeline", *args, "--set", f"paths.data={tmp_path / 'data'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("out_name", ["ABS", "../../../decoy2", "..", "a/b"])
def test_an_artifact_name_that_is_a_path_is_refused_before_any_work(tmp_path, out_name):
    target = decoy(tmp_path / "decoy")
    value = str(target) if out_name == "ABS" else out_name
    done = cli(tmp_path, "pretrain", "--set", f"pretrain.out_name={value}")
    assert done.returncode == 2 and "pretrain.out_name" in done.stderr and "Traceback" not in done.stderr
    assert intact(target) and not (tmp_path / "data").exists()


def test_the_cli_names_a_foreign_directory_without_a_traceback(tmp_path):
    target = decoy(tmp_path / "mine")
    done = cli(tmp_path, "mini_world", "--set", f"mini_world.out_dir={target}")
    assert done.returncode == 1, done.stderr
    assert f"refusing to replace {target}" in done.stderr and "Traceback" not in done.stderr
    assert intact(target)


def test_build_dbs_checks_every_image_db_and_its_records_before_building_any(world):
    """A foreign directory at the last image DB, or in place of a summary's _run.json, stops
    build_dbs before it rebuilds anything (it used to rebuild the others first, or fail at the end)."""
    from pipeline.stores.build_dbs import run

    img = world / "db" / "img"
    first = next(p for p in sorted(img.iterdir()) if p.is_dir())
    before = (first / "data.mdb").stat().st_mtime_ns
    for target in (img / "zz_last", world / "db" / "txt" / "_run.json"):
        (world / "features" / "zz_last").mkdir(exist_ok=True)
        (world / "features" / "zz_last" / "meta.json").write_text("{}")
        try:
            with decoy_in_place_of(target):
                with pytest.raises(ForeignDirectoryError, match=str(target)):
                    run(params_for(world))
                assert intact(target)
                assert (first / "data.mdb").stat().st_mtime_ns == before  # nothing rebuilt
        finally:
            import shutil

            shutil.rmtree(world / "features" / "zz_last")


def test_build_dbs_checks_every_text_db_before_building_any(world):
    """A foreign directory where the last-built text DB goes stops build_dbs before it rebuilds any
    text DB (it used to be found only when that DB was reached, after the others were rebuilt)."""
    from pipeline.stores.build_dbs import run

    txt = world / "db" / "txt"
    stamps = {p: (p / "data.mdb").stat().st_mtime_ns for p in txt.iterdir() if (p / "data.mdb").is_file()}
    last = max(stamps, key=stamps.get)  # the DB the previous build wrote last
    del stamps[last]
    with decoy_in_place_of(last) as target:
        with pytest.raises(ForeignDirectoryError, match=str(target)):
            run(params_for(world))
        assert intact(target)
        assert {p: (p / "data.mdb").stat().st_mtime_ns for p in stamps} == stamps  # nothing rebuilt


def test_pretrain_removes_what_a_killed_export_left_before_it_trains(world, monkeypatch):
    """A run killed during its export leaves ``models/.pretrain.<random>.tmp`` (the model's size);
    the next run removes it when it starts, not only when it reaches its own export."""
    import pipeline.pretrain.pretrain as pretrain

    left = world / "models" / ".pretrain.k1ll3d.tmp"
    left.mkdir(parents=True)
    write_marker(left, "pretrain")
    (left / "model.safetensors").write_bytes(b"\0" * 4096)
    at_training = []
    monkeypatch.setattr(pretrain, "train_rank", lambda params, plan: at_training.append(left.exists()))
    try:
        pretrain.run(params_for(world, "model.preset=tiny", "pretrain.steps=2", "pretrain.first_phase_steps=0"))
        assert at_training == [False]
    finally:
        _cleanup(left)


def test_build_dbs_removes_what_it_did_not_write_and_refuses_a_foreign_stray_first(world):
    """DVC leaves build_dbs' outputs in place (persist: true), so the stage itself leaves what a
    fresh build would: an earlier run's DB this run does not write and a killed run's temporaries
    go; a stray it did not create stops it before any work."""
    from pipeline.stores.build_dbs import run

    txt = world / "db" / "txt"
    stale = claim_dir(txt / "vqa_old", "build_dbs")  # e.g. a DB of a dataset no longer ingested
    (stale / "data.mdb").write_bytes(b"old")
    temp = claim_dir(txt / ".vqa_val.k1ll3d.tmp", "build_dbs")
    (txt / "._run.json.k1ll3d.tmp").write_text("{")
    stamps = {p: (p / "data.mdb").stat().st_mtime_ns for p in txt.iterdir() if (p / "data.mdb").is_file()}
    for foreign in (decoy(txt / "notes"), txt / "notes.txt"):
        if not foreign.exists():
            foreign.write_text("precious\n")
        try:
            with pytest.raises(ForeignDirectoryError, match=str(foreign)):
                run(params_for(world))
            assert {p: (p / "data.mdb").stat().st_mtime_ns for p in stamps} == stamps  # nothing rebuilt
        finally:
            _cleanup(foreign) if foreign.is_dir() else foreign.unlink()
    run(params_for(world))
    assert not stale.exists() and not temp.exists() and not (txt / "._run.json.k1ll3d.tmp").exists()
    assert not [p.name for p in txt.iterdir() if p.name.startswith(".")]
