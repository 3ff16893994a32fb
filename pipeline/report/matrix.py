"""``python -m pipeline report matrix``: the demo's verdicts and gains over a matrix of runs on one machine.

A verdict the demo prints must hold on any machine (docs/rig.md). Machines differ in their float
kernels (bf16 autocast or fp32, how many threads split a reduction) and runs in their draw, so the
matrix runs the graph once per cell of pretraining seeds x precisions (forced: ``pretrain.precision``
and ``finetune.precision``, standing in for CPUs with and without native bf16) x torch threads
(``OMP_NUM_THREADS``), each into a side root, and tabulates every verdict of
:mod:`pipeline.report.checks` per cell, and each fine-tuning gain (an observation) with its spread::

    python -m pipeline report matrix --out runs/matrix                       # 3 seeds x 2 x 2, default world
    python -m pipeline report matrix --out /tmp/m --overrides tests/e2e/tiny_overrides.yaml --seeds 1234

Layout below ``--out``: ``upstream/`` runs the stages up to ``build_dbs`` once (they do not depend on
a cell); ``cells/<cell>/`` holds a params file and a ``data/`` whose upstream entries are links into
``upstream/data``, and runs pretraining, fine-tuning and ``results`` with the cell's seed, precision
and threads (the fine-tuning seed stays the upstream root seed: only pretraining is redrawn). With
``--rerun`` the first cell runs twice and its ``rerun_identical`` verdict compares the two. A stage
whose marker ``.matrix/<stage>.done`` exists is not run again, so a long matrix resumes. Writes
``matrix.json`` and ``matrix.md`` (again after each cell; ``--no-run`` only tabulates the cells that
have run); exit status 1 when any verdict fails in any cell. A cell whose stage fails (a fine-tuning
start the divergence guard stopped, say) gets a failing ``ran`` row with the stage's own one-line
error, its later checks read n/a, and the matrix goes on with the next cell; resumed, it runs the
failed stage again.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from pipeline.report.checks import Verdict, evaluate, failed, rig_stamp, verdict_mark

REPO = Path(__file__).resolve().parents[2]
# the default graph (dvc.yaml) split where a cell begins: what runs once, what runs per cell
UPSTREAM_STAGES = ("mini_world", "ingest", "decontaminate", "train_detector", "extract", "build_dbs")
CELL_STAGES = ("pretrain", "pretrain_vcr", "finetune", "results")
ABLATION_STAGES = ("pretrain_masking", "ablations")  # ablations/dvc.yaml, with --ablation
SHARED = {"models", "reports", "metrics"}  # data/ folders a cell also writes into: linked entry by entry
UNSHARED = {"checkpoints", "cache"}  # working folders (checkpoints, stage locks, scratch): each root its own
MARKERS = ".matrix"


def cell_name(seed: int, precision: str, threads: int) -> str:
    return f"seed{seed}-{precision}-t{threads}"


def matrix_params(base: Path, overrides: Iterable[str]) -> dict[str, Any]:
    """``base`` (a params.yaml) with ``overrides`` (``key=value``) applied and parsed strictly."""
    from pipeline.params.parser import apply_override, load_raw, parse_params

    raw = load_raw(base)
    for assignment in overrides:
        apply_override(raw, assignment)
    parse_params(raw, check_paths=False)
    return raw


def link_upstream(upstream_data: Path, cell_data: Path) -> None:
    """Give ``cell_data`` every entry of ``upstream_data`` as a link (the folders a cell writes into, as
    real folders whose entries are links)."""
    cell_data.mkdir(parents=True, exist_ok=True)
    for entry in sorted(upstream_data.iterdir()):
        if entry.name.startswith(".") or entry.name in UNSHARED:
            continue
        if entry.name in SHARED and entry.is_dir():
            link_upstream(entry, cell_data / entry.name)
        elif not (cell_data / entry.name).exists():
            (cell_data / entry.name).symlink_to(entry.resolve())


def stage_env(threads: int | None) -> dict[str, str]:
    """The environment `make demo` gives a stage, and ``threads`` torch threads."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"), "PYTHONHASHSEED": "0",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DVC_NO_ANALYTICS": "1",
           "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(REPO / ".cache/torch_extensions"))}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


class StageFailed(RuntimeError):
    """A stage of a side root exited non-zero; ``stage``, its ``log`` and the log's one-line ``reason``."""

    def __init__(self, message: str, stage: str, log: Path) -> None:
        super().__init__(message)
        self.stage, self.log, self.reason = stage, log, failure_reason(log)


