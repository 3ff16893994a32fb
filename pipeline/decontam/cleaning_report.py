"""Cleaning report rendering: JSON (the contract), Markdown, HTML with an offline chart and thumbnails.

Per dataset, in ``<data>/reports/cleaning/``:

- ``<dataset>.json``: docs/design.md §7 exactly (the data; the CLI and tests read it)
- ``<dataset>.md``: counts, removals and rejects by reason, sample removed images
- ``<dataset>.html``: the same plus ``<dataset>.reasons.svg`` (bar chart rendered with matplotlib,
  so no web access is needed) and inline thumbnails of sample removed images beside the eval
  images they matched
- ``summary.json``: flat numeric metrics of every dataset (a DVC metrics file)

Everything is deterministic: same report, same bytes (sorted keys, fixed SVG ids, no dates).
"""

from __future__ import annotations

import base64
import html
import io
import re
from pathlib import Path
from typing import Iterable, Mapping

from pipeline.common.runinfo import atomic_write_bytes, atomic_write_json
from pipeline.common.reasons import REMOVAL_REASONS, SUMMARY_FILE, rejected_by_reason, removed_by_reason

CHART_SUFFIX = ".reasons.svg"
THUMB_PX = 128
MAX_EVAL_THUMBS = 3
# characters Markdown acts on inside a table cell: escapes, code spans, emphasis, links, cell breaks
_MD_ACTIVE = re.compile(r"([\\`*_\[\]|])")


def pick_samples(removed: list[dict], n: int) -> list[dict]:
    """Up to ``n`` removed entries, taken round-robin over reasons (priority order) so each shows."""
    by_reason: dict[str, list[dict]] = {}
    for entry in removed:
        by_reason.setdefault(entry["reason"], []).append(entry)
    queues = [by_reason[r] for r in REMOVAL_REASONS if r in by_reason]
    queues += [q for r, q in sorted(by_reason.items()) if r not in REMOVAL_REASONS]
    picked: list[dict] = []
    depth = 0
    while len(picked) < n and any(depth < len(q) for q in queues):
        for queue in queues:
            if depth < len(queue) and len(picked) < n:
                picked.append(queue[depth])
        depth += 1
    return picked


