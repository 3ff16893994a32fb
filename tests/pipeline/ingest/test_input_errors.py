"""Clear messages for damaged inputs and a full disk: a truncated JSON source, a torch checkpoint
holding pickled objects, LMDB running out of space, and manifests readable by other users."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import stat
import subprocess
import sys
import traceback
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from model.bert_init import read_bert_state
from model.weights_file import UnsafeCheckpointError
from pipeline.common.runinfo import RunRecord
from pipeline.extract.detector.checkpoint import read_state
from pipeline.ingest.manifest import ParquetStreamWriter, manifest_schema
from pipeline.common.source_records import (MALFORMED_ROW, ReadContext, Reject, SourceFormatError, jsonl_records,
                                             load_json)
from helpers.stores import write_lmdb
from pipeline.stores.lmdb_store import DiskFullError

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "pipeline"))
sys.path.insert(0, str(REPO / "tests" / "pipeline" / "sources"))
from helpers.dbs_synthetic import write_features  # noqa: E402
from helpers.source_fixtures import FIXTURES, fixture_overrides  # noqa: E402

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

# --------------------------------------------------------------------------------------------
# a whole-file JSON source cut short


@pytest.mark.parametrize("text, where, ending", [
    ('{"images": [{"id": 1}, {"id"', "line 1 column 29 (char 28)", "the file looks truncated (it ends at char 28)"),
    ('{"images": [{"file_name": "a.j', "line 1 column 27 (char 26)", "the file looks truncated"),
    ('{"images": [1,\n 2', "line 2 column 3 (char 17)", "the file looks truncated"),
    ('{"images": [1, 2 3]}', "line 1 column 18 (char 17)", None),
    ('', "line 1 column 1 (char 0)", "the file is empty"),
])
def test_load_json_names_the_file_the_position_and_a_cut(tmp_path, text, where, ending):
    path = tmp_path / "doc.json"
    path.write_text(text)
    with pytest.raises(SourceFormatError) as info:
        load_json(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not valid JSON at {where}: ")
    assert (ending in message) if ending else ("truncated" not in message and "empty" not in message)


def test_a_cut_jsonl_line_is_still_one_rejected_row(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n{"a": 2, "b": "cu')
    items = list(jsonl_records(path, ReadContext(sources=None, progress=False), "t"))
    assert items[0][1] == {"a": 1}
    assert isinstance(items[1], Reject) and (items[1].reason, items[1].locator) == (MALFORMED_ROW, "line 2")


def test_ingest_of_a_truncated_captions_file_exits_2_naming_file_and_position(tmp_path):
    full = (FIXTURES / "coco" / "captions_train2014.json").read_bytes()
    cut = tmp_path / "captions_train2014.json"
    cut.write_bytes(full[: len(full) * 3 // 5])
    sets = [*fixture_overrides(tmp_path), "world=real", f"sources.coco.captions_train={cut}"]
    args = [sys.executable, "-m", "pipeline", "ingest", "coco", "--params", str(REPO / "params.yaml")]
    for item in sets:
        args += ["--set", item]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: {cut}: not valid JSON at line " in proc.stderr
    assert "the file looks truncated" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "data" / "manifests" / "coco.parquet").exists()



@pytest.mark.parametrize("text, said", [
    ("[]", "expected a JSON object with a list at 'images', got a list"),
    ('{"info": {}}', "expected a JSON object with a list at 'images', it has no key 'images' (its keys: info)"),
    ('{"images": {}}', "expected a list at 'images', got a dict"),
])
def test_a_json_file_of_another_shape_says_what_it_holds(tmp_path, text, said):
    """A top-level list, or an object without the key, was reported as "got NoneType"."""
    from pipeline.common.source_records import expect_list

    path = tmp_path / "dataset_coco.json"
    path.write_text(text)
    with pytest.raises(SourceFormatError) as err:
        expect_list(load_json(path)[0], path, "images")
    assert str(err.value) == f"{path}: {said}"


# --------------------------------------------------------------------------------------------
# a line file saved with a byte order mark (an editor on Windows, a spreadsheet's "UTF-8 text")

LINE_FILES = {"cc": ("train_tsv", "val_tsv"), "sbu": ("urls", "captions"), "vcr": ("train", "val", "test"),
              "snli_ve": ("train", "dev", "test")}


@pytest.mark.parametrize("dataset", sorted(LINE_FILES))
def test_a_byte_order_mark_changes_no_row(tmp_path, dataset):
    """Each line file with a UTF-8 BOM gives the manifest and rejects of the file without one: the BOM
    was kept in line 1's caption (CC), or made line 1 a bad_url (SBU) or malformed_row (JSON lines)."""
    from pipeline.params.parser import load_params
    from helpers.source_fixtures import ingest

    sets = [*fixture_overrides(tmp_path / "plain"), "world=real"]
    _, plain, plain_rejects = ingest(load_params(REPO / "params.yaml", sets), dataset)
    marked = []
    for key in LINE_FILES[dataset]:
        prefix = f"sources.{dataset}.{key}="
        source = Path(next(s for s in sets if s.startswith(prefix))[len(prefix):])
        copy = tmp_path / "bom" / key / source.name
        copy.parent.mkdir(parents=True)
        copy.write_bytes(b"\xef\xbb\xbf" + source.read_bytes())
        marked.append(prefix + str(copy))
    sets = [*fixture_overrides(tmp_path / "bom"), "world=real", *marked]
    _, manifest, rejects = ingest(load_params(REPO / "params.yaml", sets), dataset)
    same = ["example_id", "split", "text", "url"] if "url" in manifest else ["example_id", "split", "text"]
    assert manifest[same].equals(plain[same])
    assert rejects[["locator", "reason"]].equals(plain_rejects[["locator", "reason"]])



