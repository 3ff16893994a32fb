"""Reasons a row leaves the pipeline (docs/design.md §5), shared by stages, reports and the CLI, and
the cleaning reports' counts of them read back in the contract's order (decontaminate writes the
reports; ``python -m pipeline report cleaning`` reads them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

# decontamination removals, in priority order: when several apply, the first is the reason
REMOVAL_REASONS = ("eval_split", "coco_id", "flickr_photo_id", "canonical_url", "near_duplicate")

# ingest rejects (data/manifests/<dataset>.rejects.parquet)
REJECT_REASONS = (
    "missing_caption", "missing_field", "malformed_row", "bad_url", "non_utf8",
    "duplicate_id", "missing_image", "unreadable_image", "text_too_long", "bad_label",
)

SUMMARY_FILE = "summary.json"  # decontaminate's flat metrics beside the per-dataset cleaning reports


def ordered(counts: Mapping[str, int], order: Iterable[str]) -> list[tuple[str, int]]:
    """``counts`` items in contract order (``order``), unknown reasons after them, sorted.

    JSON files store keys sorted alphabetically; every rendering goes through this so that a report
    reads the same whether it comes from memory or from its JSON file.
    """
    order = list(order)
    known = [(r, counts[r]) for r in order if r in counts]
    return known + sorted((r, n) for r, n in counts.items() if r not in order)


def removed_by_reason(report: Mapping) -> list[tuple[str, int]]:
    return ordered(report["removed_images"], REMOVAL_REASONS)


def rejected_by_reason(report: Mapping) -> list[tuple[str, int]]:
    return ordered(report["rejected_rows"], REJECT_REASONS)


def load_cleaning_reports(report_dir: Path) -> dict[str, dict]:
    """Dataset -> report dict of every ``<dataset>.json`` in ``report_dir`` (summary excluded)."""
    reports = {}
    for path in sorted(Path(report_dir).glob("*.json")):
        if path.name == SUMMARY_FILE:
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "removed_images" in data and "dataset" in data:
            reports[data["dataset"]] = data
    return reports
