"""``python -m pipeline budgets TASK --steps ...``: a task's fine-tuning budget chosen on its dev split.

Usage (after ``make demo``, from the repository root)::

    python -m pipeline budgets vcr --steps 150 300 600     # or: make budgets TASK=vcr STEPS="150 300 600"
    python -m pipeline budgets vcr --steps 150 300 600 --start scratch

Each point trains one start alone (``--start``: the pretrained one by default, or the
non-pretrained one, whose choice goes to ``finetune.scratch_per_task``) for N steps (warmup
N // 10, every other key as the params say for that start) in a side data root,
``<out>/steps<N>/``, that reads the run's stores and start model (the links of ``python -m
pipeline seeds``), and scores it on the **dev split only**: the task is
opened with ``dev_only``, so no test split is read, let alone scored. Points run side by side,
one process and one thread each, as each start trains in the run (``--jobs``, default: one per
core). The point at the run's own budget is read from the run (``data/models/<task>/``) unless
``--no-reuse-run``. Both starts are chosen by the same rule over the grid given.

The rule (docs/decisions.md#finetune-budgets): a point's score is the
mean of the task's headline metrics on dev (retrieval: IR and TR R@1); its standard error
``sqrt(sum_k p_k (1 - p_k) / n_k) / K`` over the K metrics (binomial on each metric's n dev
items); the choice is the **cheapest point whose score is within one standard error of the best
point's** (:func:`choose`). Writes ``<out>/budgets.json`` and ``<out>/budgets.md`` (default
``<data>/budgets/<task>``, ``<data>/budgets/<task>_scratch`` for the scratch start); exit status 2
for bad arguments or params.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Sequence

from pipeline.common.runinfo import RUN_FILE
from pipeline.training.paired import ITEMS_FILE
from pipeline.finetune.seed_sweep import LoadParams, link_inputs, parse_sweep, run_beside, sweep_parser
from pipeline.params.parser import Params

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Point:
    """One budget's dev result: ``score`` and ``se`` in points, ``metrics`` {metric: score}, ``items``
    {metric: dev items}, ``source``: "sweep" or "run" (the run's own fine-tuning)."""

    steps: int
    score: float
    se: float
    metrics: dict[str, float]
    items: dict[str, int]
    source: str


START_CHOICES = ("pretrained", "scratch")


def default_out(data: Path, task: str, start: str = "pretrained") -> Path:
    """Where a sweep of ``task`` writes when ``--out`` is not given: ``<data>/budgets/<task>``
    (``<task>_scratch`` for the non-pretrained start)."""
    return data / "budgets" / (task if start == "pretrained" else f"{task}_{start}")


def warmup_of(steps: int) -> int:
    """A tenth of the steps, as every budget of params.yaml."""
    return steps // 10


def dev_point(steps: int, dev: str, metrics: Sequence[str], items: Mapping[str, Mapping[str, list]],
              source: str) -> Point:
    """The rule's score and standard error from the dev item scores ({"split/metric": item_scores})."""
    means, variances, counts = {}, [], {}
    for metric in metrics:
        scores = items[f"{dev}/{metric}"]["scores"]
        if not scores:
            raise ValueError(f"{dev}/{metric}: no dev items to score a budget on")
        p = sum(scores) / len(scores)
        means[metric], counts[metric] = round(100 * p, 4), len(scores)
        variances.append(p * (1 - p) / len(scores))
    score = sum(means.values()) / len(means)
    se = 100 * math.sqrt(sum(variances)) / len(variances)
    return Point(steps=steps, score=round(score, 4), se=round(se, 4), metrics=means, items=counts, source=source)


def choose(points: Sequence[Point]) -> int:
    """The steps of the cheapest point whose score is at least the best score minus the best point's SE.

    Ties of the best score go to the cheaper point (its SE then sets the bar)."""
    if not points:
        raise ValueError("no budget points to choose from")
    best = max(points, key=lambda p: (p.score, -p.steps))
    return min(p.steps for p in points if p.score >= best.score - best.se)


def point_overrides(task: str, steps: int, root: Path, start: str = "pretrained", *,
                    base: Params | None = None) -> list[str]:
    """What one point changes in the params: its data root and its start's budget (the scratch
    start's lr and batch as ``base`` gives that start), no scratch comparison."""
    if start == "pretrained":
        key = f"finetune.per_task.{task}"
        budget = [f"{key}.steps={steps}", f"{key}.warmup_steps={warmup_of(steps)}"]
    else:
        assert base is not None, "the scratch start's point needs the base params"
        from pipeline.params.parser import to_dict

        # every key of the scratch start's budget as it is (lr, batch, ...), only steps and warmup swept
        own = dict(to_dict(base.finetune.budget(task, "scratch")), steps=steps, warmup_steps=warmup_of(steps))
        budget = [f"finetune.scratch_per_task.{task}={json.dumps(own)}"]
    return [f"paths.data={root}", *budget, "finetune.compare_scratch=false"]


def _init_point_worker() -> None:
    """A pool process that trains points: set up as the stage's training children, on one thread,
    and ended without the interpreter's teardown."""
    from pipeline.common.exiting import end_at_interpreter_exit
    from pipeline.finetune.finetune import start_cpu_child

    start_cpu_child("[budgets]", 1)
    end_at_interpreter_exit()


def train_point(params: Params, task: str, start: str = "pretrained") -> dict[str, dict[str, list]]:
    """Pool job: train ``params``' ``start`` of ``task``, scored on dev; its dev item scores."""
    import torch

    from pipeline.finetune.finetune import train_start_on_cpu
    from pipeline.training.engine import resolve_precision

    precision = resolve_precision(params.finetune.precision, torch.device("cpu"))
    return train_start_on_cpu(params, task, start, precision=precision, dev_only=True).items


def run_point(params: Params, task: str, start: str = "pretrained") -> Point | None:
    """The run's own point: its ``start``'s dev items, if ``<data>/models/<task>/`` was trained
    under these params (its ``_run.json`` digest, which covers both starts' budgets) with the
    sweep's warmup (:func:`warmup_of`) and has that start; else None."""
    from pipeline.finetune.finetune import task_digest

    budget = params.finetune.budget(task, start)
    if budget.warmup_steps != warmup_of(budget.steps):
        return None
    model_dir = Path(params.paths.data) / "models" / task
    run_file, items_file = model_dir / RUN_FILE, model_dir / ITEMS_FILE
    if not (run_file.is_file() and items_file.is_file()):
        return None
    if json.loads(run_file.read_text()).get("params_digest") != task_digest(params, task):
        return None
    items = json.loads(items_file.read_text()).get(start)
    if items is None:
        return None
    return dev_point(budget.steps, dev_split(task), headline_metrics(task), items, "run")


def dev_split(task: str) -> str:
    from pipeline.finetune.tasks.base import pooled
    from pipeline.params.finetune import TASK_SPLITS

    return pooled(TASK_SPLITS[task].dev)


def headline_metrics(task: str) -> list[str]:
    from pipeline.finetune.tasks import task_class

    return [metric for _, metric in task_class(task).headline]


def sweep(load: LoadParams, base: Params, task: str, steps: Sequence[int], out: Path, *, jobs: int,
          reuse_run: bool = True, wait: bool | float = True, start: str = "pretrained") -> list[Point]:
    """Every point of ``steps`` (ascending), trained side by side ``jobs`` at a time, or the run's own.
    Holds the stage's locks on each point's root (``wait``: as ``UNITER_LOCK_WAIT``)."""
    from pipeline.common.locking import stage_locks
    from pipeline.finetune.tasks import task_class
    from pipeline.params.pretrain import output_name

    data = Path(base.paths.data)
    own = run_point(base, task, start) if reuse_run else None
    points = {own.steps: own} if own is not None and own.steps in steps else {}
    todo = [n for n in sorted(steps) if n not in points]
    init_name = output_name(task_class(task).init_stage, base.pretrain.out_name)
    for n in todo:
        link_inputs(data, out / f"steps{n}", init_name)
    if todo:
        log.info("budgets: %s at %s steps, %d side by side (one thread each)%s", task, todo, min(jobs, len(todo)),
                 f"; {own.steps} steps from the run" if points else "")
    with contextlib.ExitStack() as held:
        for n in todo:  # the stage's locks on each point's root, as `finetune` takes them on the run's
            held.enter_context(stage_locks(out / f"steps{n}", "finetune", task, wait=wait))
        pool = held.enter_context(ProcessPoolExecutor(max_workers=max(1, min(jobs, len(todo))),
                                                      mp_context=_spawn(), initializer=_init_point_worker))
        futures = {n: pool.submit(train_point, load(point_overrides(task, n, out / f"steps{n}", start, base=base)),
                                  task, start) for n in todo}
        for n, future in futures.items():
            points[n] = dev_point(n, dev_split(task), headline_metrics(task), future.result(), "sweep")
            log.info("budgets: %s %d steps: dev %.2f ± %.2f", task, n, points[n].score, points[n].se)
    return [points[n] for n in sorted(points)]


def _spawn():
    import multiprocessing

    return multiprocessing.get_context("spawn")  # fresh interpreters: no forked OpenMP pools or LMDB handles


def budgets_markdown(task: str, points: Sequence[Point], chosen: int, current: int, start: str = "pretrained") -> str:
    best = max(points, key=lambda p: (p.score, -p.steps))
    title = "" if start == "pretrained" else f" of the {start} start"
    key = f"finetune.per_task.{task}" if start == "pretrained" else f"finetune.scratch_per_task.{task}"
    lines = [f"# {task}: the fine-tuning budget{title} on dev", "",
             f"{start.capitalize()} start alone, dev split {dev_split(task)} only; score: the mean of "
             f"{', '.join(headline_metrics(task))}; the cheapest point within one SE of the best is chosen.", "",
             "| steps | dev score | SE | per metric | dev items | from |", "|---:|---:|---:|---|---|---|"]
    for p in points:
        per = ", ".join(f"{m} {v:.2f}" for m, v in p.metrics.items())
        items = ", ".join(str(v) for v in p.items.values())
        mark = " (chosen)" if p.steps == chosen else ""
        lines.append(f"| {p.steps}{mark} | {p.score:.2f} | {p.se:.2f} | {per} | {items} | {p.source} |")
    lines += ["", f"Best {best.steps} steps ({best.score:.2f}); the bar {best.score - best.se:.2f}; "
                  f"chosen **{chosen}** (params.yaml, `{key}`: {current}).", ""]
    return "\n".join(lines)


def write_budgets(task: str, points: Sequence[Point], out: Path, current: int, start: str = "pretrained") -> int:
    chosen = choose(points)
    out.mkdir(parents=True, exist_ok=True)
    record = {"task": task, "start": start, "dev_split": dev_split(task), "chosen": chosen, "current": current,
              "rule": "cheapest point with score >= best score - best SE", "points": [asdict(p) for p in points]}
    (out / "budgets.json").write_text(json.dumps(record, indent=1))
    (out / "budgets.md").write_text(budgets_markdown(task, points, chosen, current, start))
    return chosen


def build_parser() -> argparse.ArgumentParser:
    p = sweep_parser("python -m pipeline budgets", "Choose one task's fine-tuning budget on its dev split.",
                     out_help="where the points' data roots and the table go (default: <data>/budgets/<task>)",
                     set_help="override one params key for every point (repeatable)")
    p.add_argument("--steps", type=int, nargs="+", required=True, metavar="N", help="budgets to compare")
    p.add_argument("--start", choices=START_CHOICES, default="pretrained",
                   help="the start whose budget is chosen (default: pretrained; scratch: finetune.scratch_per_task)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="points side by side (default: one a core)")
    p.add_argument("--reuse-run", action=argparse.BooleanOptionalAction, default=True,
                   help="take the point at params.yaml's budget from the run's own fine-tuning (default)")
    return p


def check_args(args: argparse.Namespace, params: Params) -> str | None:
    """The reason the sweep cannot run with these arguments (the task is known), or None."""
    from pipeline.params.checks import MAX_STEPS

    if len(set(args.steps)) != len(args.steps) or len(args.steps) < 2:
        return f"--steps needs at least 2 distinct budgets, got {args.steps}"
    if not all(1 <= n <= MAX_STEPS for n in args.steps):
        return f"--steps must lie in [1, {MAX_STEPS}], got {args.steps}"
    if args.jobs < 1:
        return f"--jobs must be >= 1, got {args.jobs}"
    return None


def main(argv: list[str]) -> int:
    call = parse_sweep(build_parser(), argv, check_args, default_out)
    if isinstance(call, int):
        return call
    args, params, start = call.args, call.params, call.args.start
    out = call.out if args.out else default_out(Path(params.paths.data), args.task, start)
    points = run_beside(lambda: sweep(call.load, params, args.task, args.steps, out, jobs=args.jobs,
                                      reuse_run=args.reuse_run, wait=call.wait, start=start))
    if isinstance(points, int):
        return points
    current = params.finetune.budget(args.task, start).steps
    chosen = write_budgets(args.task, points, out, current, start)
    for p in points:
        print(f"{args.task} ({start}) {p.steps} steps: dev {p.score:.2f} ± {p.se:.2f} ({p.source})")
    print(f"{args.task} ({start}): chosen {chosen} steps (params.yaml: {current}); written: {out / 'budgets.md'}")
    return 0