@pytest.mark.parametrize("dataset, key, pack", [
    ("cc", "train_tsv", "gzip"), ("sbu", "captions", "bz2"), ("vcr", "val", "xz"), ("coco", "karpathy", "gzip")])
def test_a_compressed_source_file_is_refused_naming_it(tmp_path, dataset, key, pack):
    """A source kept compressed (``Train_GCC-training.tsv`` gzipped under its own name) was read as
    text: a line file became a few non_utf8 / malformed_row rejects and the ingest exited 0."""
    import bz2
    import gzip
    import lzma

    from helpers.source_fixtures import ingest
    from pipeline.params.parser import load_params

    sets = [*fixture_overrides(tmp_path), "world=real"]
    prefix = f"sources.{dataset}.{key}="
    source = Path(next(s for s in sets if s.startswith(prefix))[len(prefix):])
    packed = tmp_path / "packed" / source.name
    packed.parent.mkdir()
    packed.write_bytes({"gzip": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}[pack](source.read_bytes()))
    params = load_params(REPO / "params.yaml", [*sets, prefix + str(packed)])
    with pytest.raises(SourceFormatError) as err:
        ingest(params, dataset)
    assert str(err.value).startswith(f"{packed}: {pack}-compressed; decompress it")
    assert not (tmp_path / "data" / "manifests" / f"{dataset}.parquet").exists()



@pytest.mark.parametrize("dataset, key, indent", [("vcr", "train", 1), ("nlvr2", "train", None),
                                                  ("snli_ve", "train", None)])
def test_a_json_array_in_place_of_json_lines_is_refused_naming_it(tmp_path, dataset, key, indent):
    """The records saved as one JSON array (pretty-printed or on one line): every line, or the one
    line, became a malformed_row reject, the split was empty and the ingest exited 0."""
    from helpers.source_fixtures import ingest
    from pipeline.params.parser import load_params

    sets = [*fixture_overrides(tmp_path), "world=real"]
    prefix = f"sources.{dataset}.{key}="
    source = Path(next(s for s in sets if s.startswith(prefix))[len(prefix):])
    records = []
    for line in source.read_bytes().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    array = tmp_path / "array" / source.name
    array.parent.mkdir()
    array.write_text(json.dumps([r for r in records if isinstance(r, dict)], indent=indent))
    with pytest.raises(SourceFormatError) as err:
        ingest(load_params(REPO / "params.yaml", [*sets, prefix + str(array)]), dataset)
    assert str(err.value) == f"{array}: a JSON array, expected JSON lines (one object a line)"


# --------------------------------------------------------------------------------------------
# torch checkpoints holding pickled Python objects


