"""``python -m pipeline report results [--exps]``: the results table, or DVC experiments side by side.

    python -m pipeline report results                 # data/reports/results.json as a table
    python -m pipeline report results --exps          # every experiment of `dvc exp show --json`
    python -m pipeline report results --exps --md out.md   # ... also written as Markdown
    python -m pipeline report results --exps --from show.json   # a saved `dvc exp show --json`
    python -m pipeline report results --exps --runs runs         # ... and these Airflow runs

With ``--exps`` each column is one experiment (the workspace, the commit it derives from, each
``dvc exp run``, then each Airflow run under the runs folder as ``run:<run_name>``); rows are the
params that differ between them, then every results row and the Meta-Sum (scores of the pretrained
start), taken from each experiment's ``results.json`` metrics.
That is how the paper's ablation table (e.g. conditional vs joint masking) is rebuilt.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from rich import box
from rich.console import Console
from rich.table import Table

from pipeline.params.parser import RUNS_DIR_ENV
from pipeline.report.results import DEV_MARK

RESULTS_METRICS = "reports/results.json"  # below the data dir, as dvc exp show names it
RUN_PARAMS = "params.yaml"  # an Airflow run's params file, in runs/<run_name>/
LOCATION_KEYS = ("paths.", "sources.", "mini_world.out_dir")


class ResultsError(Exception):
    """The results cannot be shown; the message says why."""


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def results_table(results: Mapping[str, Any]) -> Table:
    table = Table(title="Results (percent, test splits)", box=box.SIMPLE_HEAD)
    for name, justify in (("task", "left"), ("metric", "left"), ("pretrained", "right"), ("scratch", "right"),
                          ("gain", "right"), ("zero-shot", "right"), ("chance", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in results["rows"]:
        label = r["label"] + (DEV_MARK if r.get("split") == "dev" else "")
        table.add_row(r["task"], label, _fmt(r["pretrained"]), _fmt(r["scratch"]), _fmt(r["gain"]),
                      _fmt(r["zero_shot"]), _fmt(r["chance"]))
    m = results["meta_sum"]
    table.add_row("Meta-Sum", f"{m['terms']} scores", _fmt(m["pretrained"]), _fmt(m["scratch"]), _fmt(m.get("gain")),
                  "", _fmt(m["chance"]), style="bold")
    refs = [f"{r['task']} {r['metric']}: {r['reference'].replace('_', ' ')} {_fmt(r['value'])}"
            for r in results.get("references") or []]
    if refs:
        table.caption = "reference levels (model-free): " + "; ".join(refs)
    return table


def _flatten(prefix: str, node: Any, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(node, Mapping):
        for k, v in node.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = json.dumps(node) if isinstance(node, (list, tuple)) else node
    return out


def experiments(show: list[Mapping[str, Any]], repo: Path | str = ".") -> list[dict[str, Any]]:
    """``dvc exp show --json`` of the repository ``repo`` -> [{name, params (flat), results
    (results.json or None)}], in its order: the workspace, then each commit followed by the
    experiments derived from it."""
    out = []

    def add(name: str, rev: str, data: Mapping[str, Any] | None) -> None:
        data = data or {}
        params: dict[str, Any] = {}
        for file_params in (data.get("params") or {}).values():
            _flatten("", file_params.get("data") or {}, params)
        results = None
        for path, metrics in (data.get("metrics") or {}).items():
            if path.endswith(RESULTS_METRICS) and "data" in metrics:
                results = metrics["data"]
                if "rows" not in results:  # DVC's metrics keep no lists: read the file itself
                    results = results_file_at(repo, path, rev) or results
        out.append({"name": name, "params": params, "results": results})

    for entry in show:
        rev = entry.get("rev", "?")
        add(entry.get("name") or (rev if rev == "workspace" else rev[:7]), rev, entry.get("data"))
        for exp in entry.get("experiments") or []:
            for rev_entry in exp.get("revs") or []:
                name = rev_entry.get("name") or exp.get("name") or str(rev_entry.get("rev", "?"))[:7]
                add(name, str(rev_entry.get("rev", "?")), rev_entry.get("data"))
    return out


def results_file_at(repo: Path | str, path: str, rev: str) -> dict[str, Any] | None:
    """results.json (``path``, relative to ``repo``) as the revision ``rev`` holds it (the workspace:
    the file on disk), with its ``rows`` list, which ``dvc exp show``'s metrics leave out; None when
    unreadable."""
    try:
        if rev == "workspace":
            return json.loads((Path(repo) / path).read_text())
        import dvc.api

        return json.loads(dvc.api.read(path, repo=str(repo), rev=rev))
    except Exception:  # noqa: BLE001 - no repository, no such revision or file: keep what exp show gave
        return None


def airflow_runs(runs_dir: Path) -> list[dict[str, Any]]:
    """Every Airflow run under ``runs_dir`` (``<run_name>/params.yaml``), in name order, as
    [{name: "run:<run_name>", params (flat), results (its data/reports/results.json or None)}]."""
    import yaml

    out = []
    for params_file in sorted(Path(runs_dir).glob(f"*/{RUN_PARAMS}")):
        run = params_file.parent
        results_file = run / "data" / RESULTS_METRICS
        params = _flatten("", yaml.safe_load(params_file.read_text()) or {}, {})
        out.append({"name": f"run:{run.name}", "params": params,
                    "results": json.loads(results_file.read_text()) if results_file.exists() else None})
    return out


def runs_dir_of(params_file: Path = Path("params.yaml")) -> Path:
    """Where Airflow runs live: $UNITER_RUNS_DIR, else params.yaml's paths.runs (default ``runs``)."""
    import os

    import yaml

    if os.environ.get(RUNS_DIR_ENV):
        return Path(os.environ[RUNS_DIR_ENV])
    raw = yaml.safe_load(params_file.read_text()) if params_file.exists() else {}
    return Path(((raw or {}).get("paths") or {}).get("runs", "runs"))


