"""import_uniter_db on a release whose side files or LMDBs are damaged, as a download cut short or a
hand edit leaves them: one ``error:`` line naming the file, exit status 2, nothing written; and on
odd ``id2len.json`` keys, each imported or skipped with a reason.

The release is written by the writers of test_import_uniter_db.py (UNITER's own formats).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import lmdb
import lz4.frame
import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.fuzz import fuzz_settings
from helpers.uniter_release import FEAT
from pipeline.__main__ import main
from pipeline.stores.tokenization import WordPieceTokenizer

pytestmark = pytest.mark.stage  # runs a pipeline stage

_spec = importlib.util.spec_from_file_location("release_writers", Path(__file__).with_name("test_import_uniter_db.py"))
writers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(writers)

NBB = Path("img_db") / "coco_val2014" / writers.NBB
META = Path("txt_db") / "pretrain_coco_val.db" / "meta.json"
ID2LEN = Path("txt_db") / "pretrain_coco_val.db" / "id2len.json"


def _release(tmp_path: Path) -> tuple[Path, list[str]]:
    """A small release (a COCO image DB, a pretraining and a VQA text DB), its answer vocabulary and
    class names beside it; returns (root, the --set lines that import it)."""
    root = tmp_path / "release"
    writers._small_release(root, WordPieceTokenizer(), vqa=True)
    (tmp_path / "ans2label.json").write_text(json.dumps({"yes": 0, "no": 1}))
    (tmp_path / "classes.txt").write_text("".join(f"class{i}\n" for i in range(writers.C1 - 1)))
    sets = [f"paths.data={tmp_path / 'data'}", f"build_dbs.uniter_release.root={root}",
            f"build_dbs.uniter_release.ans2label={tmp_path / 'ans2label.json'}",
            f"build_dbs.uniter_release.class_names={tmp_path / 'classes.txt'}"]
    return root, sets


def _import(sets: list[str]) -> int:
    args = ["import_uniter_db"]
    for item in sets:
        args += ["--set", item]
    return main(args)


def _dir(path: Path) -> None:
    path.unlink()
    path.mkdir()


DAMAGE = {  # name: (file below tmp_path ("release/..." or a side file), how it is damaged)
    "nbb cut short": ("release" / NBB, lambda p: p.write_text('{"coco_val2014_0000')),
    "nbb a directory": ("release" / NBB, _dir),
    "ans2label cut short": ("ans2label.json", lambda p: p.write_text('{"yes": 0,')),
    "ans2label a text label": ("ans2label.json", lambda p: p.write_text('{"yes": 0, "no": "1"}')),
    "ans2label not UTF-8": ("ans2label.json", lambda p: p.write_bytes('{"caf\xe9": 0, "no": 1}'.encode("latin-1"))),
    "meta.json cut short": ("release" / META, lambda p: p.write_text('{"CLS": 101')),
    "meta.json a list": ("release" / META, lambda p: p.write_text("[]")),
    "id2len.json missing": ("release" / ID2LEN, Path.unlink),
    "id2len.json cut short": ("release" / ID2LEN, lambda p: p.write_text('{"1": ')),
    "id2len.json a list": ("release" / ID2LEN, lambda p: p.write_text("[1]")),
    "id2len.json a number key": ("release" / ID2LEN, lambda p: p.write_text('{1: 3}')),
    "class names not UTF-8": ("classes.txt", lambda p: p.write_bytes("caf\xe9\n".encode("latin-1"))),
    "class names a directory": ("classes.txt", _dir),
    "class names missing": ("classes.txt", Path.unlink),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_side_file_is_one_line_naming_it_and_nothing_is_written(tmp_path, capsys, damage):
    """Each of these was a traceback (a JSON, Unicode or OS error, or an id2len list read as ids) or,
    for id2len.json, read only after the image DB was converted; a directory in place of the nbb
    file was taken for an absent one (the regions counted by the rule instead)."""
    _, sets = _release(tmp_path)
    name, spoil = DAMAGE[damage]
    spoil(tmp_path / name)
    assert _import(sets) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / name}" in err and "Traceback" not in err
    assert not (tmp_path / "data" / "db").exists()


def test_the_undamaged_release_imports_and_a_byte_order_mark_is_no_damage(tmp_path):
    root, sets = _release(tmp_path)
    for path in (root / NBB, root / META, root / ID2LEN, tmp_path / "ans2label.json"):
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert _import(sets) == 0
    assert (tmp_path / "data" / "db" / "txt" / "vqa_val" / "data.mdb").is_file()


@pytest.mark.parametrize("db", [f"img_db/coco_val2014/{FEAT}_compressed", "txt_db/pretrain_coco_val.db"])
@pytest.mark.parametrize("content", [b"", b"\0" * 4096])
def test_a_data_mdb_that_is_no_lmdb_is_named_before_anything_is_written(tmp_path, capsys, db, content):
    """A data.mdb cut to nothing or overwritten was an lmdb.Error traceback, raised after the
    staging folder was made (and, for a text DB, after the image DB was converted)."""
    root, sets = _release(tmp_path)
    (root / db / "data.mdb").write_bytes(content)
    assert _import(sets) == 2
    err = capsys.readouterr().err
    assert f"{root / db}: not a readable LMDB" in err and "Traceback" not in err
    assert not (tmp_path / "data" / "db").exists()


def test_an_import_that_writes_no_db_leaves_the_earlier_run_records(tmp_path, capsys):
    """A release whose every entry is skipped (here: the nbb file asks for more regions than stored)
    is refused after writing its report; it also replaced data/db/{img,txt}/_run.json of the
    earlier import, whose DBs it kept, with records of nothing."""
    root, sets = _release(tmp_path)
    assert _import(sets) == 0
    db = tmp_path / "data" / "db"
    before = {p: p.read_bytes() for p in sorted(db.rglob("*")) if p.is_file()}
    name = writers.coco("val2014", 3)
    (root / NBB).write_text(json.dumps({name: 10**6}))
    assert _import(sets) == 2
    assert "no DB written" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in sorted(db.rglob("*")) if p.is_file()} == before
    report = json.loads((tmp_path / "data" / "reports" / "uniter_import" / "report.json").read_text())
    assert report["image_dbs"]["coco"]["skipped"] == {"too_few_regions": 1}


VOCABULARIES = {  # name: the bytes of a build_dbs.tokenizer file that is no WordPiece vocabulary
    "vocab.txt gzipped": ("vocab.txt", lambda vocab: __import__("gzip").compress(vocab)),
    "vocab.txt without [SEP]": ("vocab.txt", lambda vocab: vocab.replace(b"[SEP]\n", b"")),
    "vocab.txt not UTF-8": ("vocab.txt", lambda vocab: vocab + "caf\xe9\n".encode("latin-1")),
    "tokenizer.json cut short": ("tokenizer.json", lambda vocab: b'{"model": '),
}


@pytest.mark.parametrize("damage", sorted(VOCABULARIES))
def test_a_tokenizer_file_that_is_no_vocabulary_is_one_line_naming_it(tmp_path, capsys, damage):
    """A UnicodeDecodeError, the tokenizers library's bare Exception, a TypeError ("sep_token not
    found") or a ValueError, each with its traceback; the importer reads the tokenizer first."""
    _, sets = _release(tmp_path)
    name, spoil = VOCABULARIES[damage]
    path = tmp_path / name
    path.write_bytes(spoil(WordPieceTokenizer().path.read_bytes()))
    assert _import([*sets, f"build_dbs.tokenizer={path}"]) == 2
    err = capsys.readouterr().err
    assert f"error: build_dbs.tokenizer: {path}: " in err and "Traceback" not in err
    assert not (tmp_path / "data" / "db").exists()