def failure_reason(log: Path) -> str:
    """What a failed stage said: its own one-line ``error:`` (pipeline/common/failures.py: a diverged
    fine-tuning start names the task, the start and the step), else the log's last line."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.exists() else []
    said = [ln for ln in lines if ln.startswith("error:")]
    return (said or lines or ["(nothing logged)"])[-1]


def run_stages(root: Path, stages: Iterable[str], overrides: list[str], *, threads: int | None,
               say=print) -> None:
    """Run each stage (``python -m pipeline <stage> --set ...``) in ``root``, logging to
    ``root/.matrix/<stage>.log``; a stage with its ``.done`` marker is skipped. Raises
    :class:`StageFailed` naming the stage and its log when one fails, and leaves its reason in a
    ``.failed`` marker (removed when the stage runs again)."""
    marks = root / MARKERS
    marks.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        done = marks / f"{stage}.done"
        if done.exists():
            continue
        (marks / f"{stage}.failed").unlink(missing_ok=True)
        say(f"  {root.name}: {stage}")
        cmd = [sys.executable, "-m", "pipeline", stage, "--params", "params.yaml",
               *itertools.chain.from_iterable(("--set", o) for o in overrides)]
        log_path = marks / f"{stage}.log"
        with open(log_path, "w") as log:
            code = subprocess.run(cmd, cwd=root, env=stage_env(threads), stdout=log, stderr=subprocess.STDOUT).returncode
        if code != 0:
            err = StageFailed(f"{root.name}: `{' '.join(cmd[2:])}` failed ({code}); log: {log_path}", stage, log_path)
            (marks / f"{stage}.failed").write_text(err.reason + "\n")
            raise err
        done.write_text("")


def failed_stage(root: Path, stages: Iterable[str]) -> str | None:
    """The stage of ``stages`` whose last run in ``root`` failed (its ``.failed`` marker), or None."""
    return next((s for s in stages if (root / MARKERS / f"{s}.failed").exists()), None)


def stage_failure_verdict(root: Path, stage: str) -> Verdict:
    """A failing row for a cell that stopped at ``stage``: the stage's own reason as its value."""
    reason = (root / MARKERS / f"{stage}.failed").read_text().strip()
    return Verdict("ran", stage, reason, "exit status 0", False, str(root / MARKERS / f"{stage}.log"))


def cell_record(data: Path, verdicts: list[Verdict]) -> dict[str, Any]:
    """What a cell measured: its verdicts, its gains (results rows and the Meta-Sum), the precision
    and threads pretraining really ran with, and the masking ablation when it ran."""
    results = json.loads((data / "reports" / "results.json").read_text()) if (data / "reports" / "results.json").exists() else {}
    gains = {f"{r['task']} {r['metric']}": {"gain": r.get("gain"), "interval": r.get("gain_interval"),
                                            "reading": r.get("reading")} for r in results.get("rows", [])}
    meta = results.get("meta_sum") or {}
    if meta.get("gain") is not None:
        gains["Meta-Sum"] = {"gain": meta["gain"], "interval": meta.get("gain_interval"), "reading": meta.get("reading")}
    pretrain = data / "models" / "pretrain"
    run = json.loads((pretrain / "_run.json").read_text()) if (pretrain / "_run.json").exists() else {}
    report = json.loads((pretrain / "eval.json").read_text()) if (pretrain / "eval.json").exists() else {}
    ablation = data / "reports" / "ablations.json"
    return {"verdicts": [v.to_json() for v in verdicts], "gains": gains,
            "ran_with": {"precision": report.get("precision"),
                         "torch_threads": run.get("machine", {}).get("torch_threads"),
                         "cpu": run.get("machine", {}).get("cpu"), "cpu_id": run.get("machine", {}).get("cpu_id")},
            "ablation": json.loads(ablation.read_text())["masking"] if ablation.exists() else None}


def _cell_text(value: Any) -> str:
    """A verdict's value as a table cell: a stage's error may hold a ``|``, which would split the row."""
    return "" if value is None else str(value).replace("|", "\\|")


def _spread(values: list[float]) -> str:
    if not values:
        return "–"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):+.1f} ± {sd:.1f} ({min(values):+.1f}..{max(values):+.1f})"


