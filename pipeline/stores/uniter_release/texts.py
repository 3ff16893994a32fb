"""The release's text LMDBs -> this project's text DBs (docs/design.md §9).

A project DB merges the release DBs its :class:`~pipeline.stores.uniter_release.layout.TextTarget` names;
example ids become ``<release db>:<release id>`` so merged DBs never collide. Each record keeps
``input_ids`` (i32, cut to ``build_dbs.max_txt_len`` and counted), gets ``image_ids`` qualified
through the images the image import wrote, and its task target in this project's fields:
VQA ``target {labels, scores}`` -> ``answer_labels`` i32 / ``answer_scores`` f32 (+ ``question_id``),
NLVR2 ``target`` 1/0/None -> ``label`` 1/0/-1, VE ``target {labels: [k]}`` -> ``label`` in
SNLI_LABELS order (-1 when absent). The release's tokenizer ids (meta.json ``CLS``, ``SEP``,
``MASK``, ``UNK``, ``v_range``) must be those of ``build_dbs.tokenizer``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from pipeline.common.progress import track
from pipeline.common.ownership import atomic_dir
from pipeline.common.runinfo import RunRecord, atomic_write_json
from pipeline.common.source_records import SourceFormatError
from pipeline.stores.lmdb_store import (ID2LEN_FILE, IMG2TXTS_FILE, MAX_KEY_BYTES, META_FILE, TXT2IMG_FILE,
                                        TXT_DB_KIND, LmdbWriter, encode_value, text_length)
from pipeline.stores.text_db_builder import SNLI_LABELS
from pipeline.stores.tokenization import WordPieceTokenizer
from pipeline.stores.uniter_release.formats import EntryFormatError, decode_text_entry, release_json
from pipeline.stores.uniter_release.images import STAGE, SkipLog
from pipeline.stores.uniter_release.layout import VE_LABEL_MAP, TextTarget

log = logging.getLogger(__name__)
# the release's meta.json key -> this tokenizer's special_ids key
SPECIAL_KEYS = {"CLS": "cls", "SEP": "sep", "MASK": "mask", "UNK": "unk"}
TASK_META = {"nlvr2": {"label_names": ["False", "True"]}, "snli_ve": {"label_names": list(SNLI_LABELS)}}


def check_tokenizer(meta_path: Path, tok: WordPieceTokenizer) -> dict[str, Any]:
    """The release DB's meta.json, after checking its token ids against ``tok``; raises naming the key."""
    meta = release_json(meta_path, "the release's token ids {CLS, SEP, MASK, v_range}")
    for key, ours in SPECIAL_KEYS.items():
        if key not in meta:
            if key == "UNK":  # older release DBs do not record it
                continue
            raise SourceFormatError(f"{meta_path}: no key {key!r}; expected the release's token ids "
                                    f"(CLS, SEP, MASK, v_range)")
        if meta[key] != tok.special_ids[ours]:
            raise SourceFormatError(f"{meta_path}: {key} = {meta[key]!r}, but build_dbs.tokenizer ({tok.name}) has "
                                    f"[{key}] = {tok.special_ids[ours]}: set build_dbs.tokenizer to the vocabulary "
                                    f"the release was tokenized with ({meta.get('toker', meta.get('tokenizer'))!r})")
    v_range = meta.get("v_range")
    if not (isinstance(v_range, (list, tuple)) and len(v_range) == 2 and v_range[1] == tok.vocab_size):
        raise SourceFormatError(f"{meta_path}: v_range = {v_range!r}, expected [first word id, {tok.vocab_size}] "
                                f"(the vocabulary size of build_dbs.tokenizer {tok.name})")
    return meta