def side_by_side(exps: list[dict[str, Any]]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(column names, rows of (label, one cell per experiment)): differing params, results rows, Meta-Sum.

    Params that only say where a run keeps its files (paths, sources, the mini world's folder) differ
    between an Airflow run and the workspace without changing a result, so they are left out."""
    names = [e["name"] for e in exps]
    keys = sorted({k for e in exps for k in e["params"] if not k.startswith(LOCATION_KEYS)})
    rows: list[tuple[str, list[str]]] = []
    for key in keys:
        values = [e["params"].get(key) for e in exps]
        if len({json.dumps(v, sort_keys=True) for v in values}) > 1:
            rows.append((f"param {key}", [_fmt(v) for v in values]))
    metric_labels: dict[str, str] = {}
    for e in exps:
        for r in (e["results"] or {}).get("rows", []):
            metric_labels.setdefault(f"{r['task']}/{r['metric']}", r["label"])
    for key, label in metric_labels.items():
        cells = []
        for e in exps:
            match = [r for r in (e["results"] or {}).get("rows", []) if f"{r['task']}/{r['metric']}" == key]
            cells.append(_fmt(match[0]["pretrained"]) if match else "–")
        rows.append((label, cells))
    rows.append(("Meta-Sum", [_fmt(((e["results"] or {}).get("meta_sum") or {}).get("pretrained")) for e in exps]))
    return names, rows


def side_by_side_markdown(names: list[str], rows: list[tuple[str, list[str]]]) -> str:
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]
    return "\n".join(lines) + "\n"


def dvc_exp_show() -> list[dict[str, Any]]:
    """Run ``dvc exp show --json`` in the current repository (the dvc next to this Python first)."""
    dvc = Path(sys.executable).with_name("dvc")
    cmd = [str(dvc) if dvc.exists() else "dvc", "exp", "show", "--json"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as err:
        raise ResultsError(f"cannot run {' '.join(cmd)}: {err}") from None
    if done.returncode != 0:
        raise ResultsError(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def show_results(args: argparse.Namespace, console: Console) -> int:
    if args.exps:
        exps = experiments(load_show(args.from_file)) + airflow_runs(Path(args.runs) if args.runs else runs_dir_of())
        if not any(e["results"] for e in exps):
            raise ResultsError(f"no experiment has {RESULTS_METRICS} metrics yet: run `dvc exp run` (or `dvc repro`)")
        names, rows = side_by_side(exps)
        table = Table(title="Experiments side by side (scores of the pretrained start, percent)", box=box.SIMPLE_HEAD)
        table.add_column("")
        for name in names:
            table.add_column(name, justify="right")
        for label, cells in rows:
            table.add_row(label, *cells, style="bold" if label == "Meta-Sum" else None)
        console.print(table)
        if args.md:
            Path(args.md).write_text(side_by_side_markdown(names, rows))
            console.print(f"written: {args.md}")
        return 0
    path = Path(args.dir) / "reports" / "results.json"
    if not path.exists():
        raise ResultsError(f"{path} not found: run `python -m pipeline results` (or `dvc repro results`) first")
    console.print(results_table(json.loads(path.read_text())))
    return 0


def add_results_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("results", help="the results table (with Meta-Sum), or DVC experiments side by side",
                       description="Show data/reports/results.json, or compare DVC experiments (--exps).")
    p.add_argument("--exps", action="store_true", help="one column per DVC experiment (`dvc exp show --json`)")
    p.add_argument("--from", dest="from_file", metavar="JSON", help="with --exps: a saved `dvc exp show --json`")
    p.add_argument("--md", metavar="PATH", help="with --exps: also write the table as Markdown")
    p.add_argument("--runs", metavar="DIR", help="with --exps: Airflow runs folder, listed as run:<name> columns "
                                                 "(default: $UNITER_RUNS_DIR, else params.yaml's paths.runs)")
    p.add_argument("--dir", default="data", help="data directory holding reports/results.json (default: data)")
    p.set_defaults(func=guarded(show_results))


def load_show(from_file: str | None) -> list[dict[str, Any]]:
    """A saved `dvc exp show --json` (``from_file``), else a fresh one from this repository."""
    return json.loads(Path(from_file).read_text()) if from_file else dvc_exp_show()


def guarded(show: Callable[[argparse.Namespace, Console], int]) -> Callable[[argparse.Namespace, Console], int]:
    """``show`` with a ResultsError printed as one error line and exit status 1 instead of a traceback."""
    def run(args: argparse.Namespace, console: Console) -> int:
        try:
            return show(args, console)
        except ResultsError as err:
            console.print(f"[red]error:[/red] {err}")
            return 1
    return run
