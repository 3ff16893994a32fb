"""``python -m pipeline report ...``: inspect the reports the stages wrote.

    python -m pipeline report cleaning                  # table of every dataset
    python -m pipeline report cleaning coco             # one dataset, with removals/rejects by reason
    python -m pipeline report cleaning coco --show 20   # + the first 20 removed images and their matches
    python -m pipeline report cleaning --dir runs/<run>/data

Each report kind is an argparse subcommand (``add_cleaning_parser``); a new kind adds its own
``add_<kind>_parser`` to :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from pipeline.common.reasons import REMOVAL_REASONS, load_cleaning_reports, rejected_by_reason, removed_by_reason
from pipeline.report.checks import add_checks_parser
from pipeline.report.matrix import add_matrix_parser
from pipeline.report.results_cli import add_results_parser
from pipeline.report.seed_spread import add_spread_parser
from pipeline.report.split_size import add_split_size_parser

CLEANING_SUBDIR = Path("reports") / "cleaning"
# short column titles for the removal reasons
_SHORT = {"eval_split": "eval\nsplit", "coco_id": "coco\nid", "flickr_photo_id": "flickr\nid",
          "canonical_url": "url", "near_duplicate": "near\ndup"}


class ReportError(Exception):
    """A report cannot be shown (missing directory, unknown dataset); the message says why."""


def cleaning_dir(path: Path) -> Path:
    """The cleaning report directory of a data dir (``<dir>/reports/cleaning``) or ``path`` itself."""
    for candidate in (path / CLEANING_SUBDIR, path):
        if candidate.is_dir() and any(candidate.glob("*.json")):
            return candidate
    raise ReportError(
        f"no cleaning reports in {path / CLEANING_SUBDIR} (nor in {path}): run "
        "`python -m pipeline decontaminate` or `dvc repro decontaminate` first, or pass --dir"
    )


def _rejected(report: dict) -> int:
    return sum(report["rejected_rows"].values())


def cleaning_table(reports: dict[str, dict]) -> Table:
    """One row per dataset: input, kept, removed (rows, then images by reason), rejected; plus totals."""
    reasons = list(REMOVAL_REASONS) + sorted({r for rep in reports.values() for r in rep["removed_images"]}
                                             - set(REMOVAL_REASONS))
    table = Table(title="Cleaning: rows, and removed images by reason", show_footer=len(reports) > 1,
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("dataset", footer="total", min_width=7)
    numeric = [("input\nrows", lambda r: r["input_rows"]), ("kept\nrows", lambda r: r["kept_rows"]),
               ("removed\nrows", lambda r: r["removed_rows"])]
    numeric += [(_SHORT.get(reason, reason), (lambda reason: lambda r: r["removed_images"].get(reason, 0))(reason))
                for reason in reasons]
    numeric += [("rejected\nrows", _rejected)]
    for title, get in numeric:
        table.add_column(title, justify="right", footer=f"{sum(get(r) for r in reports.values()):,}",
                         min_width=max(len(word) for word in title.split()))
    for dataset, rep in sorted(reports.items()):
        table.add_row(dataset, *(f"{get(rep):,}" for _, get in numeric))
    return table


def _reason_table(title: str, counts: list[tuple[str, int]], unit: str) -> Table:
    table = Table(title=title)
    table.add_column("reason")
    table.add_column(unit, justify="right")
    for reason, count in counts:
        table.add_row(reason, f"{count:,}")
    return table


def removed_table(report: dict, show: int, reason: str | None) -> Table:
    """The first ``show`` removed images of a report (optionally of one reason) with their matches."""
    items = [e for e in report["removed"] if reason is None or e["reason"] == reason]
    table = Table(title=f"{report['dataset']}: removed images ({min(show, len(items))} of {len(items)})")
    for name in ("image_id", "reason", "url", "matched_eval"):
        table.add_column(name, overflow="fold")
    for entry in items[:show]:
        table.add_row(entry["image_id"], entry["reason"], entry["url"] or "", "\n".join(entry["matched_eval"]))
    return table


def show_cleaning(args: argparse.Namespace, console: Console) -> int:
    reports = load_cleaning_reports(cleaning_dir(Path(args.dir)))
    if args.dataset is None:
        console.print(cleaning_table(reports))
        if args.show:
            for rep in reports.values():
                console.print(removed_table(rep, args.show, args.reason))
        return 0
    if args.dataset not in reports:
        raise ReportError(f"no cleaning report for {args.dataset!r}; reports exist for: {', '.join(sorted(reports))}")
    rep = reports[args.dataset]
    console.print(cleaning_table({args.dataset: rep}))
    console.print(f"input_rows {rep['input_rows']:,} = kept {rep['kept_rows']:,} + removed {rep['removed_rows']:,}"
                  f" + rejected {_rejected(rep):,}; images: {rep['input_images']:,} in, {rep['kept_images']:,} kept")
    console.print(_reason_table("removed images by reason", removed_by_reason(rep), "images"))
    console.print(_reason_table("rejected rows by reason (ingest)", rejected_by_reason(rep), "rows"))
    if args.show:
        console.print(removed_table(rep, args.show, args.reason))
    return 0


def add_cleaning_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cleaning", help="what decontamination removed and why",
                       description="Show the decontamination reports (data/reports/cleaning/*.json).")
    p.add_argument("dataset", nargs="?", help="one dataset (default: a table of all)")
    p.add_argument("--show", type=int, default=0, metavar="N", help="list the first N removed images")
    p.add_argument("--reason", choices=REMOVAL_REASONS, help="with --show: only removals of this reason")
    p.add_argument("--dir", default="data",
                   help="data directory holding reports/cleaning (e.g. an Airflow run's), or the report "
                        "directory itself (default: data)")
    p.set_defaults(func=show_cleaning)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline report", description="Inspect pipeline reports.")
    sub = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    add_cleaning_parser(sub)
    add_results_parser(sub)  # pipeline/report/results_cli.py: `report results [--exps]`
    add_spread_parser(sub)  # pipeline/report/seed_spread.py: `report spread` over fine-tuning seeds
    add_split_size_parser(sub)  # pipeline/report/split_size.py: `report split-size TASK` from dev intervals
    add_checks_parser(sub)  # pipeline/report/checks.py: `report checks`, the demo's verdicts
    add_matrix_parser(sub)  # pipeline/report/matrix.py: `report matrix`, the verdicts over seeds x precisions x threads
    return parser


def main(argv: list[str] | None = None, *, console: Console | None = None) -> int:
    """Entry of ``python -m pipeline report``; returns the exit status (2 usage, 1 no report)."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    console = console or Console()
    try:
        return args.func(args, console)
    except ReportError as err:
        console.print(f"[red]error:[/red] {err}")
        return 1
