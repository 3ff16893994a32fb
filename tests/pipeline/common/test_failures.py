"""One error path: every anticipated error class becomes one line naming the file or key, with
the exit status docs/safety.md documents; anything else keeps its traceback.

Each class is raised by the real code that raises it (a damaged file, a payload, a decoy
directory, a held lock, a full tmpfs), then passed through ``pipeline.common.failures.describe``;
a few go through ``python -m pipeline`` end to end.
"""

from __future__ import annotations

import importlib
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.common.failures import BAD_INPUT, BUSY, EXIT_STATUS, MACHINE_STATE, describe

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs" / "safety.md"


def _class(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_every_listed_class_exists_and_is_in_the_safety_table():
    table = DOCS.read_text()
    for dotted, status in EXIT_STATUS.items():
        cls = _class(dotted)
        assert issubclass(cls, Exception), dotted
        assert f"`{cls.__name__}`" in table, f"docs/safety.md does not list {cls.__name__}"
    assert "No space left on device" in table or "disk full" in table


def _check(err: BaseException, status: int, *names: str) -> str:
    known = describe(err)
    assert known is not None, f"{type(err).__name__} is not anticipated: {err}"
    assert known[0] == status, known
    assert "\n" not in known[1]
    for name in names:
        assert str(name) in known[1], (name, known[1])
    return known[1]


# ---------------------------------------------------------------------------------------------
# bad parameters (exit 2)


@pytest.mark.parametrize("content, expected", [
    (b"seed: 1\npretrain: [1,\n", r"not valid YAML at line 3"),
    (b"seed: 1\n# caf\xe9\n", r"not UTF-8 text \(byte 0xe9 on line 2\)"),
    (b"seed: 1\nseed: 2\n", r"line 2 column 1: key 'seed' is given twice"),
])
def test_a_damaged_params_file_is_named_with_the_line(tmp_path, content, expected):
    from pipeline.params.parser import ParamsError, load_params

    path = tmp_path / "params.yaml"
    path.write_bytes(content)
    with pytest.raises(ParamsError) as info:
        load_params(path)
    assert re.search(expected, _check(info.value, BAD_INPUT, path))


def test_a_set_value_that_is_no_yaml_is_named():
    from pipeline.params.parser import ParamsError, load_params

    with pytest.raises(ParamsError) as info:
        load_params(ROOT / "params.yaml", ["pretrain.steps=[1,"])
    assert _check(info.value, BAD_INPUT).startswith("--set pretrain.steps: not valid YAML")


# ---------------------------------------------------------------------------------------------
# bad input files and unsafe files (exit 2)


class _Payload:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_a_truncated_source_names_the_file(tmp_path):
    from pipeline.common.source_records import SourceFormatError, load_json

    path = tmp_path / "captions.json"
    path.write_text('{"images": [{"id"')
    with pytest.raises(SourceFormatError) as info:
        load_json(path)
    _check(info.value, BAD_INPUT, path, "truncated")


def test_detector_weights_that_hold_a_payload_or_do_not_fit_are_named(tmp_path):
    from pipeline.extract.detector.checkpoint import CheckpointError, load_weights, read_state

    pkl = tmp_path / "model_final.pkl"
    pkl.write_bytes(pickle.dumps({"model": {"w": _Payload(tmp_path / "ran")}}, protocol=2))
    with pytest.raises(CheckpointError) as info:
        read_state(pkl)
    _check(info.value, BAD_INPUT, pkl, "io.open")
    wrong = tmp_path / "wrong_keys.pth"
    torch.save({"model": {"not_a_layer.weight": torch.zeros(2, 2)}}, wrong)
    with pytest.raises(CheckpointError) as info:
        load_weights(torch.nn.Linear(2, 2), wrong)
    _check(info.value, BAD_INPUT, wrong, "missing", "unexpected")
    assert not (tmp_path / "ran").exists()


def test_bert_weights_with_wrong_shapes_or_a_payload_are_named(tmp_path):
    from model.bert_init import load_bert_weights
    from model.config import UniterConfig
    from model.uniter import UniterModel
    from model.weights_file import UnsafeCheckpointError, WeightsMismatchError

    model = UniterModel(UniterConfig.from_preset("tiny"), img_dim=8)
    path = tmp_path / "pytorch_model.bin"
    torch.save({"embeddings.LayerNorm.bias": torch.zeros(7)}, path)
    with pytest.raises(WeightsMismatchError) as info:
        load_bert_weights(model, path)
    _check(info.value, BAD_INPUT, path, "embeddings.LayerNorm.bias", "(7,)")
    torch.save({"w": _Payload(tmp_path / "ran")}, path)
    with pytest.raises(UnsafeCheckpointError) as info:
        load_bert_weights(model, path)
    _check(info.value, BAD_INPUT, path)
    assert not (tmp_path / "ran").exists()


def test_a_damaged_lmdb_value_names_the_db_and_the_key(tmp_path):
    from helpers.stores import write_lmdb
    from pipeline.stores.lmdb_store import encode_value
    from pipeline.stores.readers import DamagedStoreError, LmdbReader

    write_lmdb(tmp_path / "db", [("a", encode_value({"x": 1})), ("b", os.urandom(64)), ("c", b"\x00" * 8)],
               commit_every=10)
    reader = LmdbReader(tmp_path / "db")
    assert reader.get("a") == {"x": 1}
    for key in ("b", "c"):
        with pytest.raises(DamagedStoreError) as info:
            reader.get(key)
        _check(info.value, BAD_INPUT, tmp_path / "db", f"key {key!r}")


# ---------------------------------------------------------------------------------------------
# the machine's state (exit 1) and a busy lock (exit 3)


def test_a_foreign_directory_is_named(tmp_path):
    from pipeline.common.ownership import ForeignDirectoryError, check_owned

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("x")
    with pytest.raises(ForeignDirectoryError) as info:
        check_owned(tmp_path / "mine")
    _check(info.value, MACHINE_STATE, tmp_path / "mine")


def test_outputs_removed_under_a_running_stage_are_named(tmp_path):
    from pipeline.common.runinfo import OutputsMissingError, RunRecord

    record = RunRecord("extract@coco", "digest")
    record.extra["outputs"] = {"features": str(tmp_path / "gone")}
    with pytest.raises(OutputsMissingError) as info:
        record.write(tmp_path)
    _check(info.value, MACHINE_STATE, tmp_path / "gone")


def test_a_busy_lock_names_the_holder(tmp_path):
    from pipeline.common.locking import LockBusy, stage_locks

    with stage_locks(tmp_path, "build_dbs", None, wait=False):
        pid = os.fork()
        if pid == 0:  # another process: flock locks are per open file, so a child sees the lock held
            try:
                with stage_locks(tmp_path, "build_dbs", None, wait=False):
                    os._exit(9)
            except LockBusy as err:
                known = describe(err)
                os._exit(known[0] if known and f"pid {os.getppid()}" in known[1] else 8)
            os._exit(7)
        _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == BUSY


@pytest.fixture
def tiny_disk(tmp_path):
    """A 256 KiB tmpfs below tmp_path (needs root or CAP_SYS_ADMIN; skipped without)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root / CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_disk_anywhere_names_the_file_and_the_free_space(tiny_disk):
    from pipeline.common.runinfo import atomic_write_bytes

    target = tiny_disk / "out" / "model.safetensors"
    with pytest.raises(OSError) as info:
        atomic_write_bytes(target, b"\0" * (1 << 20))
    message = _check(info.value, MACHINE_STATE, target, "bytes free on")
    assert message.startswith(f"disk full: {target}: No space left on device")
    wrapped = RuntimeError("the writer failed")  # a library that wraps the OSError: still a full disk
    wrapped.__cause__ = info.value
    _check(wrapped, MACHINE_STATE, target)


def test_anything_else_keeps_its_traceback():
    assert describe(KeyError("x")) is None
    assert describe(ValueError("a bug")) is None
    assert describe(OSError(5, "Input/output error")) is None


# ---------------------------------------------------------------------------------------------
# through the command line


def _cli(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def _one_error_line(proc: subprocess.CompletedProcess, status: int) -> str:
    assert proc.returncode == status, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def test_the_cli_exits_2_on_a_latin1_params_file(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_bytes((ROOT / "params.yaml").read_bytes() + b"# r\xe9sum\xe9\n")
    line = _one_error_line(_cli("plots", "--params", str(path)), BAD_INPUT)
    assert str(path) in line and "not UTF-8" in line


def test_the_cli_exits_2_on_a_truncated_store(tmp_path):
    """A data.mdb cut short used to kill the reader with SIGBUS (exit 135, no message)."""
    from helpers.dbs_synthetic import write_features  # noqa: F401 - the helpers path is set up
    from helpers.stores import write_lmdb
    from pipeline.stores.lmdb_store import encode_value

    db = tmp_path / "db"
    write_lmdb(db, [(f"{i:05d}", encode_value({"v": os.urandom(2000)})) for i in range(60)], commit_every=10)
    (db / "meta.json").write_text('{"kind": "text", "name": "t"}')
    with open(db / "data.mdb", "r+b") as fh:
        fh.truncate(5000)
    code = ("import sys; from pipeline.__main__ import _reported; from pipeline.stores.readers import LmdbReader; "
            f"sys.exit(_reported(lambda: LmdbReader({str(db)!r}).get('00059') and 0))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    line = _one_error_line(proc, BAD_INPUT)
    assert str(db) in line and "truncated" in line


def _fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` until about ``leave`` bytes are free."""
    import shutil

    free = shutil.disk_usage(disk).free
    with open(disk / "filler", "wb") as fh:
        fh.write(b"\0" * max(0, free - leave))


@pytest.mark.stage
def test_the_cli_exits_1_naming_the_file_when_a_stage_fills_the_disk(tiny_disk, tmp_path):
    """ingest on a full disk: one line naming the file it could not write, exit 1, no _run.json."""
    from helpers.source_fixtures import fixture_overrides

    sets = [*fixture_overrides(tmp_path), "world=real", f"paths.data={tiny_disk / 'data'}"]
    _fill(tiny_disk, leave=16 << 10)
    args = ["ingest", "coco", "--params", str(ROOT / "params.yaml")]
    for item in sets:
        args += ["--set", item]
    line = _one_error_line(_cli(*args), MACHINE_STATE)
    assert line.startswith(f"error: disk full: {tiny_disk}"), line
    assert "bytes free on" in line
    assert not list((tiny_disk / "data").rglob("_run.json"))
