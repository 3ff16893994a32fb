"""``python -m pipeline report split-size TASK``: the test split that a task's dev intervals ask for.

The protocol (docs/design.md §12) sizes a test split from dev: ``paired.groups_for_half_width(dev
interval, 2 points)``. This report recomputes that from the per-item scores a run wrote
(``<data>/models/<task>/item_scores.json``) and, where ``python -m pipeline seeds TASK`` ran, each
seed's (``<data>/seeds/<task>/seed<S>/models/<task>/item_scores.json``), one row per run, so that a
size in params.yaml can be derived again::

    python -m pipeline report split-size refcoco_plus        # the run and its seeds under data/
    python -m pipeline report split-size vqa --target 2 --dir runs/<run>/data

A dev half-width predicts a test one only where a dev group carries the items a test group does.
RefCOCO+'s do not: a val image's refs may name any target, a testA image's only the first shapes
(the mini analogue of people), a testB image's the others. So for RefCOCO+ in the mini world each
run also gives the interval of the val items a test image would carry (:func:`items_like_test`):
val's images, in the order of their ids, taken as testA and testB in turn, both ways round, each
keeping the refs to its half's shapes. The size is the largest row's (docs/decisions.md#eval-protocol).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Mapping

from rich import box
from rich.console import Console
from rich.table import Table

from pipeline.training.paired import ITEMS_FILE, groups_for_half_width, paired_gain
from pipeline.params.finetune import TASK_SPLITS, seed_roots, seed_sweep_dir
from pipeline.report.results_cli import ResultsError, guarded

STARTS = ("pretrained", "scratch")
HALVES = ("testA", "testB")


class SplitSizeError(ResultsError):
    """The sizes cannot be computed (no scores, an unknown task); the message says what is missing."""


def restrict(record: Mapping[str, list], keep: set[str]) -> dict[str, list]:
    """An item-scores record (``ids``, ``groups``, ``scores``) holding only the items in ``keep``, in order."""
    idx = [i for i, item in enumerate(record["ids"]) if item in keep]
    return {k: [record[k][i] for i in idx] for k in ("ids", "groups", "scores")}


def items_like_test(record: Mapping[str, list], shape_of: Mapping[str, str], first: str) -> set[str]:
    """The ids of the RefCOCO+ val items that test images would carry: images (groups ``coco/<id>``)
    in the order of their ids are testA and testB in turn, starting with ``first``; an image keeps
    the items whose target shape (``shape_of[item id]``) its half may refer to."""
    from pipeline.mini_world.refcoco import in_split

    images = sorted(set(record["groups"]), key=lambda g: int(g.rsplit("/", 1)[1]))
    start = HALVES.index(first)
    half = {g: HALVES[(start + k) % 2] for k, g in enumerate(images)}
    return {item for item, g in zip(record["ids"], record["groups"]) if in_split(half[g], shape_of[item])}


def refcoco_val_shapes(manifest: Path) -> dict[str, str]:
    """{item id ``val:<example_id>``: target shape} of the mini world's RefCOCO+ val refs (ingest's manifest)."""
    import pyarrow.parquet as pq

    from pipeline.mini_world.coco import categories

    shape = {c["id"]: c["supercategory"] for c in categories()}
    rows = pq.read_table(manifest, columns=["example_id", "split", "category_id"]).to_pylist()
    return {f"val:{r['example_id']}": shape[r["category_id"]] for r in rows if r["split"] == "val"}


def size_row(run: str, items: str, pretrained: Mapping[str, list], scratch: Mapping[str, list],
             target: float) -> dict[str, Any]:
    """One table row: the paired interval of the two starts' items and the test groups it asks for."""
    interval = paired_gain(pretrained, scratch)
    half_width = round((interval["high"] - interval["low"]) / 2, 2)
    return {"run": run, "items": items, "interval": interval, "half_width": half_width,
            "test_groups": groups_for_half_width(interval, target)}


