"""``python -m pipeline report cleaning``: the table, one dataset, --show, --reason, --dir, errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.common.reasons import REJECT_REASONS, REMOVAL_REASONS
from pipeline.report import cli as report_cli

REPO = Path(__file__).resolve().parents[3]


def _report(dataset: str, removed: list[tuple[str, str]], kept: int, rejected: int) -> dict:
    entries = [{"image_id": i, "url": f"http://h/{i}.jpg", "reason": r, "matched_eval": [f"coco/test/{i}"]}
               for i, r in removed]
    return {"dataset": dataset, "input_rows": kept + 2 * len(entries) + rejected, "input_images": kept + len(entries),
            "kept_rows": kept, "kept_images": kept, "removed_rows": 2 * len(entries),
            "removed_images": {r: sum(e["reason"] == r for e in entries) for r in REMOVAL_REASONS},
            "removed": entries,
            "rejected_rows": {r: (rejected if r == "missing_image" else 0) for r in REJECT_REASONS}}


@pytest.fixture()
def data_dir(tmp_path) -> Path:
    out = tmp_path / "data" / "reports" / "cleaning"
    out.mkdir(parents=True)
    reps = [_report("coco", [("11", "eval_split"), ("12", "eval_split"), ("13", "flickr_photo_id")], 1200, 4),
            _report("cc", [("c1", "canonical_url"), ("c2", "near_duplicate")], 30, 7)]
    for rep in reps:
        (out / f"{rep['dataset']}.json").write_text(json.dumps(rep, sort_keys=True))
    (out / "summary.json").write_text(json.dumps({"coco_input_rows": 1}))
    return tmp_path / "data"


def _run(*argv: str) -> tuple[int, str]:
    buf = io.StringIO()
    code = report_cli.main(list(argv), console=Console(file=buf, width=160, color_system=None))
    return code, buf.getvalue()


def _row(text: str, first: str) -> list[str]:
    cells = (line.replace("│", " ").split() for line in text.splitlines())
    return next(c for c in cells if c[:1] == [first])[1:]


def test_table_of_all_datasets_with_totals(data_dir):
    code, out = _run("cleaning", "--dir", str(data_dir))
    assert code == 0
    # input, kept, removed rows, eval split, coco id, flickr id, url, near dup, rejected
    assert _row(out, "coco") == ["1,210", "1,200", "6", "2", "0", "1", "0", "0", "4"]
    assert _row(out, "cc") == ["41", "30", "4", "0", "0", "0", "1", "1", "7"]
    assert _row(out, "total") == ["1,251", "1,230", "10", "2", "0", "1", "1", "1", "11"]


def test_one_dataset_with_show_and_reason_filter(data_dir):
    code, out = _run("cleaning", "coco", "--show", "2", "--dir", str(data_dir))
    assert code == 0
    assert "input_rows 1,210 = kept 1,200 + removed 6 + rejected 4" in out
    assert "removed images (2 of 3)" in out and "coco/test/11" in out and "coco/test/13" not in out
    assert _row(out, "missing_image") == ["4"]
    code, out = _run("cleaning", "coco", "--show", "5", "--reason", "flickr_photo_id", "--dir", str(data_dir))
    assert "removed images (1 of 1)" in out and "coco/test/13" in out and "coco/test/11" not in out


def test_dir_may_be_the_report_directory_itself(data_dir):
    code, out = _run("cleaning", "cc", "--dir", str(data_dir / "reports" / "cleaning"))
    assert code == 0 and _row(out, "cc")[0] == "41"


def test_errors_name_the_problem(data_dir, tmp_path):
    code, out = _run("cleaning", "vqa", "--dir", str(data_dir))
    assert code == 1 and "no cleaning report for 'vqa'" in out and "cc, coco" in out
    code, out = _run("cleaning", "--dir", str(tmp_path / "nowhere"))
    assert code == 1 and "run `python -m pipeline decontaminate`" in out
    with pytest.raises(SystemExit) as exc:
        _run("cleaning", "--reason", "bogus")
    assert exc.value.code == 2


def test_module_entry_point(data_dir):
    proc = subprocess.run([sys.executable, "-m", "pipeline", "report", "cleaning", "--dir", str(data_dir)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "coco" in proc.stdout and "1,210" in proc.stdout