def thumbnail_data_uri(path: str | Path | None, size: int = THUMB_PX) -> str | None:
    """A JPEG data URI of the image at ``path`` scaled to fit ``size`` px, or None if unreadable.

    JPEG keeps a report with dozens of thumbnails small (~4 KB each instead of ~18 KB as PNG); the
    encoder is deterministic, so the page bytes are too.
    """
    if path is None:
        return None
    from PIL import Image

    from pipeline.common.image_io import ImageRejected, decode_image

    try:
        image = Image.fromarray(decode_image(path))
    except ImageRejected:
        return None
    image.thumbnail((size, size), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def render_chart_svg(report: Mapping) -> bytes:
    """Bar charts of removed images and rejected rows by reason, as deterministic SVG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.ticker import MaxNLocator

    panels = [("removed images", removed_by_reason(report), "#c0392b"),
              ("rejected rows", rejected_by_reason(report), "#7f8c8d")]
    # text stays text (fonttype none) and the layout is fixed: both are much cheaper than outlines
    # and tight_layout, and the ids are salted so the bytes never change
    with matplotlib.rc_context({"svg.hashsalt": "uniter-pipeline", "svg.fonttype": "none", "font.size": 9}):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
        fig.subplots_adjust(left=0.13, right=0.98, wspace=0.45, top=0.88, bottom=0.12)
        for ax, (title, counts, colour) in zip(axes, panels):
            names = [name for name, _ in counts]
            values = [value for _, value in counts]
            bars = ax.barh(names[::-1], values[::-1], color=colour)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.bar_label(bars, padding=2)
            ax.set_title(f"{report['dataset']}: {title}")
            ax.set_xlim(0, max(values + [1]) * 1.2)
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
        plt.close(fig)
    return buf.getvalue()


def _count_rows(report: Mapping) -> list[tuple[str, int]]:
    return [
        ("input rows", report["input_rows"]),
        ("input images", report["input_images"]),
        ("kept rows", report["kept_rows"]),
        ("kept images", report["kept_images"]),
        ("removed rows", report["removed_rows"]),
        ("removed images", sum(report["removed_images"].values())),
        ("rejected rows", sum(report["rejected_rows"].values())),
    ]


def md_text(value: object) -> str:
    """Input text (a URL, an image id) as inert Markdown on one line: HTML-escaped, so a
    ``<script>`` URL shows as text where renderers allow HTML, and Markdown syntax backslash-escaped,
    so a ``|`` or a backtick cannot break a table cell or open a code span."""
    text = html.escape(re.sub(r"[\r\n]+", " ", str(value)), quote=False)
    return _MD_ACTIVE.sub(r"\\\1", text)


def render_markdown(report: Mapping, samples: list[dict]) -> str:
    """The report as Markdown: counts, reasons, and a table of sample removed images.

    Text that came from the inputs (dataset name, image ids, URLs, matched eval refs) goes through
    :func:`md_text`; counts and reason names are ours.
    """
    ds = md_text(report["dataset"])
    lines = [f"# Cleaning report: {ds}", "",
             "input_rows = kept_rows + removed_rows + rejected_rows "
             f"({report['input_rows']} = {report['kept_rows']} + {report['removed_rows']} + "
             f"{sum(report['rejected_rows'].values())})", "",
             "| count | value |", "|---|---:|"]
    lines += [f"| {name} | {value} |" for name, value in _count_rows(report)]
    for title, counts in (("Removed images by reason", removed_by_reason(report)),
                          ("Rejected rows by reason (ingest)", rejected_by_reason(report))):
        lines += ["", f"## {title}", "", "| reason | count |", "|---|---:|"]
        lines += [f"| {r} | {n} |" for r, n in counts]
    lines += ["", f"## Sample removed images ({len(samples)} of {len(report['removed'])})", ""]
    if samples:
        lines += ["| image_id | reason | url | matched_eval |", "|---|---|---|---|"]
        for s in samples:
            cells = [md_text(s["image_id"]), s["reason"], md_text(s["url"] or ""),
                     md_text(", ".join(s["matched_eval"]))]
            lines.append("| " + " | ".join(cells) + " |")
    else:
        lines.append("No image was removed.")
    return "\n".join(lines) + "\n"


_STYLE = """body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}td.n{text-align:right}
.pair{display:flex;gap:8px;align-items:flex-start}.pair figure{margin:0;font-size:80%;max-width:140px;word-break:break-all}"""


def _html_table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td class="n">{v}</td>' if isinstance(v, int) else f"<td>{html.escape(str(v))}</td>"
                         for v in row) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _figure(uri: str | None, caption: str) -> str:
    img = f'<img src="{uri}" alt="{html.escape(caption)}">' if uri else "<em>(no image on disk)</em>"
    return f"<figure>{img}<figcaption>{html.escape(caption)}</figcaption></figure>"


def render_html(report: Mapping, samples: list[dict], *, chart_file: str, eval_paths: Mapping[str, str],
                ref_images: Mapping[str, str]) -> str:
    """The report as a self-contained HTML page (the chart is the sibling file ``chart_file``).

    ``samples`` carry ``image_path``; ``ref_images`` maps an eval ref to its image key and
    ``eval_paths`` an image key to its file, so each sample shows beside what it matched.
    """
    ds = html.escape(report["dataset"])
    parts = [f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>Cleaning report: {ds}</title>",
             f"<style>{_STYLE}</style></head><body><h1>Cleaning report: {ds}</h1>",
             _html_table(["count", "value"], _count_rows(report)),
             f'<p><img src="{html.escape(chart_file)}" alt="counts by reason"></p>',
             "<h2>Removed images by reason</h2>", _html_table(["reason", "images"], removed_by_reason(report)),
             "<h2>Rejected rows by reason (ingest)</h2>", _html_table(["reason", "rows"], rejected_by_reason(report)),
             f"<h2>Sample removed images ({len(samples)} of {len(report['removed'])})</h2>"]
    rows = []
    for s in samples:
        pair = [_figure(thumbnail_data_uri(s.get("image_path")), f"removed {s['image_id']}")]
        for ref in s["matched_eval"][:MAX_EVAL_THUMBS]:
            path = eval_paths.get(ref_images.get(ref, ""))
            pair.append(_figure(thumbnail_data_uri(path), ref))
        more = len(s["matched_eval"]) - MAX_EVAL_THUMBS
        rows.append(
            f"<tr><td>{html.escape(s['reason'])}</td><td>{html.escape(s['url'] or '')}</td>"
            f"<td><div class=\"pair\">{''.join(pair)}</div>{f'<p>+{more} more</p>' if more > 0 else ''}</td></tr>"
        )
    if rows:
        parts.append("<table><tr><th>reason</th><th>url</th><th>removed image | matched eval image(s)</th></tr>"
                     + "".join(rows) + "</table>")
    else:
        parts.append("<p>No image was removed.</p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_cleaning_report(out_dir: Path, report: Mapping, samples: list[dict], *,
                          eval_paths: Mapping[str, str], ref_images: Mapping[str, str]) -> list[Path]:
    """Write ``<dataset>.json``, ``.md``, ``.html`` and the chart into ``out_dir``; return their paths."""
    out_dir = Path(out_dir)
    ds = report["dataset"]
    paths = [out_dir / f"{ds}.json", out_dir / f"{ds}.md", out_dir / f"{ds}.html", out_dir / f"{ds}{CHART_SUFFIX}"]
    atomic_write_json(paths[0], dict(report))
    atomic_write_bytes(paths[1], render_markdown(report, samples).encode("utf-8"))
    page = render_html(report, samples, chart_file=paths[3].name, eval_paths=eval_paths, ref_images=ref_images)
    atomic_write_bytes(paths[2], page.encode("utf-8"))
    atomic_write_bytes(paths[3], render_chart_svg(report))
    return paths


def summary_metrics(reports: Iterable[Mapping]) -> dict[str, int]:
    """Flat numeric metrics ``<dataset>_<count>`` (and ``total_<count>``) for DVC."""
    out: dict[str, int] = {}
    totals: dict[str, int] = {}
    for rep in reports:
        values = {
            "input_rows": rep["input_rows"], "input_images": rep["input_images"],
            "kept_rows": rep["kept_rows"], "kept_images": rep["kept_images"],
            "removed_rows": rep["removed_rows"], "removed_images": sum(rep["removed_images"].values()),
            "rejected_rows": sum(rep["rejected_rows"].values()),
            **{f"removed_{r}": n for r, n in rep["removed_images"].items()},
        }
        for key, value in values.items():
            out[f"{rep['dataset']}_{key}"] = value
            totals[key] = totals.get(key, 0) + value
    out.update({f"total_{k}": v for k, v in totals.items()})
    return out


def write_summary(out_dir: Path, reports: Iterable[Mapping]) -> dict[str, int]:
    """Write ``summary.json`` (flat numeric metrics) into ``out_dir`` and return it."""
    metrics = summary_metrics(reports)
    atomic_write_json(Path(out_dir) / SUMMARY_FILE, metrics)
    return metrics
