"""Stage ``import_uniter_db``: UNITER's released LMDBs -> this project's image and text DBs.

Reads ``build_dbs.uniter_release.root`` (``img_db/<dir>/feat_th{conf_th}_max{max_bb}_min{min_bb}[_compressed]``
with its ``nbb_*.json``; ``txt_db/<name>.db`` with ``meta.json`` and ``id2len.json``; formats in
:mod:`pipeline.stores.uniter_release.formats`); writes ``data/db/img/<source>/`` and ``data/db/txt/<name>/``
exactly as ``build_dbs`` would (docs/design.md §9), ``data/db/{img,txt}/_run.json``, and the report
``data/reports/uniter_import/report.{json,md}``: per DB, what was converted and what was skipped and
why. ``build_dbs`` runs this instead of its own build when ``build_dbs.source: uniter_release``.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.common.ownership import check_owned, check_prunable, prune, remove_owned, remove_stale_temps, write_marker
from pipeline.common.runinfo import RUN_FILE, RunRecord, atomic_write_bytes, atomic_write_json
from pipeline.common.source_records import SourceFormatError
from pipeline.params.parser import Params
from pipeline.stores.tokenization import WordPieceTokenizer
from pipeline.stores.uniter_release.formats import feature_db_name, nbb_file_name, release_json
from pipeline.stores.uniter_release.images import (STAGE, ReleaseImageDb, Rule, convert_image_db, find_release_db,
                                                   lmdb_problem)
from pipeline.stores.uniter_release.layout import (IMAGE_DIRS, NOT_CONVERTED_IMAGE_DIRS, NOT_CONVERTED_TEXT_DBS,
                                                   TEXT_SOURCES, TEXT_TARGETS)
from pipeline.stores.uniter_release.texts import check_tokenizer, convert_text_db, release_ids

log = logging.getLogger(__name__)
REPORT_DIR = Path("reports") / "uniter_import"  # under paths.data
STAGING = ".uniter_import.tmp"  # under paths.data/db: every DB is written here first (all or nothing)


def _class_names(path: Path | None) -> list[str] | None:
    """The class names of ``build_dbs.uniter_release.class_names`` (one a line, ``name,...``), or None."""
    if path is None:
        return None
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise SourceFormatError(f"build_dbs.uniter_release.class_names: {path}: {why}; expected one class name "
                                "a line (bottom-up-attention's objects_vocab.txt)") from None
    names = [line.split(",")[0].strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise SourceFormatError(f"build_dbs.uniter_release.class_names: {path} lists no class")
    return names


def _ans2label(path: Path | None, release_txt: Path) -> tuple[dict[str, int] | None, str]:
    """The VQA vocabulary and where it came from (None, why: the VQA DBs are skipped)."""
    candidates = [path] if path is not None else [release_txt / "vqa_train.db" / "ans2label.json"]
    expected = "{answer: label} with labels 0..n-1"
    for p in candidates:
        if p.exists():  # a directory or a damaged file is named, not taken for an absent vocabulary
            vocab = release_json(p, expected)
            labels = list(vocab.values())
            if any(isinstance(v, bool) or not isinstance(v, int) for v in labels) \
                    or sorted(labels) != list(range(len(vocab))):
                raise SourceFormatError(f"{p}: expected {expected}")
            return vocab, str(p)
    return None, "no answer vocabulary: set build_dbs.uniter_release.ans2label (UNITER's utils/ans2label.json)"


@dataclass
class _Plan:
    """What the import will read, found and checked before anything is written."""

    rule: Rule
    image_groups: dict[str, list[ReleaseImageDb]]  # this project's image DB -> release DBs
    text_sources: dict[str, Path]  # release text DB name -> txt_db/<name>.db
    tok: WordPieceTokenizer
    ans2label: dict[str, int] | None
    class_names: list[str] | None
    not_converted: dict[str, dict[str, Any]] = field(default_factory=dict)  # report entries


def _nbb_problem(db: ReleaseImageDb) -> str | None:
    """Why the nbb file of ``db`` cannot be used (None: it maps names to region counts >= 0)."""
    bad = next(((k, v) for k, v in (db.nbb or {}).items() if isinstance(v, bool) or not isinstance(v, int) or v < 0),
               None)
    return None if bad is None else f"entry {bad[0]!r} is {bad[1]!r}, expected a region count (an integer >= 0)"


def _find_release_db(d: Path, rule: Rule) -> ReleaseImageDb | str | None:
    """:func:`find_release_db`, or why its nbb file cannot be read (a problem for :func:`preflight`)."""
    try:
        return find_release_db(d, rule)
    except SourceFormatError as err:
        return str(err)


def preflight(params: Params) -> _Plan:
    """Every check that needs no entry decoded, before anything is written; raises SourceFormatError.

    Folder names (an image directory or text DB this importer does not know is an error listing the
    names it knows), the LMDB and nbb file each image directory holds for the configured rule, every
    text DB's tokenizer ids, the answer vocabulary when VQA DBs are present, the class names.
    """
    rel, cfg = params.build_dbs.uniter_release, params.build_dbs
    if not (rel.root / "img_db").is_dir() and not (rel.root / "txt_db").is_dir():
        raise SourceFormatError(f"build_dbs.uniter_release.root: {rel.root} holds neither img_db/ nor txt_db/ "
                                f"(expected the directory UNITER's download scripts filled)")
    rule = Rule(rel.conf_th, rel.max_bb, rel.min_bb)
    plan = _Plan(rule, {}, {}, WordPieceTokenizer(cfg.tokenizer), None, _class_names(rel.class_names))
    problems, unknown = [], []
    release_img, release_txt = rel.root / "img_db", rel.root / "txt_db"
    for d in sorted(p for p in release_img.iterdir() if p.is_dir()) if release_img.is_dir() else []:
        if NOT_CONVERTED_IMAGE_DIRS.fullmatch(d.name):
            plan.not_converted[f"release:img_db/{d.name}"] = {
                "written": False, "why": "no image DB of this project is made from it (VCR and RefCOCO are not converted)"}
        elif d.name not in IMAGE_DIRS:
            unknown.append(f"img_db/{d.name}")
        elif isinstance(found := _find_release_db(d, rule), str):
            problems.append(found)
        elif found is None:
            held = sorted(p.name for p in d.iterdir() if p.name.startswith("feat_")) or ["no feat_* LMDB"]
            want = feature_db_name(rule.conf_th, rule.max_bb, rule.min_bb)
            problems.append(f"{d}: no {want}[_compressed]/data.mdb (the LMDB of the rule {rule}); it holds {held}: "
                            f"set build_dbs.uniter_release.conf_th, max_bb, min_bb to match")
        elif (bad := _nbb_problem(found)) is not None:
            problems.append(f"{d / nbb_file_name(rule.conf_th, rule.max_bb, rule.min_bb)}: {bad}")
        elif (bad := lmdb_problem(found.lmdb_path)) is not None:
            problems.append(bad)
        else:
            plan.image_groups.setdefault(IMAGE_DIRS[d.name], []).append(found)
    for p in sorted(release_txt.glob("*.db")) if release_txt.is_dir() else []:
        name = p.name[: -len(".db")]
        if NOT_CONVERTED_TEXT_DBS.fullmatch(name):
            plan.not_converted[f"release:txt_db/{p.name}"] = {
                "written": False, "why": "no text DB of this project is made from it (VCR and RefCOCO are not converted)"}
        elif name not in TEXT_SOURCES:
            unknown.append(f"txt_db/{p.name}")
        elif not (p / "data.mdb").is_file():
            problems.append(f"{p}: no data.mdb (an unfinished download or extraction?)")
        elif (bad := lmdb_problem(p)) is not None:
            problems.append(bad)
        else:
            plan.text_sources[name] = p
    if unknown:
        known_img = sorted(IMAGE_DIRS) + [NOT_CONVERTED_IMAGE_DIRS.pattern + " (not converted)"]
        known_txt = [f"{n}.db" for n in sorted(TEXT_SOURCES)] + [NOT_CONVERTED_TEXT_DBS.pattern + " (not converted)"]
        problems.append(f"{rel.root}: {', '.join(unknown)} not known to the importer (renamed?); it knows img_db/ "
                        f"{', '.join(known_img)} and txt_db/ {', '.join(known_txt)}")
    for name, path in plan.text_sources.items():
        try:
            check_tokenizer(path / "meta.json", plan.tok)
            release_ids(path)  # read again when converting: checked here, before anything is written
        except SourceFormatError as err:
            problems.append(str(err))
    vqa = [n for n in plan.text_sources if TEXT_SOURCES[n].task == "vqa"]
    if vqa:
        plan.ans2label, why = _ans2label(rel.ans2label, release_txt)
        if plan.ans2label is None:
            problems.append(f"{', '.join(f'txt_db/{n}.db' for n in vqa)}: {why}")
    if problems:
        raise SourceFormatError("import_uniter_db: nothing written; " + "; ".join(problems))
    return plan


def import_images(params: Params, plan: _Plan, img_root: Path, digest: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Every image DB of ``plan`` below ``img_root``; returns (report per DB name, release image name -> qualified id)."""
    report: dict[str, Any] = {k: v for k, v in plan.not_converted.items() if k.startswith("release:img_db/")}
    images: dict[str, str] = {}
    cfg = params.build_dbs
    for name, dbs in sorted(plan.image_groups.items()):
        report[name], written = convert_image_db(name, dbs, img_root / name, plan.rule, class_names=plan.class_names,
                                                 compression=cfg.compression, commit_every=cfg.commit_every,
                                                 params_digest=digest)
        images.update(written)
    return report, images


