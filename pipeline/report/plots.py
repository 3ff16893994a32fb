"""Offline plots of training metrics: PNG and SVG files, no web assets.

`dvc plots show` writes HTML that loads vega from the web; this renders the same dvclive series
(``<run>/plots/metrics/{train,val}/**.tsv`` below ``<data>/metrics``, one ``step<TAB>value`` file
per metric; a run is ``pretrain``, ``pretrain_vcr``, or ``<task>/<start>`` for fine-tuning) with
matplotlib instead. One figure per metric of each training run, train and val curves together,
written as ``<data>/reports/plots/<run>/<metric>.{svg,png}`` plus an ``index.md`` that links
them. Same series => same bytes (no dates, fixed SVG ids).

    python -m pipeline plots [--params params.yaml]              # the stage: every run under <data>/metrics
    python -m pipeline.report.plots --metrics DIR --out DIR     # any dvclive root into any folder
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import io
import logging
import multiprocessing
import os
from collections import defaultdict
from pathlib import Path, PurePosixPath
from typing import Mapping, Sequence

from pipeline.common.progress import configure_logging
from pipeline.common.ownership import atomic_dir
from pipeline.common.runinfo import atomic_write_bytes

log = logging.getLogger(__name__)

SPLITS = ("train", "val")  # first path component of a dvclive series, drawn as separate curves
Series = tuple[list[float], list[float]]  # steps, values


def read_series(tsv: Path) -> Series:
    """(steps, values) of one dvclive TSV: a header naming ``step`` and the metric (a
    ``timestamp`` column, if any, is ignored); rows that do not parse are an error naming the file."""
    with tsv.open(newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t"))
    if not rows or "step" not in rows[0]:
        raise ValueError(f"{tsv}: expected a dvclive TSV with a 'step' column, got header {rows[:1]}")
    header = rows[0]
    step_col = header.index("step")
    value_cols = [i for i, name in enumerate(header) if name not in ("step", "timestamp")]
    if len(value_cols) != 1:
        raise ValueError(f"{tsv}: expected one metric column besides step/timestamp, got {header}")
    steps, values = [], []
    for line, row in enumerate(rows[1:], start=2):
        try:
            steps.append(float(row[step_col]))
            values.append(float(row[value_cols[0]]))
        except (ValueError, IndexError):
            raise ValueError(f"{tsv}:{line}: not a number row: {row}") from None
    return steps, values


def collect(run_dir: Path) -> dict[str, dict[str, Series]]:
    """{metric: {split: series}} of one dvclive directory; metric = the TSV's path below its split
    (``mlm/loss``), split = ``train``/``val`` (or ``""`` for series outside both)."""
    root = run_dir / "plots" / "metrics"
    found: dict[str, dict[str, Series]] = defaultdict(dict)
    for tsv in sorted(root.rglob("*.tsv")):
        parts = PurePosixPath(tsv.relative_to(root).with_suffix("").as_posix()).parts
        split, metric = (parts[0], "/".join(parts[1:])) if parts[0] in SPLITS and len(parts) > 1 else ("", "/".join(parts))
        found[metric][split] = read_series(tsv)
    return dict(found)


def figure_bytes(title: str, curves: Mapping[str, Series], formats: Sequence[str]) -> dict[str, bytes]:
    """One line chart (step on x) of the given curves, drawn once and saved in each of ``formats``
    (``svg``, ``png``) -> {format: bytes}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = {}
    with matplotlib.rc_context({"svg.hashsalt": "uniter-pipeline", "svg.fonttype": "none"}):
        fig, ax = plt.subplots(figsize=(5.0, 3.2), dpi=100)
        for split, (steps, values) in sorted(curves.items()):
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=split or None)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if any(curves):
            ax.legend(fontsize=8)
        fig.tight_layout()
        for fmt in formats:
            buf = io.BytesIO()
            fig.savefig(buf, format=fmt, metadata={"Date": None} if fmt == "svg" else {"Software": None})
            out[fmt] = buf.getvalue()
        plt.close(fig)
    return out


def file_stem(metric: str) -> str:
    return metric.replace("/", "_")


def render_run(run_dir: Path, out_dir: Path, *, title: str | None = None,
               formats: Sequence[str] = ("svg", "png")) -> list[Path]:
    """Write every metric of one dvclive directory to ``out_dir``; return the files written."""
    written = []
    for metric, curves in sorted(collect(run_dir).items()):
        for fmt, data in figure_bytes(f"{title or run_dir.name}: {metric}", curves, formats).items():
            path = out_dir / f"{file_stem(metric)}.{fmt}"
            atomic_write_bytes(path, data)
            written.append(path)
    return written


def render_all(metrics_root: Path, out_root: Path) -> dict[str, list[Path]]:
    """Plots of every dvclive directory below ``metrics_root`` into ``out_root/<run>/``, replacing
    ``out_root`` atomically, with an ``index.md`` of image links. Returns {run: files}."""
    runs = sorted(p.parent.parent for p in metrics_root.rglob("plots/metrics") if p.is_dir()) \
        if metrics_root.is_dir() else []
    result: dict[str, list[Path]] = {}
    with atomic_dir(out_root, stage="plots") as tmp:
        lines = ["# Training curves", ""]
        names = [run_dir.relative_to(metrics_root).as_posix() for run_dir in runs]
        rendered = _render_runs([(run_dir, tmp / name, name) for run_dir, name in zip(runs, names)])
        for name, files in zip(names, rendered):
            result[name] = [out_root / f.relative_to(tmp) for f in files]
            lines += [f"## {name}", ""]
            lines += [f"![{f.stem}]({name}/{f.name})" for f in files if f.suffix == ".svg"] + [""]
        if not runs:
            lines.append(f"No dvclive metrics under {metrics_root}.")
        atomic_write_bytes(tmp / "index.md", ("\n".join(lines).rstrip() + "\n").encode())
    return result


def _render_runs(jobs: list[tuple[Path, Path, str]]) -> list[list[Path]]:
    """:func:`render_run` of each (run_dir, out_dir, title), one process per core: matplotlib draws
    ~10 figures a second on one core, and a demo has ~230 of them. Same files as one process."""
    workers = min(len(jobs), os.cpu_count() or 1)
    if workers < 2:
        return [_render_job(job) for job in jobs]
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_render_job, jobs))


def _render_job(job: tuple[Path, Path, str]) -> list[Path]:
    run_dir, out_dir, title = job
    return render_run(run_dir, out_dir, title=title)


def run(params) -> dict[str, list[Path]]:
    """Stage-style entry: plots of ``<paths.data>/metrics`` into ``<paths.data>/reports/plots``."""
    data = Path(params.paths.data)
    result = render_all(data / "metrics", data / "reports" / "plots")
    log.info("plots: %d figures for %d runs -> %s", sum(len(v) for v in result.values()), len(result),
             data / "reports" / "plots")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.report.plots", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="params.yaml", help="params file (its paths.data is used)")
    parser.add_argument("--metrics", type=Path, help="dvclive root (default: <paths.data>/metrics)")
    parser.add_argument("--out", type=Path, help="output folder (default: <paths.data>/reports/plots)")
    args = parser.parse_args(argv)
    configure_logging()
    if args.metrics is None or args.out is None:
        from pipeline.params.parser import load_params

        data = Path(load_params(args.params, check_paths=False).paths.data)
        args.metrics = args.metrics or data / "metrics"
        args.out = args.out or data / "reports" / "plots"
    result = render_all(args.metrics, args.out)
    print(f"plots: {sum(len(v) for v in result.values())} files for {len(result)} runs in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
