"""``python -m pipeline seeds TASK``: one task fine-tuned again under other seeds, and its gain's spread.

Usage (after ``make demo``, from the repository root)::

    python -m pipeline seeds vcr --seeds 1 2 3          # or: make seeds TASK=vcr SEEDS="1 2 3"
    python -m pipeline seeds nlvr2 --seeds 1 2 --set finetune.per_task.nlvr2.steps=600

A test split's paired interval covers the sampling of test items, not the training draw; this
measures the draw for one task at the cost of that task alone (``make seeds`` without ``TASK``
reruns every task per seed through ``dvc exp run``). Each seed S runs the real ``finetune`` stage
with ``finetune.seed=S`` in a side data root, ``<out>/seed<S>/``, whose ``db``, ``manifests`` and
start model (``models/<init>``) are links to the run's own: the run's outputs are never touched. The seed
changes the heads' start, the batch order and dropout of both starts; the pretrained model and the
data stay the same. Writes ``<out>/spread.json`` and ``<out>/spread.md``: per headline metric, each
seed's pretrained and non-pretrained scores and gain with its interval, and over the seeds the
mean, sample sd and range of each (``pipeline.training.paired.spread``).
Exit status 2 for bad arguments or params (an unknown task, no scratch start to compare with).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

from pipeline.params.finetune import seed_root, seed_sweep_dir
from pipeline.params.parser import Params
from pipeline.training.paired import COLUMNS, spread, spread_cell

log = logging.getLogger(__name__)

# what stage finetune reads under paths.data besides its start model (dvc.yaml's deps of finetune@*):
# the stores, and the manifests (VQA's human answers score its accuracy)
SHARED_INPUTS = ("db", "manifests")
LoadParams = Callable[[list[str]], Params]  # extra ``--set`` overrides -> parsed params
T = TypeVar("T")


def link_inputs(data: Path, root: Path, init_name: str) -> None:
    """Make ``root`` a data root that reads ``data``'s inputs of the stage (symlinks) and writes its own."""
    for rel in (*SHARED_INPUTS, f"models/{init_name}"):
        source, link = (data / rel).resolve(), root / rel
        if not source.is_dir():
            raise FileNotFoundError(f"{source}: missing; run the pipeline up to the task first (make demo)")
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() and link.resolve() == source:
            continue
        if link.exists() or link.is_symlink():
            raise FileExistsError(f"{link}: exists and is not a link to {source}")
        link.symlink_to(source, target_is_directory=True)


def sweep(load: LoadParams, base: Params, task: str, seeds: Sequence[int], out: Path, *,
          wait: bool | float = True) -> dict[int, dict[str, Any]]:
    """Run stage ``finetune`` for ``task`` once per seed in ``out/seed<S>``; returns {seed: metrics record}.

    ``base``: the run's params (``load([])``). Each seed's run holds the stage's locks on its side
    root, as ``python -m pipeline finetune`` does on the run's, so two sweeps into one ``out`` wait
    (``wait``: as ``UNITER_LOCK_WAIT``) instead of writing one directory together.
    """
    from pipeline.common.locking import stage_locks
    from pipeline.finetune.finetune import run as finetune
    from pipeline.finetune.tasks import task_class
    from pipeline.params.pretrain import output_name

    init_name = output_name(task_class(task).init_stage, base.pretrain.out_name)
    records = {}
    for n, seed in enumerate(seeds, 1):
        root = seed_root(out, seed)
        link_inputs(Path(base.paths.data), root, init_name)
        log.info("seeds: %s, seed %d (%d/%d) in %s", task, seed, n, len(seeds), root)
        with stage_locks(root, "finetune", task, wait=wait):
            records[seed] = finetune(load([f"paths.data={root}", f"finetune.seed={seed}"]), task)[task]
    return records


