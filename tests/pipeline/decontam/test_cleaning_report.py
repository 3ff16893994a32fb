"""Cleaning report rendering: Markdown, HTML (chart + thumbnails), summary metrics, determinism."""

from __future__ import annotations

import base64
import html
import io
import json
import re
import xml.etree.ElementTree as ET

import numpy as np
from PIL import Image

from pipeline.decontam import cleaning_report
from pipeline.common.reasons import REJECT_REASONS, REMOVAL_REASONS, load_cleaning_reports


def make_report(dataset: str = "cc", removed: list[dict] | None = None) -> dict:
    removed = removed if removed is not None else [
        {"image_id": "a1", "url": "http://x.org/a|1.jpg", "reason": "canonical_url", "matched_eval": ["coco/test/4"]},
        {"image_id": "b2", "url": None, "reason": "eval_split", "matched_eval": ["coco/test/9", "refcoco/val/9"]},
        {"image_id": "c3", "url": "http://y.org/<c>.jpg", "reason": "near_duplicate",
         "matched_eval": ["nlvr2/dev/x-img0", "nlvr2/dev/x-img1", "vcr/val/f.jpg", "vcr/test/g.jpg"]},
    ]
    counts = {r: sum(e["reason"] == r for e in removed) for r in REMOVAL_REASONS}
    return {"dataset": dataset, "input_rows": 20, "input_images": 12, "kept_rows": 12, "kept_images": 9,
            "removed_rows": 5, "removed_images": counts, "removed": removed,
            "rejected_rows": {r: (3 if r == "bad_url" else 0) for r in REJECT_REASONS}}


def _image(path, seed):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)).save(path)
    return str(path)


def test_pick_samples_round_robins_over_reasons_in_priority_order():
    removed = ([{"reason": "eval_split", "i": i} for i in range(5)] + [{"reason": "canonical_url", "i": 0}]
               + [{"reason": "near_duplicate", "i": i} for i in range(2)])
    picked = cleaning_report.pick_samples(removed, 5)
    assert [(p["reason"], p["i"]) for p in picked] == [
        ("eval_split", 0), ("canonical_url", 0), ("near_duplicate", 0), ("eval_split", 1), ("near_duplicate", 1)]
    assert len(cleaning_report.pick_samples(removed, 100)) == len(removed)
    assert cleaning_report.pick_samples([], 3) == []


def test_markdown_lists_counts_reasons_and_escaped_samples():
    rep = make_report()
    md = cleaning_report.render_markdown(rep, rep["removed"][:2])
    assert "input_rows = kept_rows + removed_rows + rejected_rows (20 = 12 + 5 + 3)" in md
    assert "| removed images | 3 |" in md and "| bad_url | 3 |" in md
    assert "| a1 | canonical_url | http://x.org/a\\|1.jpg | coco/test/4 |" in md  # '|' escaped in a cell
    assert "Sample removed images (2 of 3)" in md
    # reasons in contract order whether the report came from memory or from its sorted JSON
    reloaded = json.loads(json.dumps(rep, sort_keys=True))
    assert cleaning_report.render_markdown(reloaded, rep["removed"][:2]) == md
    order = [line.split("|")[1].strip() for line in md.splitlines() if line.split("|")[1:2]
             and line.split("|")[1].strip() in REMOVAL_REASONS]
    assert order == list(REMOVAL_REASONS)


def test_markdown_shows_hostile_urls_as_text_and_keeps_the_table(tmp_path):
    from markdown_it import MarkdownIt

    url = "http://evil.example/<script>alert(1)</script>?a=1|b=`x`&c=[l](j)"
    rep = make_report(removed=[{"image_id": "i|d<b>", "url": url, "reason": "canonical_url",
                                "matched_eval": ["coco/test/4"]}])
    cleaning_report.write_cleaning_report(tmp_path, rep, rep["removed"], eval_paths={}, ref_images={})
    md = (tmp_path / "cc.md").read_text()
    assert "<script" not in md and "<b>" not in md
    # rendered by CommonMark with tables and raw HTML allowed: the URL is text in its own cell
    page = MarkdownIt("commonmark").enable("table").render(md)
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    last_table = page.rsplit("<table>", 1)[1]
    cells = re.findall(r"<td>(.*?)</td>", last_table.split("<tbody>", 1)[1], re.S)
    assert len(cells) == 4, cells
    assert cells[0] == "i|d&lt;b&gt;" and cells[1] == "canonical_url"
    assert html.unescape(cells[2]) == url and "<a " not in cells[2]  # no link, no code span
    # the .html page escapes the same URL
    assert "<script" not in (tmp_path / "cc.html").read_text()