def import_texts(params: Params, plan: _Plan, txt_root: Path, images: dict[str, str], digest: str) -> dict[str, Any]:
    """Every text DB of :data:`TEXT_TARGETS` the release has a source of, below ``txt_root``; the report per DB."""
    cfg = params.build_dbs
    report: dict[str, Any] = {k: v for k, v in plan.not_converted.items() if k.startswith("release:txt_db/")}
    for target in TEXT_TARGETS:
        sources = [plan.text_sources[s] for s in target.sources if s in plan.text_sources]
        if not sources:
            continue
        report[target.name] = convert_text_db(
            target, sources, txt_root / target.name, tok=plan.tok, images=images,
            ans2label=plan.ans2label if target.task == "vqa" else None, max_len=cfg.max_txt_len,
            compression=cfg.compression, commit_every=cfg.commit_every, params_digest=digest)
        report[target.name]["missing_release_dbs"] = [s for s in target.sources if s not in plan.text_sources]
    return report


def _publish(staged: Path, final_root: Path, names: list[str]) -> None:
    """Move each staged DB ``staged/<name>`` to ``final_root/<name>``, replacing what was there."""
    final_root.mkdir(parents=True, exist_ok=True)
    for name in names:
        final = final_root / name
        check_owned(final, action="replace")
        old = final.with_name(f".{name}.old.{os.getpid()}") if final.exists() else None
        if old is not None:
            os.replace(final, old)
        os.replace(staged / name, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def report_markdown(report: dict[str, Any]) -> str:
    """A short table: one row per DB (and per release DB left out), with counts and skip reasons."""
    lines = [f"# UNITER release import ({report['root']})", "",
             "| DB | written | converted | skipped (reason: count) | note |", "|---|---|---|---|---|"]
    for kind in ("image_dbs", "text_dbs"):
        for name, entry in sorted(report[kind].items()):
            n = entry.get("images", entry.get("examples", ""))
            skipped = ", ".join(f"{r}: {c}" for r, c in entry.get("skipped", {}).items()) or "-"
            note = entry.get("why") or ", ".join("/".join(Path(p).parts[-2:]) for p in entry.get("release_dbs", []))
            lines.append(f"| {kind[:-4]} `{name}` | {'yes' if entry['written'] else 'no'} | {n} | {skipped} | {note} |")
    lines += ["", "Examples of each skip reason: report.json (`skipped_samples`)."]
    return "\n".join(lines) + "\n"


def run(params: Params) -> dict[str, Any]:
    """Convert the release; returns the report (also written under data/reports/uniter_import/).

    All or nothing: :func:`preflight` checks what it can before reading an entry, then every DB is
    written into a staging folder and moved into ``data/db/`` only when all of them converted, so
    a refusal (an unsafe entry, a class-name count) leaves the DBs of an earlier run as they were.
    """
    rel, data = params.build_dbs.uniter_release, params.paths.data
    plan = preflight(params)
    img_root, txt_root = data / "db" / "img", data / "db" / "txt"
    targets = [(img_root, n) for n in plan.image_groups] + [
        (txt_root, t.name) for t in TEXT_TARGETS if any(s in plan.text_sources for s in t.sources)]
    for root, name in targets:
        check_owned(root / name, action="replace")  # a foreign directory stops the import before any work
        remove_stale_temps(root / name)
    for root in (img_root, txt_root):  # what the import does not write goes at its end (as build_dbs')
        check_prunable(root, [*(n for r, n in targets if r == root), RUN_FILE])
    digest = params.section_digest("build_dbs")
    staging = data / "db" / STAGING
    remove_owned(staging)  # what a killed import left
    staging.mkdir(parents=True)
    write_marker(staging, STAGE)
    try:
        img_report, images = import_images(params, plan, staging / "img", digest)
        txt_report = import_texts(params, plan, staging / "txt", images, digest)
        _publish(staging / "img", img_root, sorted(n for n, e in img_report.items() if e["written"]))
        _publish(staging / "txt", txt_root, sorted(n for n, e in txt_report.items() if e["written"]))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report = {"root": str(rel.root), "image_dbs": img_report, "text_dbs": txt_report}
    out = data / REPORT_DIR
    atomic_write_json(out / "report.json", report)
    atomic_write_bytes(out / "report.md", report_markdown(report).encode("utf-8"))
    n_img, n_txt = (sum(e["written"] for e in part.values()) for part in (img_report, txt_report))
    log.info("import_uniter_db: %d image DBs, %d text DBs written; report %s", n_img, n_txt, out)
    if not n_img + n_txt:  # before the run records: an earlier import's DBs keep theirs
        raise SourceFormatError(f"import_uniter_db: no DB written from {rel.root}; {out / 'report.md'} says why "
                                "for each release DB")
    for root, part in ((img_root, img_report), (txt_root, txt_report)):
        summary = RunRecord(STAGE, digest)
        summary.counts.update({n: e for n, e in part.items() if e["written"]})
        summary.extra["uniter_release"] = str(rel.root)  # a record, not an input digest: the release is ~100 GB
        root.mkdir(parents=True, exist_ok=True)
        prune(root, [*summary.counts, RUN_FILE])  # DVC leaves build_dbs' outputs in place (persist: true)
        summary.write(root, require=[root / n / "data.mdb" for n in summary.counts])
    return report
