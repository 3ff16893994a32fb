"""Reasons a row leaves the pipeline (docs/design.md §5), shared by stages, reports and the CLI."""

from __future__ import annotations

# decontamination removals, in priority order: when several apply, the first is the reason
REMOVAL_REASONS = ("eval_split", "coco_id", "flickr_photo_id", "canonical_url", "near_duplicate")

# ingest rejects (data/manifests/<dataset>.rejects.parquet)
REJECT_REASONS = (
    "missing_caption", "missing_field", "malformed_row", "bad_url", "non_utf8",
    "duplicate_id", "missing_image", "unreadable_image", "text_too_long", "bad_label",
)