def test_html_shows_chart_and_thumbnails_beside_the_matched_eval_image(tmp_path):
    rep = make_report()
    samples = [dict(e) for e in rep["removed"]]
    samples[0]["image_path"] = _image(tmp_path / "removed.png", 1)
    samples[2]["image_path"] = str(tmp_path / "gone.png")  # missing on disk: a placeholder, no crash
    eval_paths = {"coco\x1f4": _image(tmp_path / "eval.png", 2), "nlvr2\x1fx-img0": _image(tmp_path / "n.png", 3)}
    ref_images = {"coco/test/4": "coco\x1f4", "nlvr2/dev/x-img0": "nlvr2\x1fx-img0"}
    page = cleaning_report.render_html(rep, samples, chart_file="cc.reasons.svg", eval_paths=eval_paths,
                               ref_images=ref_images)
    assert '<img src="cc.reasons.svg"' in page
    uris = re.findall(r'src="data:image/jpeg;base64,([^"]+)"', page)
    assert len(uris) == 3  # removed a1 + its eval match, and c3's first eval match
    thumb = Image.open(io.BytesIO(base64.b64decode(uris[0])))
    assert max(thumb.size) <= cleaning_report.THUMB_PX and thumb.size == (60, 40)  # small images are not enlarged
    assert "+1 more" in page  # c3 matched 4 eval images, 3 are shown
    assert "http://y.org/&lt;c&gt;.jpg" in page and "<c>" not in page  # escaped
    # b2: no image_path and 2 refs without paths; c3: its file is gone and 2 of its 3 shown refs lack paths
    assert page.count("(no image on disk)") == 3 + 3
    assert page.count("<figure>") == 2 + 3 + 4


def test_chart_is_valid_svg_and_byte_stable():
    rep = make_report()
    svg = cleaning_report.render_chart_svg(rep)
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")
    text = svg.decode()
    for reason in REMOVAL_REASONS + ("bad_url",):
        assert reason in text
    assert cleaning_report.render_chart_svg(json.loads(json.dumps(rep, sort_keys=True))) == svg
    assert "<dc:date>" not in text


def test_write_cleaning_report_and_summary(tmp_path):
    reps = [make_report("cc"), make_report("sbu", removed=[])]
    for rep in reps:
        paths = cleaning_report.write_cleaning_report(tmp_path, rep, cleaning_report.pick_samples(rep["removed"], 2),
                                              eval_paths={}, ref_images={})
        assert [p.name for p in paths] == [f"{rep['dataset']}{s}" for s in (".json", ".md", ".html", ".reasons.svg")]
    assert json.loads((tmp_path / "cc.json").read_text()) == reps[0]
    assert "No image was removed." in (tmp_path / "sbu.html").read_text()
    metrics = cleaning_report.write_summary(tmp_path, reps)
    assert json.loads((tmp_path / "summary.json").read_text()) == metrics
    assert metrics["cc_input_rows"] == 20 and metrics["cc_removed_images"] == 3
    assert metrics["cc_removed_near_duplicate"] == 1 and metrics["sbu_removed_images"] == 0
    assert metrics["total_rejected_rows"] == 6 and metrics["total_removed_rows"] == 10
    assert all(isinstance(v, int) and "." not in k for k, v in metrics.items())
    assert set(load_cleaning_reports(tmp_path)) == {"cc", "sbu"}


def test_html_without_samples():
    rep = make_report(removed=[])
    page = cleaning_report.render_html(rep, [], chart_file="c.svg", eval_paths={}, ref_images={})
    assert "Sample removed images (0 of 0)" in page and "No image was removed." in page