class _Planted:
    """Unpickling this object creates ``path`` (what a malicious checkpoint would do, harmlessly)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def _planted_checkpoint(path: Path, sentinel: Path, state: dict) -> Path:
    torch.save({**state, "trigger": _Planted(sentinel)}, path)
    return path


def _assert_refused(err: UnsafeCheckpointError, path: Path, sentinel: Path) -> None:
    text = "".join(traceback.format_exception(err))  # the whole traceback a user would see
    assert str(err).startswith(f"{path}: refused to load as unsafe: ")
    assert "(it names io.open)" in str(err)  # what was refused (open pickles as io.open)
    assert "weights_only" not in text  # torch's advice to retry unsafely is not passed on
    assert not sentinel.exists()  # nothing from the file ran


def test_bert_checkpoint_with_pickled_objects_is_refused_naming_the_file(tmp_path):
    sentinel = tmp_path / "ran"
    folder = tmp_path / "bert"
    folder.mkdir()
    path = _planted_checkpoint(folder / "pytorch_model.bin", sentinel, {"pooler.dense.bias": torch.zeros(4)})
    for given in (path, folder):  # a file, or the directory holding it
        with pytest.raises(UnsafeCheckpointError) as info:
            read_bert_state(given)
        _assert_refused(info.value, path, sentinel)


def test_detector_weights_with_pickled_objects_are_refused_naming_the_file(tmp_path):
    sentinel = tmp_path / "ran"
    path = _planted_checkpoint(tmp_path / "detector.pt", sentinel, {"model": {"w": torch.zeros(2)}, "meta": {}})
    with pytest.raises(UnsafeCheckpointError) as info:
        read_state(path)
    _assert_refused(info.value, path, sentinel)
    torch.load(path, weights_only=False)  # control: loaded unsafely, the file does run code
    assert sentinel.exists()
    plain = tmp_path / "plain.pt"
    torch.save({"model": {"w": torch.ones(2)}, "meta": {"preset": "mini"}}, plain)
    state, meta = read_state(plain)  # a plain tensor file still loads
    assert state["w"].tolist() == [1.0, 1.0] and meta == {"preset": "mini"}


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_plain_pickle_that_is_no_torch_file_is_refused_too(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(pickle.dumps({"w": [1, 2]}, protocol=4))
    with pytest.raises(UnsafeCheckpointError, match="pickle opcode"):
        read_bert_state(path)


# --------------------------------------------------------------------------------------------
# LMDB on a full disk: a real, tiny filesystem


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs mounted below tmp_path (needs root or CAP_SYS_ADMIN; skipped without)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command to create a small filesystem to fill")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a 1 MiB tmpfs to fill (needs root / CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def _items(n: int, size: int = 4000):
    return ((f"{i:08d}", os.urandom(size)) for i in range(n))  # random bytes: nothing to compact


@pytest.mark.parametrize("records, during", [(600, "mdb_txn_commit"),  # 2.4 MB: a commit fails
                                             (180, "mdb_env_copy")])   # 0.7 MB fits once, not twice
def test_lmdb_on_a_full_disk_says_so_and_keeps_nothing(tiny_disk, records, during):
    out = tiny_disk / "coco_train"
    with pytest.raises(DiskFullError) as info:
        write_lmdb(out, _items(records), commit_every=20)
    message = str(info.value)
    assert message.startswith(f"disk full while writing the LMDB {out / '.work'}: ")
    assert f"bytes free on {tiny_disk}" in message and during in message
    assert list(out.iterdir()) == []  # no work dir, no partial copy
    assert shutil.disk_usage(tiny_disk).used < 64 << 10


def test_build_image_db_on_a_full_disk_names_the_db_and_leaves_no_output(tiny_disk, tmp_path):
    from pipeline.stores.image_db_builder import build_image_db

    write_features(tmp_path / "features", "coco", [f"img{i:05d}" for i in range(2500)], seed=0, shard_size=500)
    out = tiny_disk / "db" / "img" / "coco"
    with pytest.raises(DiskFullError, match=r"disk full while writing the LMDB .*/db/img/coco: "):
        build_image_db(tmp_path / "features" / "coco", out, compression="lz4", commit_every=100,
                       params_digest="x")
    assert not out.exists() and list(out.parent.iterdir()) == []  # atomic_dir removed its temp dir


# --------------------------------------------------------------------------------------------
# manifest file mode


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664)])
def test_manifest_gets_the_same_mode_as_the_run_record(tmp_path, umask, mode):
    schema = manifest_schema([])
    row = {"example_id": "x", "dataset": "d", "split": "train", "image_source": "s", "image_id": "i",
           "image_path": "p", "url": None, "text": "t"}
    old = os.umask(umask)
    try:
        with ParquetStreamWriter(tmp_path / "coco.parquet", schema, chunk_rows=4) as writer:
            writer.append(row)
        RunRecord("ingest@coco", "digest").write(tmp_path)
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"coco.parquet": mode, "_run.json": mode}
    assert json.loads((tmp_path / "_run.json").read_text())["stage"] == "ingest@coco"
    assert pq.read_table(tmp_path / "coco.parquet").num_rows == 1