def _is_int(value: Any) -> bool:
    """An integer of msgpack or numpy, not a bool (``True`` is no token id or label)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _int_list(value: Any) -> list[int] | None:
    """``value`` as a list of Python ints when it is a list (or 1-d integer array) of integers, else None."""
    if isinstance(value, np.ndarray):
        value = value.tolist() if value.ndim == 1 and value.dtype.kind in "iu" else None
    if not isinstance(value, (list, tuple)) or not all(_is_int(i) for i in value):
        return None
    return [int(i) for i in value]


def release_ids(db: Path) -> list[str]:
    """The example ids of release text DB ``db`` (the keys of its ``id2len.json``)."""
    return list(release_json(db / ID2LEN_FILE, "a JSON object {example id: text length}"))


def _input_ids(value: Any, vocab: int, where: str) -> np.ndarray:
    ids = _int_list(value)
    if ids is None:
        raise EntryFormatError("bad_field", f"{where}: input_ids is {type(value).__name__}, expected a list of int")
    if not ids or min(ids) < 0 or max(ids) >= vocab:  # checked as Python ints: 2**64 - 1 fits no int64
        raise EntryFormatError("bad_field", f"{where}: input_ids empty or outside [0, {vocab})")
    return np.asarray(ids, dtype=np.int32)


def _labels_scores(target: Any, where: str) -> tuple[list[int], list[float]]:
    if target is None:
        return [], []
    labels = _int_list(target.get("labels", [])) if isinstance(target, dict) else None
    scores = target.get("scores", []) if isinstance(target, dict) else None
    if isinstance(scores, np.ndarray):
        scores = scores.tolist() if scores.ndim == 1 and scores.dtype.kind in "fiu" else None
    numbers = isinstance(scores, (list, tuple)) and all(
        isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_)) for x in scores)
    if labels is None or not numbers or len(labels) != len(scores):
        raise EntryFormatError("bad_field",
                               f"{where}: target is {target!r}"[:300] + ", expected {labels: [int], scores: [float]}")
    return labels, [float(x) for x in scores]


def task_fields(task: str, rec: dict[str, Any], key: str, num_answers: int, where: str) -> dict[str, Any]:
    """The release record's target -> this project's fields for ``task``."""
    if task == "vqa":
        labels, scores = _labels_scores(rec.get("target"), where)
        if any(not 0 <= lab < num_answers for lab in labels):
            raise EntryFormatError("bad_field", f"{where}: answer label outside the {num_answers} answers of ans2label")
        return {"question_id": str(rec.get("question_id", key)), "answer_labels": np.asarray(labels, np.int32),
                "answer_scores": np.asarray(scores, np.float32)}
    if task == "nlvr2":
        target = rec.get("target")
        if not (target is None or (isinstance(target, (int, np.integer)) and target in (0, 1))):  # an array too
            raise EntryFormatError("bad_field", f"{where}: target is {target!r}, expected 1, 0 or null")
        return {"label": -1 if target is None else int(target)}
    if task == "snli_ve":
        labels, scores = _labels_scores(rec.get("target"), where)
        if any(lab not in VE_LABEL_MAP for lab in labels):
            raise EntryFormatError("bad_field", f"{where}: VE label outside {sorted(VE_LABEL_MAP)}")
        best = labels[int(np.argmax(scores))] if labels else None
        return {"label": -1 if best is None else VE_LABEL_MAP[best]}
    return {}


def _images(rec: dict[str, Any], layout: str, images: dict[str, str], where: str) -> list[str] | None:
    """Qualified ids of the record's ``img_fname`` (None: one is not in the imported image DBs)."""
    names = rec.get("img_fname")
    names = [names] if isinstance(names, str) else names
    want = 2 if layout == "pair" else 1
    if not isinstance(names, (list, tuple)) or len(names) != want or not all(isinstance(n, str) for n in names):
        raise EntryFormatError("bad_field", f"{where}: img_fname is {names!r}, expected {want} image name(s)")
    found = [images.get(n) for n in names]
    return None if None in found else found


def key_problem(key: str, eid: str) -> str | None:
    """Why the id2len.json key ``key`` (this project's id ``eid``) cannot be an LMDB key, or None."""
    try:
        size, qualified = len(key.encode("utf-8")), len(eid.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate): no UTF-8 LMDB key can name it"
    if not 0 < size <= MAX_KEY_BYTES:
        return f"has {size} bytes, expected 1 to {MAX_KEY_BYTES} (LMDB's key size)"
    if qualified > MAX_KEY_BYTES:
        return f"becomes id {eid[:40]!r}... of {qualified} bytes here, over LMDB's {MAX_KEY_BYTES}"
    return None


def _shown(key: str) -> str:
    return repr(key) if len(key) <= 60 else f"{key[:40]!r}... ({len(key)} characters)"


def _example(target: TextTarget, txn: Any, path: Path, key: str, eid: str, *, vocab: int,
             images: dict[str, str], num_answers: int, max_len: int) -> tuple[dict[str, Any], bool]:
    """Release entry ``key`` of ``txn`` -> (this project's record ``eid``, whether its text was cut to ``max_len``).

    Raises :class:`EntryFormatError` (``bad_key``, ``missing_record``, ``unreadable``, ``bad_field``,
    ``missing_image``).
    """
    if (bad := key_problem(key, eid)) is not None:
        raise EntryFormatError("bad_key", f"{path / ID2LEN_FILE}: key {_shown(key)} {bad}")
    where = f"{path}: entry {key!r}"
    buf = txn.get(key.encode("utf-8"))
    if buf is None:
        raise EntryFormatError("missing_record", f"{where} is in id2len.json but not in the LMDB")
    rec = decode_text_entry(buf, db=path, key=key)
    ids = _input_ids(rec.get("input_ids"), vocab, where)
    qualified = _images(rec, target.image_layout, images, where)
    if qualified is None:
        raise EntryFormatError("missing_image", f"{where}: image(s) {rec.get('img_fname')!r} not imported")
    value = {"input_ids": ids[:max_len], "image_ids": qualified,
             **task_fields(target.task, rec, key, num_answers, where)}
    return value, len(ids) > max_len


