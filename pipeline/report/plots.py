"""Offline plots of training metrics: one self-contained HTML page, no web assets.

`dvc plots show` writes HTML that loads vega from the web; this renders the same dvclive series
(``<run>/plots/metrics/{train,val}/**.tsv`` below ``<data>/metrics``, one ``step<TAB>value`` file
per metric; a run is ``pretrain``, ``pretrain_vcr``, or ``<task>/<start>`` for fine-tuning) with
matplotlib instead. One figure per metric of each training: train and val curves together, and for a
fine-tuning task both starts (pretrained, scratch) on the same axes; titled, both axes labelled.
Written as ``<data>/reports/plots/index.html``: an index of the trainings, then every figure as an
embedded SVG (no loose image files). Same series => same bytes (no dates, fixed SVG ids).
dvclive's own report (``Live(report="html")``) is no substitute: it renders through dvc-render,
whose page loads vega from a CDN too, and it draws one Live directory at a time, so the two starts
of a task could not share an axis.

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
from typing import Mapping

from pipeline.common.progress import configure_logging
from pipeline.common.ownership import atomic_dir
from pipeline.common.runinfo import atomic_write_bytes
from pipeline.report.checks import WALL_CLOCK

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


STARTS = ("pretrained", "scratch")  # fine-tuning's two starts: <task>/<start> below the metrics root
INDEX = "index.html"
# the measured throughput differs from run to run: its figures get a page of their own, so the index
# is the same bytes on every rerun (content digests skip files named after WALL_CLOCK)
THROUGHPUT_PAGE = f"{WALL_CLOCK}.html"
# y-axis labels of the metric names the trainings log (the last path component); others: the name
Y_LABELS = {"loss": "loss", "acc": "accuracy", "accuracy": "accuracy", "mlm_acc": "accuracy", "mrc_acc": "accuracy",
            "itm_acc": "accuracy", "vqa_score": "VQA score", "lr": "learning rate",
            "tokens_per_s": "tokens / s", "ot_pos": "OT distance (matched)", "ot_neg": "OT distance (mismatched)"}
Curves = Mapping[tuple[str, str], Series]  # (start or "", split) -> series


def group_runs(metrics_root: Path) -> dict[str, dict[str, Path]]:
    """{training: {start: dvclive dir}} below ``metrics_root``: ``vqa/pretrained`` and ``vqa/scratch``
    are the training ``vqa`` with two starts; any other run (``pretrain``) is a training of its own,
    start ``""``."""
    runs = sorted(p.parent.parent for p in metrics_root.rglob("plots/metrics") if p.is_dir()) \
        if metrics_root.is_dir() else []
    groups: dict[str, dict[str, Path]] = defaultdict(dict)
    for run_dir in runs:
        name = PurePosixPath(run_dir.relative_to(metrics_root).as_posix())
        if name.name in STARTS and len(name.parts) > 1:
            groups[str(name.parent)][name.name] = run_dir
        else:
            groups[str(name)][""] = run_dir
    return dict(groups)


def y_label(metric: str) -> str:
    """``mlm/acc`` -> ``accuracy``; the axis label of a metric."""
    last = metric.rsplit("/", 1)[-1]
    return Y_LABELS.get(last, last.replace("_", " "))


def curve_label(start: str, split: str) -> str:
    return " ".join(filter(None, (start, {"val": "val (held out)"}.get(split, split))))


def figure_svg(title: str, metric: str, curves: Curves) -> bytes:
    """One line chart of ``curves`` (optimizer step on x, the metric on y): a colour per start, solid
    for train and dashed for val; series of under 30 points get markers (fine-tuning's val may be
    one point, at the end)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {start: f"C{i}" for i, start in enumerate(sorted({s for s, _ in curves}, key=_start_order))}
    with matplotlib.rc_context({"svg.hashsalt": "uniter-pipeline", "svg.fonttype": "none"}):
        fig, ax = plt.subplots(figsize=(5.6, 3.4), dpi=100)
        for (start, split), (steps, values) in sorted(curves.items(), key=lambda kv: (_start_order(kv[0][0]),
                                                                                        kv[0][1])):
            few = len(steps) < 30
            # the starts' val points often coincide (one point each, at the end): the first start's are
            # drawn larger and hollow so the second's stay visible inside them
            first = _start_order(start) <= 0
            ax.plot(steps, values, color=colours[start], linestyle="--" if split == "val" else "-",
                    marker=("s" if split == "val" else "o") if few else None,
                    markersize=(8 if first else 4) if split == "val" else 3,
                    markerfacecolor="none" if split == "val" and first and len(colours) > 1 else None,
                    label=curve_label(start, split) or None)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(y_label(metric))
        ax.grid(alpha=0.3)
        if any(curve_label(*key) for key in curves):
            ax.legend(fontsize=8)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
        plt.close(fig)
    return buf.getvalue()


def _start_order(start: str) -> int:
    return STARTS.index(start) if start in STARTS else -1