def split_sizes(runs: Mapping[str, Mapping[str, Any]], metric: str, *, target: float,
                shapes: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Rows for dev metric key ``metric`` (``"val/det_accuracy"``) of every run ({label: item scores});
    with ``shapes`` (RefCOCO+), also each run's two test-like subsets."""
    rows = []
    for label, scores in runs.items():
        if metric not in scores["pretrained"]:
            raise SplitSizeError(f"run {label}: no per-item scores for {metric!r} (has {sorted(scores['pretrained'])})")
        pre, scr = (scores[s][metric] for s in STARTS)
        rows.append(size_row(label, "all", pre, scr, target))
        for first in HALVES if shapes is not None else ():
            keep = items_like_test(pre, shapes, first)
            rows.append(size_row(label, f"test-like, {first} first", restrict(pre, keep), restrict(scr, keep), target))
    return rows


def find_runs(data: Path, task: str) -> dict[str, dict[str, Any]]:
    """{label: item scores} of the run under ``data`` and of each seed of ``<data>/seeds/<task>``."""
    paths = {"the run": data / "models" / task / ITEMS_FILE}
    for seed, root in seed_roots(seed_sweep_dir(data, task)).items():
        paths[f"seed {seed}"] = root / "models" / task / ITEMS_FILE
    found = {label: json.loads(p.read_text()) for label, p in paths.items() if p.is_file()}
    if not found:
        raise SplitSizeError(f"no {ITEMS_FILE} for {task} under {data}: run "
                             f"`python -m pipeline finetune {task}` first")
    return found


def dev_metrics(data: Path, task: str) -> list[str]:
    """The dev keys of the task's headline metrics (``test/q2ar`` -> ``val/q2ar``), from its metrics file."""
    if task not in TASK_SPLITS:
        raise SplitSizeError(f"unknown task {task!r}; one of {sorted(TASK_SPLITS)}")
    path = data / "metrics" / f"{task}.json"
    if not path.is_file():
        raise SplitSizeError(f"{path} not found: run `python -m pipeline finetune {task}` first")
    dev = TASK_SPLITS[task].dev[0]
    return sorted({f"{dev}/{key.partition('/')[2]}" for key in json.loads(path.read_text())["summary"]})


def show_split_size(args: argparse.Namespace, console: Console) -> int:
    data = Path(args.dir)
    metrics = dev_metrics(data, args.task)
    runs = find_runs(data, args.task)
    shapes = None  # the test-like subsets need the mini world's shapes (data/raw/mini: its annotations)
    if args.task == "refcoco_plus" and (data / "raw" / "mini").is_dir():
        shapes = refcoco_val_shapes(data / "manifests" / "refcoco.parquet")
    for metric in metrics:
        rows = split_sizes(runs, metric, target=args.target, shapes=shapes)
        table = Table(title=f"{args.task} {metric}: test groups for a ±{args.target:g}-point interval",
                      box=box.SIMPLE_HEAD)
        for name in ("run", "dev items", "gain [95%]", "items / groups", "half-width", "test groups"):
            table.add_column(name, justify="left" if name in ("run", "dev items") else "right", no_wrap=True)
        for r in rows:
            iv = r["interval"]
            table.add_row(r["run"], r["items"], f"{iv['gain']:+.2f} [{iv['low']:+.2f}, {iv['high']:+.2f}]",
                          f"{iv['items']} / {iv['groups']}", f"{r['half_width']:.2f}", str(r["test_groups"]))
        console.print(table)
        console.print(f"largest: {max(r['test_groups'] for r in rows)} test groups")
    return 0


def add_split_size_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("split-size", help="the test split a task's dev intervals ask for",
                       description="Test groups for a gain interval of ±TARGET points, from the dev items of "
                                   "a run and its seeds (docs/design.md §12).")
    p.add_argument("task", help="a fine-tuning task (finetune.tasks' names)")
    p.add_argument("--target", type=float, default=2.0, help="the half-width asked for, in points (default: 2)")
    p.add_argument("--dir", default="data", help="the run's data directory (default: data)")
    p.set_defaults(func=guarded(show_split_size))
