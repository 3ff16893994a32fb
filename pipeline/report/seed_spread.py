"""``python -m pipeline report spread``: how much the fine-tuning scores move between seeds.

Usage (after ``make seeds``, which runs one ``dvc exp run -S finetune.seed=<s>`` per seed)::

    python -m pipeline report spread                       # every experiment named ft-seed*
    python -m pipeline report spread --exps ft-seed1 ft-seed2 ft-seed3
    python -m pipeline report spread --from show.json --md spread.md

Each row is one results.md row (task and metric); each column gives, over the chosen experiments,
the mean, the sample standard deviation and the range of the pretrained score, the non-pretrained
score and the gain. Only ``finetune.seed`` may differ between the experiments: anything else would
mix a seed's spread with a change of recipe, so other differing params are refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Mapping

from rich import box
from rich.console import Console
from rich.table import Table

from pipeline.report.results_cli import LOCATION_KEYS, ResultsError, experiments, guarded, load_show
from pipeline.training.paired import COLUMNS, spread, spread_cell

SEED_KEY = "finetune.seed"
DEFAULT_PREFIX = "ft-seed"  # the experiment names `make seeds` gives


def check_only_seed_differs(exps: list[Mapping[str, Any]]) -> None:
    """Raise ResultsError naming the params (other than ``finetune.seed``) that differ between ``exps``."""
    keys = sorted({k for e in exps for k in e["params"] if not k.startswith(LOCATION_KEYS)})
    differ = [k for k in keys if k != SEED_KEY and len({repr(e["params"].get(k)) for e in exps}) > 1]
    if differ:
        raise ResultsError(f"the experiments differ in {differ}, not only in {SEED_KEY}: their spread would mix "
                           f"seeds with a change of recipe")


def spread_rows(exps: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One dict per results row (``task``, ``metric``, ``label``) with :func:`spread` of each of COLUMNS
    over the experiments that have the value."""
    values: dict[tuple[str, str], dict[str, Any]] = {}
    for e in exps:
        for row in (e["results"] or {}).get("rows", []):
            entry = values.setdefault((row["task"], row["metric"]), {"label": row.get("label", row["metric"])})
            for column in COLUMNS:
                if row.get(column) is not None:
                    entry.setdefault(column, []).append(float(row[column]))
    return [{"task": task, "metric": metric, "label": entry["label"],
             **{c: spread(entry[c]) for c in COLUMNS if entry.get(c)}}
            for (task, metric), entry in values.items()]


def spread_markdown(rows: list[dict[str, Any]], names: list[str]) -> str:
    lines = [f"Over {len(names)} fine-tuning seeds ({', '.join(names)}): mean ± sample sd (min..max).", "",
             "| task | metric | pretrained | non-pretrained | gain |", "|---|---|---:|---:|---:|"]
    lines += [f"| {r['task']} | {r['label']} | {spread_cell(r.get('pretrained'))} | {spread_cell(r.get('scratch'))} "
              f"| {spread_cell(r.get('gain'))} |" for r in rows]
    return "\n".join(lines) + "\n"


def show_spread(args: argparse.Namespace, console: Console) -> int:
    exps = [e for e in experiments(load_show(args.from_file)) if e["results"]]
    chosen = [e for e in exps if e["name"] in args.exps] if args.exps else \
        [e for e in exps if e["name"].startswith(DEFAULT_PREFIX)]
    missing = sorted(set(args.exps or ()) - {e["name"] for e in chosen})
    if missing:
        raise ResultsError(f"no experiment with results named {missing} (have: {[e['name'] for e in exps]})")
    if len(chosen) < 2:
        raise ResultsError(f"a spread needs at least 2 experiments with results, found {len(chosen)}: run `make seeds`")
    check_only_seed_differs(chosen)
    names = [e["name"] for e in chosen]
    rows = spread_rows(chosen)
    table = Table(title=f"Fine-tuning over {len(names)} seeds: mean ± sd (min..max)", box=box.SIMPLE_HEAD)
    for column in ("task", "metric", "pretrained", "non-pretrained", "gain"):
        table.add_column(column, justify="left" if column in ("task", "metric") else "right")
    for r in rows:
        table.add_row(r["task"], r["label"], *(spread_cell(r.get(c)) for c in COLUMNS))
    console.print(table)
    if args.md:
        Path(args.md).write_text(spread_markdown(rows, names))
        console.print(f"written: {args.md}")
    return 0


def add_spread_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("spread", help="fine-tuning scores over seeds (mean, sd, range) from DVC experiments",
                       description="Summarize experiments that differ only in finetune.seed (`make seeds`).")
    p.add_argument("--exps", nargs="+", metavar="NAME", help=f"experiment names (default: every {DEFAULT_PREFIX}*)")
    p.add_argument("--from", dest="from_file", metavar="JSON", help="a saved `dvc exp show --json`")
    p.add_argument("--md", metavar="PATH", help="also write the table as Markdown")
    p.set_defaults(func=guarded(show_spread))