def render_group(name: str, runs: Mapping[str, Path]) -> list[tuple[str, bytes]]:
    """[(metric, SVG bytes)] of one training: every metric any of its starts logged."""
    by_start = {start: collect(run_dir) for start, run_dir in runs.items()}
    metrics = sorted({m for found in by_start.values() for m in found})
    starts = " vs ".join(s for s in sorted(runs, key=_start_order) if s)
    figures = []
    for metric in metrics:
        curves = {(start, split): series for start, found in by_start.items()
                  for split, series in found.get(metric, {}).items()}
        title = f"{name}: {metric}" + (f" ({starts})" if starts else "")
        figures.append((metric, figure_svg(title, metric, curves)))
    return figures


def anchor(text: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "-" for c in text)


def render_html(groups: Mapping[str, list[tuple[str, bytes]]], metrics_root: Path, *,
                see_also: str | None = None) -> bytes:
    """The page: an index (each training, its starts and figure count), then each training's figures
    as ``<img>`` tags holding their SVG as a data URI (each figure keeps its own SVG ids);
    ``see_also``: a page of more figures, linked under the heading."""
    import base64
    import html

    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8"><title>Training curves</title>',
             "<style>body{font-family:sans-serif;margin:1.5em}figure{display:inline-block;margin:0.4em}"
             "img{width:560px}nav li{margin:0.2em 0}</style></head><body>",
             "<h1>Training curves</h1>",
             f"<p>dvclive series under <code>{html.escape(str(metrics_root))}</code>; x: optimizer step. "
             "Fine-tuning draws both starts on the same axes (pretrained, scratch); dashed: held-out (val) curves.</p>"]
    if see_also:
        parts.append(f'<p>Throughput (tokens / s, measured, so it differs between reruns): '
                     f'<a href="{html.escape(see_also)}">{html.escape(see_also)}</a></p>')
    if not groups:
        parts.append(f"<p>No dvclive metrics under {html.escape(str(metrics_root))}.</p>")
    parts.append("<nav><h2>Index</h2><ul>")
    parts += [f'<li><a href="#{anchor(name)}">{html.escape(name)}</a> ({len(figs)} figures: '
              + ", ".join(f'<a href="#{anchor(name + "-" + m)}">{html.escape(m)}</a>' for m, _ in figs) + ")</li>"
              for name, figs in groups.items()]
    parts.append("</ul></nav>")
    for name, figs in groups.items():
        parts.append(f'<section><h2 id="{anchor(name)}">{html.escape(name)}</h2>')
        for metric, svg in figs:
            data = base64.b64encode(svg).decode()
            parts.append(f'<figure id="{anchor(name + "-" + metric)}"><img alt="{html.escape(name)}: '
                         f'{html.escape(metric)}" src="data:image/svg+xml;base64,{data}"></figure>')
        parts.append("</section>")
    parts.append("</body></html>")
    return ("\n".join(parts) + "\n").encode()


def render_all(metrics_root: Path, out_root: Path) -> dict[str, list[str]]:
    """``out_root/index.html`` for every dvclive directory below ``metrics_root`` (the throughput
    figures in ``out_root/tokens_per_s.html``), replacing ``out_root`` atomically. Returns {training: [metric, ...]} in the page's order."""
    groups = group_runs(metrics_root)
    names = sorted(groups, key=lambda n: (not n.startswith("pretrain"), n))  # pretraining first
    rendered = dict(zip(names, _render_groups([(n, groups[n]) for n in names])))
    with atomic_dir(out_root, stage="plots") as tmp:
        # the series' folder as seen from the page: an absolute path would make the bytes depend on
        # where the run lies (two executors' runs of one graph must give the same page)
        shown = Path(os.path.relpath(metrics_root, out_root))
        steady = {name: [f for f in figs if f[0] != WALL_CLOCK] for name, figs in rendered.items()}
        timing = {name: [f for f in figs if f[0] == WALL_CLOCK] for name, figs in rendered.items()}
        timing = {name: figs for name, figs in timing.items() if figs}
        atomic_write_bytes(tmp / INDEX, render_html(steady, shown, see_also=THROUGHPUT_PAGE if timing else None))
        if timing:
            atomic_write_bytes(tmp / THROUGHPUT_PAGE, render_html(timing, shown))
    return {name: [m for m, _ in figs] for name, figs in rendered.items()}


def _render_groups(jobs: list[tuple[str, Mapping[str, Path]]]) -> list[list[tuple[str, bytes]]]:
    """:func:`render_group` of each job, one process per core: matplotlib draws ~10 figures a second
    on one core. Same bytes as one process."""
    workers = min(len(jobs), os.cpu_count() or 1)
    if workers < 2:
        return [render_group(*job) for job in jobs]
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_render_job, jobs))


def _render_job(job: tuple[str, Mapping[str, Path]]) -> list[tuple[str, bytes]]:
    return render_group(*job)


def run(params) -> dict[str, list[Path]]:
    """Stage-style entry: plots of ``<paths.data>/metrics`` into ``<paths.data>/reports/plots``."""
    data = Path(params.paths.data)
    result = render_all(data / "metrics", data / "reports" / "plots")
    log.info("plots: %d figures of %d trainings -> %s", sum(len(v) for v in result.values()), len(result),
             data / "reports" / "plots" / INDEX)
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
    print(f"plots: {sum(len(v) for v in result.values())} figures of {len(result)} trainings in {args.out / INDEX}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