def matrix_markdown(cells: Mapping[str, Mapping[str, Any]], until: str | None = None) -> str:
    """The verdict table (one row per check and subject, one column per cell) and the gain table;
    ``until``: the stage each cell stopped after, when not all of them ran."""
    names = list(cells)
    stamp = rig_stamp()
    stopped = f"; each cell ran up to `{until}` (the checks of later stages read n/a)" if until else ""
    lines = [f"Mini world v{stamp['mini_world_version']}, checks v{stamp['checks_version']}; "
             f"{len(names)} cells (pretraining seed - precision - torch threads){stopped}.", "",
             "| check | subject | margin | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for name, cell in cells.items():
        for v in cell["verdicts"]:
            rows.setdefault((v["check"], v["subject"]), {"margin": v["margin"]})[name] = v
    for (check, subject), by_cell in rows.items():
        shown = [f"{verdict_mark(by_cell[n]['passed'])} {_cell_text(by_cell[n]['value'])}".strip()
                 if n in by_cell else "–" for n in names]
        lines.append(f"| {check} | {subject} | {by_cell['margin']} | " + " | ".join(shown) + " |")
    lines += ["", "Ran with (pretraining's eval.json and _run.json): " + "; ".join(
        f"{n}: {c['ran_with']['precision']}, {c['ran_with']['torch_threads']} threads" for n, c in cells.items()), ""]
    gains: dict[str, dict[str, Any]] = {}
    for name, cell in cells.items():
        for key, g in cell["gains"].items():
            gains.setdefault(key, {})[name] = g
    if any(g.get("gain") is not None for by_cell in gains.values() for g in by_cell.values()):
        lines += ["Gains of the pretrained start over the non-pretrained one (observations, not verdicts): each cell's "
                  "gain and how its 95% interval reads; the last column is the spread over the cells (mean ± sd "
                  "(min..max)).", "",
                  "| gain | " + " | ".join(names) + " | over the cells |", "|---|" + "---|" * (len(names) + 1)]
        for key, by_cell in gains.items():
            values = [float(g["gain"]) for g in by_cell.values() if g.get("gain") is not None]
            shown = [f"{by_cell[n]['gain']:+.1f} {by_cell[n]['reading']}" if by_cell.get(n, {}).get("gain") is not None
                     else "–" for n in names]
            lines.append(f"| {key} | " + " | ".join(shown) + f" | {_spread(values)} |")
    ablations = {n: c["ablation"] for n, c in cells.items() if c.get("ablation")}
    if ablations:
        lines += ["", "Masking ablation (joint - conditional, held-out; an observation):", "",
                  "| metric | " + " | ".join(ablations) + " | over the cells |", "|---|" + "---|" * (len(ablations) + 1)]
        for label in next(iter(ablations.values()))["metrics"]:
            diffs = {n: a["metrics"][label].get("joint", 0) - a["metrics"][label].get("conditional", 0)
                     for n, a in ablations.items() if None not in a["metrics"][label].values()}
            lines.append(f"| {label} | " + " | ".join(f"{diffs[n]:+.4f}" if n in diffs else "–" for n in ablations)
                         + f" | {_spread([100 * d for d in diffs.values()])} (x100) |")
    return "\n".join(lines) + "\n"


def cell_stages(until: str | None, ablation: bool) -> tuple[str, ...]:
    """The stages a cell runs: :data:`CELL_STAGES` up to ``until`` (all when None), then the ablation's
    when ``ablation`` (they read the cell's pretraining only)."""
    cell = CELL_STAGES if until is None else CELL_STAGES[:CELL_STAGES.index(until) + 1]
    return cell + (ABLATION_STAGES if ablation else ())


def cell_finished(runs: list[Path], stages: tuple[str, ...]) -> bool:
    """True when the cell's first run stopped at a failed stage, or each of its runs (the first, its
    rerun) did every stage or stopped at a failed one."""
    def over(root: Path) -> bool:
        return failed_stage(root, stages) is not None or all((root / MARKERS / f"{s}.done").exists() for s in stages)

    return failed_stage(runs[0], stages) is not None or all(over(r) for r in runs)


def cell_verdicts(runs: list[Path], stages: tuple[str, ...], ran: set[str] | None) -> list[Verdict]:
    """Every verdict of the cell (its first run; the rerun compared with it). A run stopped at a
    failed stage adds that stage's failing row and compares with no rerun; where the first run
    stopped, the checks of the stages it did not finish read n/a."""
    stopped = [(root, stage) for root in runs if (stage := failed_stage(root, stages)) is not None]
    if not stopped:
        return evaluate(runs[0] / "data", rerun=runs[1] / "data" if len(runs) > 1 else None, ran=ran)
    root, stage = stopped[0]
    if root == runs[0]:
        finished = set(UPSTREAM_STAGES) | set(stages[:stages.index(stage)])
        ran = finished if ran is None else ran & finished
    return evaluate(runs[0] / "data", ran=ran) + [stage_failure_verdict(root, stage)]


def run_matrix(args: argparse.Namespace, say=print) -> dict[str, Any]:
    out = Path(args.out).resolve()
    overrides = list(args.set or [])
    if args.overrides:
        overrides = [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip()}"
                     for k, v in yaml.safe_load(Path(args.overrides).read_text()).items()] + overrides
    raw = matrix_params(Path(args.params), overrides)
    upstream = out / "upstream"
    upstream.mkdir(parents=True, exist_ok=True)
    (upstream / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    if not args.no_run:
        say(f"upstream: {', '.join(UPSTREAM_STAGES)} in {upstream}")
        run_stages(upstream, UPSTREAM_STAGES, [], threads=None, say=say)
    finetune_seed = raw["finetune"].get("seed") or raw["seed"]
    cells: dict[str, Any] = {}
    stages = cell_stages(args.until, args.ablation)
    ran = None if args.until is None else set(UPSTREAM_STAGES) | set(stages)
    setting = dict(overrides=overrides, seeds=args.seeds, precisions=args.precisions, threads=args.threads,
                   finetune_seed=finetune_seed, until=args.until)
    grid = list(itertools.product(args.seeds, args.precisions, args.threads))
    for i, (seed, precision, threads) in enumerate(grid):
        name = cell_name(seed, precision, threads)
        cell_overrides = [f"seed={seed}", f"finetune.seed={finetune_seed}", f"pretrain.precision={precision}",
                          f"finetune.precision={precision}"]
        runs = [out / "cells" / name] + ([out / "cells" / f"{name}-rerun"] if args.rerun and i == 0 else [])
        if args.no_run and not cell_finished(runs, stages):  # tabulate only what has run
            continue
        for root in [] if args.no_run else runs:
            root.mkdir(parents=True, exist_ok=True)
            (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
            link_upstream(upstream / "data", root / "data")
            try:
                run_stages(root, stages, cell_overrides, threads=threads, say=say)
            except StageFailed as err:  # tabulated as a failing row; the other cells still run
                say(f"  {err}\n  {name}: {err.reason}")
                break
        verdicts = cell_verdicts(runs, stages, ran)
        cells[name] = cell_record(runs[0] / "data", verdicts)
        say(f"  {name}: {sum(v.passed is True for v in verdicts)} pass, {len(failed(verdicts))} fail")
        write_tables(out, cells, **setting)  # after each cell: a long run shows progress
    return write_tables(out, cells, **setting)


def write_tables(out: Path, cells: Mapping[str, Any], **setting: Any) -> dict[str, Any]:
    """``matrix.json`` and ``matrix.md`` of the cells so far; returns the record."""
    record = {**rig_stamp(), **setting, "cells": dict(cells)}
    (out / "matrix.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    (out / "matrix.md").write_text(matrix_markdown(cells, setting.get("until")))
    return record


def show_matrix(args: argparse.Namespace, console: Any) -> int:
    try:
        record = run_matrix(args, say=console.print)
    except RuntimeError as err:
        console.print(f"[red]error:[/red] {err}")
        return 1
    console.print((Path(args.out) / "matrix.md").read_text(), markup=False)
    bad = sum(1 for c in record["cells"].values() for v in c["verdicts"] if v["passed"] is False)
    console.print(f"{bad} failing verdicts over {len(record['cells'])} cells; written: {Path(args.out) / 'matrix.md'}")
    return 1 if bad else 0


def add_matrix_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("matrix", help="run the graph over pretraining seeds x precisions x threads; verdicts per cell",
                       description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for the side roots, matrix.json and matrix.md")
    p.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    p.add_argument("--overrides", metavar="YAML", help="dotted params keys applied first (e.g. tests/e2e/tiny_overrides.yaml)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one params key (repeatable)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1234, 1, 2], help="pretraining seeds (default: 1234 1 2)")
    p.add_argument("--precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch threads (default: 1 2)")
    p.add_argument("--rerun", action="store_true", help="run the first cell twice: byte-identical outputs")
    p.add_argument("--ablation", action="store_true", help="also the masking ablation (ablations/dvc.yaml) per cell")
    p.add_argument("--until", choices=CELL_STAGES, help="a cell's last stage (default: all of them, to results); "
                                                       "the checks of the stages not run read n/a")
    p.add_argument("--no-run", action="store_true", help="run nothing: tabulate the cells whose stages are all done")
    p.set_defaults(func=show_matrix)