def convert_text_db(target: TextTarget, release_dbs: list[Path], out_dir: Path, *, tok: WordPieceTokenizer,
                    images: dict[str, str], ans2label: dict[str, int] | None, max_len: int, compression: str,
                    commit_every: int, params_digest: str) -> dict[str, Any]:
    """Write text DB ``target.name`` at ``out_dir`` from ``release_dbs`` (``txt_db/<name>.db`` dirs).

    Returns its report entry; when no example converts, nothing is written."""
    skips, truncated = SkipLog(), 0
    paths = {p.stem: p for p in release_dbs}
    metas = {name: check_tokenizer(p / "meta.json", tok) for name, p in paths.items()}
    envs = {p.stem: lmdb.open(str(p), readonly=True, lock=False, readahead=False, subdir=True, max_readers=1)
            for p in release_dbs}
    num_answers = len(ans2label) if ans2label is not None else 0
    id2len, txt2img, img2txts = {}, {}, {}
    try:
        txns = {name: env.begin(buffers=True) for name, env in envs.items()}
        order = sorted((f"{p.stem}:{k}", p.stem, k) for p in release_dbs for k in release_ids(p))
        run = RunRecord(STAGE, params_digest)
        with atomic_dir(out_dir, stage=STAGE) as tmp:
            writer = LmdbWriter(tmp / ".work", commit_every=commit_every, name=str(out_dir))
            try:
                for eid, src, key in track(order, desc=f"import text DB {target.name}", unit="ex", mininterval=2.0):
                    try:
                        value, cut = _example(target, txns[src], paths[src], key, eid, vocab=tok.vocab_size,
                                              images=images, num_answers=num_answers, max_len=max_len)
                    except EntryFormatError as err:
                        skips.add(err.reason, str(err))
                        continue
                    truncated += cut
                    writer.put(eid, encode_value(value, compression))
                    id2len[eid] = text_length(value)
                    txt2img[eid] = value["image_ids"]
                    for q in value["image_ids"]:
                        img2txts.setdefault(q, []).append(eid)
                if not id2len:
                    raise _Empty()
                writer.finish(tmp)
            except BaseException:
                writer.abort()
                raise
            _write_side_files(tmp, target, tok, metas, id2len, txt2img, img2txts, ans2label,
                              max_len=max_len, truncated=truncated, skips=skips, compression=compression)
            run.counts.update(examples=len(id2len), truncated=truncated, **skips.as_dict())
            run.write(tmp)
    except _Empty:
        return {"written": False, "why": "no example could be converted", "examples": 0,
                "release_dbs": [str(p) for p in release_dbs], **skips.as_dict()}
    finally:
        for env in envs.values():
            env.close()
    log.info("text DB %s: %d examples imported, %d skipped", target.name, len(id2len), sum(skips.counts.values()))
    return {"written": True, "release_dbs": [str(p) for p in release_dbs], "examples": len(id2len),
            "truncated": truncated, **skips.as_dict()}


class _Empty(Exception):
    """No example of a text DB converted: nothing is written for it."""


def _write_side_files(tmp: Path, target: TextTarget, tok: WordPieceTokenizer, metas: dict[str, dict], id2len: dict,
                      txt2img: dict, img2txts: dict, ans2label: dict[str, int] | None, *, max_len: int,
                      truncated: int, skips: SkipLog, compression: str) -> None:
    lens = np.fromiter(id2len.values(), dtype=np.int64)
    img_dbs = sorted({q.partition("/")[0] for ids in txt2img.values() for q in ids})
    extra = dict(TASK_META.get(target.task, {}))
    if target.task == "vqa":
        extra["num_answers"] = len(ans2label)
        atomic_write_json(tmp / "ans2label.json", ans2label)
    meta = {"kind": TXT_DB_KIND, "name": target.name, "task": target.task, "split": target.split,
            "datasets": sorted(metas), **tok.meta(), "max_txt_len": max_len, "img_db": img_dbs,
            "image_layout": target.image_layout, "num_examples": len(id2len), "truncated": truncated,
            "dropped": dict(sorted(skips.counts.items())), "build": {"compression": compression},
            "length": {"mean": round(float(lens.mean()), 3), "max": int(lens.max())},
            "source": {"uniter_release": {name: {k: m.get(k) for k in ("CLS", "SEP", "MASK", "UNK", "v_range", "toker")}
                                          for name, m in sorted(metas.items())}}, **extra}
    atomic_write_json(tmp / META_FILE, meta)
    atomic_write_json(tmp / ID2LEN_FILE, id2len, indent=None)
    atomic_write_json(tmp / TXT2IMG_FILE, txt2img, indent=None)
    atomic_write_json(tmp / IMG2TXTS_FILE, {k: sorted(v) for k, v in img2txts.items()}, indent=None)