# ---------------------------------------------------------------------------------------------
# id2len.json's keys: the ids the import looks up in the release's LMDB and writes into its own

LMDB_KEY_BYTES = 511  # LMDB's key size limit
QUALIFIED = "pretrain_coco_val:"  # the project's id of release key k: QUALIFIED + k
ODD_KEYS = ["", "\ud800", "a\udfffb", "x" * 511, "x" * 512, "\xe9" * 256, "k" * 494, "k" * 493, "\x00", " ",
            "1" * 5000, "\U0001f4a5", "a:b", "nul\x00x", "\u202e", "0"]
ODD_LENGTHS = [3, 0, -1, None, "3", [3], {"n": 3}, 1e300, True, 2**70]


def _fate(key: str, stored: bool) -> str:
    """What the import must do with an id2len.json key: imported, or the reason it is skipped."""
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 key can name it
        return "bad_key"
    if not 0 < size <= LMDB_KEY_BYTES or len(QUALIFIED.encode()) + size > LMDB_KEY_BYTES:
        return "bad_key"
    return "imported" if stored else "missing_record"


def test_every_id2len_key_is_imported_or_skipped_with_a_reason(tmp_path_factory, capsys):
    """A lone surrogate, an empty key, a key over LMDB's 511 bytes (or one that is over it once
    qualified with its DB's name) was a traceback (UnicodeEncodeError, lmdb.BadValsizeError)."""
    text = st.text(st.characters(exclude_categories=()), max_size=12)
    keys = st.lists(st.one_of(st.sampled_from(ODD_KEYS), text), min_size=1, max_size=4, unique=True)

    @fuzz_settings()
    @given(keys=keys.filter(lambda ks: "1" not in ks), data=st.data())
    def check(keys, data):
        tmp = tmp_path_factory.mktemp("release")
        root, sets = _release(tmp)
        db = root / ID2LEN.parent
        fates = {}
        env = lmdb.open(str(db), map_size=64 << 20)
        with env.begin(write=True) as txn:
            for key in keys:
                stored = data.draw(st.booleans()) and _fate(key, True) != "bad_key"
                if stored or (_fate(key, True) == "bad_key" and 0 < len(key.encode("utf-8", "replace")) <= 511):
                    record = {"input_ids": [2000], "img_fname": writers.coco("val2014", 3)}
                    txn.put(key.encode("utf-8", "surrogatepass"), lz4.frame.compress(msgpack.packb(record)))
                fates[key] = _fate(key, stored)
        env.close()
        id2len = json.loads((root / ID2LEN).read_text())
        id2len |= {key: data.draw(st.sampled_from(ODD_LENGTHS)) for key in keys}
        (root / ID2LEN).write_text(json.dumps(id2len))
        assert _import(sets) == 0
        assert "Traceback" not in capsys.readouterr().err
        report = json.loads((tmp / "data" / "reports" / "uniter_import" / "report.json").read_text())
        entry = report["text_dbs"]["pretrain_indomain_val"]
        want = {r: sum(f == r for f in fates.values()) for r in ("bad_key", "missing_record")}
        assert entry["examples"] == 1 + sum(f == "imported" for f in fates.values()), (fates, entry)
        assert entry.get("skipped", {}) == {r: n for r, n in want.items() if n}, (fates, entry)
        assert all(str(db) in s for s in entry.get("skipped_samples", {}).get("bad_key", []))

    check()