def spread_rows(records: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per headline metric (the records' ``summary`` keys): ``per_seed`` {seed: {pretrained,
    scratch, gain, low, high}} and the spread over seeds of each of COLUMNS."""
    first = next(iter(records.values()))["summary"]
    rows = []
    for key in first:
        per_seed = {}
        for seed, record in records.items():
            entry = record["summary"][key]
            interval = entry.get("gain_interval") or {}
            per_seed[seed] = {"pretrained": entry["pretrained"], "scratch": entry["scratch"], "gain": entry["gain"],
                              "low": interval.get("low"), "high": interval.get("high")}
        rows.append({"metric": key, "label": first[key].get("label", key),
                     "per_seed": per_seed,
                     **{c: spread([float(v[c]) for v in per_seed.values()]) for c in COLUMNS}})
    return rows


def _interval(v: Mapping[str, Any]) -> str:
    return "–" if v["low"] is None else f"[{v['low']:+.2f}, {v['high']:+.2f}]"


def spread_markdown(task: str, rows: list[dict[str, Any]]) -> str:
    lines = [f"# {task}: fine-tuning over seeds", ""]
    for r in rows:
        lines += [f"## {r['label']} (`{r['metric']}`)", "", "| seed | pretrained | non-pretrained | gain | 95% interval |",
                  "|---:|---:|---:|---:|---|"]
        lines += [f"| {s} | {v['pretrained']:.2f} | {v['scratch']:.2f} | {v['gain']:+.2f} | {_interval(v)} |"
                  for s, v in r["per_seed"].items()]
        lines += ["", "Over the seeds, mean ± sample sd (min..max): " + "; ".join(
            f"{c} {spread_cell(r[c], digits=2)}" for c in COLUMNS), ""]
    return "\n".join(lines)


def write_spread(task: str, records: Mapping[int, Mapping[str, Any]], out: Path) -> list[dict[str, Any]]:
    rows = spread_rows(records)
    (out / "spread.json").write_text(json.dumps({"task": task, "seeds": list(records), "rows": rows}, indent=1))
    (out / "spread.md").write_text(spread_markdown(task, rows))
    return rows


def sweep_parser(prog: str, description: str, *, out_help: str, set_help: str) -> argparse.ArgumentParser:
    """The arguments every sweep beside the run takes: TASK, ``--out``, ``--params``, ``--set``."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("task", help="the task (one of finetune.tasks' names)")
    p.add_argument("--out", type=Path, help=out_help)
    p.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=set_help)
    return p


def build_parser() -> argparse.ArgumentParser:
    p = sweep_parser("python -m pipeline seeds",
                     "Fine-tune one task under several seeds beside the run; its gain's spread.",
                     out_help="where the seeds' data roots and the spread go (default: <data>/seeds/<task>)",
                     set_help="override one params key for every seed (repeatable)")
    p.add_argument("--seeds", type=int, nargs="+", required=True, metavar="S", help="finetune.seed values")
    return p


def check_args(args: argparse.Namespace, params: Params) -> str | None:
    """The reason the sweep cannot run with these arguments (the task is known), or None."""
    if not params.finetune.compare_scratch:
        return "finetune.compare_scratch is false: there is no non-pretrained start to measure a gain against"
    if len(set(args.seeds)) != len(args.seeds) or len(args.seeds) < 2:
        return f"--seeds needs at least 2 distinct seeds, got {args.seeds}"
    return None


@dataclass(frozen=True)
class SweepCall:
    """A sweep command's parsed call: its arguments, params loader (``--params`` with ``--set``) and
    params, where it writes (``--out`` or its default below ``paths.data``) and how long it waits
    for a side root's lock (``UNITER_LOCK_WAIT``)."""

    args: argparse.Namespace
    load: LoadParams
    params: Params
    out: Path
    wait: bool | float


def parse_sweep(parser: argparse.ArgumentParser, argv: list[str],
                check: Callable[[argparse.Namespace, Params], str | None],
                out_of: Callable[[Path, str], Path]) -> SweepCall | int:
    """The :class:`SweepCall` of ``argv`` (``out_of(data, task)``: the default ``--out``); or exit
    status 2, the reason printed, when the params, the lock wait, the task or ``check(args, params)``
    have a problem."""
    from pipeline.common.locking import wait_from_env
    from pipeline.common.progress import configure_logging
    from pipeline.params.finetune import TASKS
    from pipeline.params.parser import ParamsError, load_params

    args = parser.parse_args(argv)
    configure_logging()

    def load(extra: list[str]) -> Params:
        return load_params(args.params, [*args.overrides, *extra])

    try:
        params = load([])
        wait = wait_from_env()
    except (ParamsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    unknown = f"unknown task {args.task!r}; expected one of {list(TASKS)}" if args.task not in TASKS else None
    problem = unknown or check(args, params)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return SweepCall(args=args, load=load, params=params, out=args.out or out_of(Path(params.paths.data), args.task),
                     wait=wait)


def run_beside(work: Callable[[], T]) -> T | int:
    """``work()``, or the exit status of its failure, the reason printed: 3 (``BUSY_EXIT``) when a side
    root is being written by another run, 1 when the run's inputs are missing or a side root's input
    is not a link to them."""
    from pipeline.common.locking import BUSY_EXIT, LockBusy

    try:
        return work()
    except LockBusy as err:
        print(f"error: {err}", file=sys.stderr)
        return BUSY_EXIT
    except (FileNotFoundError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def main(argv: list[str]) -> int:
    call = parse_sweep(build_parser(), argv, check_args, seed_sweep_dir)
    if isinstance(call, int):
        return call
    args, out = call.args, call.out
    records = run_beside(lambda: sweep(call.load, call.params, args.task, args.seeds, out, wait=call.wait))
    if isinstance(records, int):
        return records
    for r in write_spread(args.task, records, out):
        g, each = r["gain"], ", ".join(f"{v['gain']:+.2f}" for v in r["per_seed"].values())
        print(f"{args.task} {r['label']}: gain {g['mean']:+.2f} ± {g['sd']:.2f} over seeds {list(records)} ({each})")
    print(f"written: {out / 'spread.md'}")
    return 0
