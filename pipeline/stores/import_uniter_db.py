"""Stage ``import_uniter_db``: UNITER's released LMDBs -> this project's image and text DBs.

Reads ``build_dbs.uniter_release.root`` (``img_db/<dir>/feat_th{conf_th}_max{max_bb}_min{min_bb}[_compressed]``
with its ``nbb_*.json``; ``txt_db/<name>.db`` with ``meta.json`` and ``id2len.json``; formats in
:mod:`pipeline.stores.uniter_release.formats`); writes ``data/db/img/<source>/`` and ``data/db/txt/<name>/``
exactly as ``build_dbs`` would (docs/design.md §9), ``data/db/{img,txt}/_run.json``, and the report
``data/reports/uniter_import/report.{json,md}``: per DB, what was converted and what was skipped and
why. ``build_dbs`` runs this instead of its own build when ``build_dbs.source: uniter_release``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pipeline.common.ownership import remove_stale_temps
from pipeline.common.runinfo import RunRecord, atomic_write_bytes, atomic_write_json
from pipeline.common.source_records import SourceFormatError
from pipeline.params.parser import Params
from pipeline.stores.tokenization import WordPieceTokenizer
from pipeline.stores.uniter_release.images import STAGE, Rule, convert_image_db, find_release_db
from pipeline.stores.uniter_release.layout import IMAGE_DIRS, TEXT_SOURCES, TEXT_TARGETS
from pipeline.stores.uniter_release.texts import convert_text_db

log = logging.getLogger(__name__)
REPORT_DIR = Path("reports") / "uniter_import"  # under paths.data


def _class_names(path: Path | None) -> list[str] | None:
    if path is None:
        return None
    names = [line.split(",")[0].strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not names:
        raise SourceFormatError(f"build_dbs.uniter_release.class_names: {path} lists no class")
    return names


def _ans2label(path: Path | None, release_txt: Path) -> tuple[dict[str, int] | None, str]:
    """The VQA vocabulary and where it came from (None, why: the VQA DBs are skipped)."""
    candidates = [path] if path is not None else [release_txt / "vqa_train.db" / "ans2label.json"]
    for p in candidates:
        if p.is_file():
            vocab = json.loads(p.read_text(encoding="utf-8"))
            if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(len(vocab))):
                raise SourceFormatError(f"{p}: expected {{answer: label}} with labels 0..n-1")
            return vocab, str(p)
    return None, f"no answer vocabulary: set build_dbs.uniter_release.ans2label (UNITER's utils/ans2label.json)"


def import_images(params: Params, img_root: Path, digest: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Every image DB the release has; returns (report per DB name, release image name -> qualified id)."""
    rel = params.build_dbs.uniter_release
    rule = Rule(rel.conf_th, rel.max_bb, rel.min_bb)
    release_img = rel.root / "img_db"
    report: dict[str, Any] = {}
    groups: dict[str, list] = {}
    for d in sorted(p for p in release_img.iterdir() if p.is_dir()) if release_img.is_dir() else []:
        if d.name not in IMAGE_DIRS:
            report[f"release:img_db/{d.name}"] = {
                "written": False,
                "why": "no image DB of this project is made from it (VCR and RefCOCO image DBs are not converted)"}
            continue
        found = find_release_db(d, rule)
        if found is None:
            report[f"release:img_db/{d.name}"] = {"written": False, "why": f"no LMDB for the rule {rule} in it"}
            continue
        groups.setdefault(IMAGE_DIRS[d.name], []).append(found)
    images: dict[str, str] = {}
    cfg = params.build_dbs
    class_names = _class_names(rel.class_names)
    for name, dbs in sorted(groups.items()):
        remove_stale_temps(img_root / name)
        report[name], written = convert_image_db(name, dbs, img_root / name, rule, class_names=class_names,
                                                 compression=cfg.compression, commit_every=cfg.commit_every,
                                                 params_digest=digest)
        images.update(written)
    return report, images


def import_texts(params: Params, txt_root: Path, images: dict[str, str], digest: str) -> dict[str, Any]:
    """Every text DB of :data:`TEXT_TARGETS` the release has a source of; returns the report per DB."""
    cfg, rel = params.build_dbs, params.build_dbs.uniter_release
    release_txt = rel.root / "txt_db"
    present = {p.name[: -len(".db")]: p for p in sorted(release_txt.glob("*.db")) if (p / "data.mdb").is_file()} \
        if release_txt.is_dir() else {}
    not_converted = "no text DB of this project is made from it (VCR, RefCOCO and unknown DBs are not converted)"
    report: dict[str, Any] = {f"release:txt_db/{n}.db": {"written": False, "why": not_converted}
                              for n in present if n not in TEXT_SOURCES}
    ans2label, vocab_from = _ans2label(rel.ans2label, release_txt)
    tok = WordPieceTokenizer(cfg.tokenizer)
    for target in TEXT_TARGETS:
        sources = [present[s] for s in target.sources if s in present]
        if not sources:
            continue
        if target.task == "vqa" and ans2label is None:
            report[target.name] = {"written": False, "why": vocab_from, "release_dbs": [str(p) for p in sources]}
            continue
        remove_stale_temps(txt_root / target.name)
        report[target.name] = convert_text_db(
            target, sources, txt_root / target.name, tok=tok, images=images,
            ans2label=ans2label if target.task == "vqa" else None, max_len=cfg.max_txt_len,
            compression=cfg.compression, commit_every=cfg.commit_every, params_digest=digest)
        report[target.name]["missing_release_dbs"] = [s for s in target.sources if s not in present]
    return report


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
    """Convert the release; returns the report (also written under data/reports/uniter_import/)."""
    rel, data = params.build_dbs.uniter_release, params.paths.data
    if not (rel.root / "img_db").is_dir() and not (rel.root / "txt_db").is_dir():
        # an input to fix, not a bug: the CLI prints it without a traceback (exit 2)
        raise SourceFormatError(f"build_dbs.uniter_release.root: {rel.root} holds neither img_db/ nor txt_db/ "
                                f"(expected the directory UNITER's download scripts filled)")
    img_root, txt_root = data / "db" / "img", data / "db" / "txt"
    digest = params.section_digest("build_dbs")
    img_report, images = import_images(params, img_root, digest)
    txt_report = import_texts(params, txt_root, images, digest)
    for root, part in ((img_root, img_report), (txt_root, txt_report)):
        summary = RunRecord(STAGE, digest)
        summary.counts.update({n: e for n, e in part.items() if e["written"]})
        summary.extra["uniter_release"] = str(rel.root)  # a record, not an input digest: the release is ~100 GB
        root.mkdir(parents=True, exist_ok=True)
        summary.write(root, require=[root / n / "data.mdb" for n in summary.counts])
    report = {"root": str(rel.root), "image_dbs": img_report, "text_dbs": txt_report}
    out = data / REPORT_DIR
    atomic_write_json(out / "report.json", report)
    atomic_write_bytes(out / "report.md", report_markdown(report).encode("utf-8"))
    log.info("import_uniter_db: %d image DBs, %d text DBs written; report %s",
             sum(e["written"] for e in img_report.values()), sum(e["written"] for e in txt_report.values()), out)
    return report
