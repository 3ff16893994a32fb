"""Training metrics: running means over a logging interval, dvclive output, validation.

Per-task metrics come from the model's ``metrics`` dict. Accuracies are averaged weighted by
their count (``n_tokens`` for MLM, ``n_regions`` for region tasks, ``n_pairs`` for ITM), so an
interval's accuracy is the accuracy over all its targets, not a mean of batch accuracies.
Means are reduced over ranks before they are logged; only rank 0 writes.
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch

from pipeline.common.ownership import claim_dir

log = logging.getLogger(__name__)

COUNT_KEYS = ("n_tokens", "n_regions", "n_pairs", "n_pos", "n_neg")
# metrics that average over a subset of the batch, weighted by that subset's count instead
SUBSET_COUNTS = {"ot_pos": "n_pos", "ot_neg": "n_neg"}


def _weight(metrics: Mapping[str, float]) -> float:
    for key in COUNT_KEYS:
        if key in metrics:
            return float(metrics[key])
    return 1.0


class RunningMeans:
    """Sums of ``value * weight`` and of weights per name, for one logging interval."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}

    def add(self, prefix: str, loss: float, metrics: Mapping[str, float]) -> None:
        """One batch of task ``prefix``: its loss (weight 1) and its metrics (weighted by their count;
        a metrics entry named ``loss`` is the same loss and is not counted twice)."""
        self._add(f"{prefix}/loss", loss, 1.0)
        w = _weight(metrics)
        for key, value in metrics.items():
            if key in COUNT_KEYS or key == "loss":  # counts are weights; the loss is logged above
                continue
            weight = float(metrics[SUBSET_COUNTS[key]]) if SUBSET_COUNTS.get(key) in metrics else w
            if weight > 0:  # an empty subset's mean is undefined (nan): it adds nothing
                self._add(f"{prefix}/{key}", float(value), weight)

    def add_value(self, name: str, value: float, weight: float = 1.0) -> None:
        self._add(name, value, weight)

    def _add(self, name: str, value: float, weight: float) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + value * weight
        self.weights[name] = self.weights.get(name, 0.0) + weight

    def reduce(self) -> dict[str, float]:
        """Means over every rank's batches (a collective: all ranks must call it)."""
        import torch.distributed as dist

        sums, weights = dict(self.sums), dict(self.weights)
        if dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, (sums, weights))
            sums, weights = {}, {}
            for s, w in gathered:
                for k in s:
                    sums[k] = sums.get(k, 0.0) + s[k]
                    weights[k] = weights.get(k, 0.0) + w[k]
        return {k: sums[k] / weights[k] for k in sorted(sums) if weights[k] > 0}

    def state_dict(self) -> dict[str, Any]:
        return {"sums": dict(self.sums), "weights": dict(self.weights)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sums, self.weights = dict(state["sums"]), dict(state["weights"])

    def clear(self) -> None:
        self.sums.clear()
        self.weights.clear()


def truncate_dvclive(directory: Path, after_step: int) -> None:
    """Make dvclive's files look as they did at ``after_step`` (a resumed run redoes later steps).

    Rows with step > ``after_step`` are dropped from every ``plots/metrics/**.tsv``, and so is a
    half-written last row left by a kill. ``metrics.json`` (the summary, possibly half-written too)
    is rebuilt from each file's last remaining row.
    """
    directory = Path(directory)
    summary: dict[str, Any] = {}
    plots = directory / "plots" / "metrics"
    for tsv in sorted(plots.rglob("*.tsv")):
        with tsv.open(newline="") as fh:
            rows = list(csv.reader(fh, delimiter="\t"))
        if not rows or "step" not in rows[0]:
            continue
        header, step_col = rows[0], rows[0].index("step")
        kept = [header]
        for r in rows[1:]:
            try:
                if len(r) == len(header) and int(r[step_col]) <= after_step:
                    float(r[1 - step_col])
                    kept.append(r)
            except ValueError:
                continue  # a row cut short by the kill
        with tsv.open("w", newline="") as fh:
            csv.writer(fh, delimiter="\t", lineterminator="\n").writerows(kept)
        if len(kept) > 1:
            node = summary
            parts = tsv.relative_to(plots).with_suffix("").parts
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = float(kept[-1][1 - step_col])
    summary["step"] = after_step
    (directory / "metrics.json").write_text(json.dumps(summary, indent=4) + "\n")


class MetricsLogger:
    """dvclive on rank 0 (``dir/metrics.json`` + ``dir/plots/metrics/**.tsv``); no-op on other ranks.

    dvclive clears its files in ``directory`` on a fresh start, so the directory is claimed for
    ``stage`` first (pipeline/common/ownership.py): a folder the pipeline did not create is refused.
    """

    def __init__(self, directory: Path, *, stage: str, enabled: bool, resume_step: int | None,
                 params: Mapping[str, Any]) -> None:
        self.live = None
        if not enabled:
            return
        from dvclive import Live

        directory = claim_dir(directory, stage)
        if resume_step is not None and directory.exists():
            truncate_dvclive(directory, resume_step)
        self.live = Live(str(directory), resume=resume_step is not None, dvcyaml=None, save_dvc_exp=False,
                         report=None)
        self.live.log_params(dict(params))

    def log(self, step: int, values: Mapping[str, float]) -> None:
        if self.live is None:
            return
        self.live.step = step
        for name, value in values.items():
            self.live.log_metric(name, float(value))
        self.live.make_summary()

    def close(self) -> None:
        if self.live is not None:
            self.live.end()


@torch.no_grad()
def evaluate(forward: Callable[[dict[str, Any], str], Any], batches: Mapping[str, Iterable[dict[str, Any]]],
             *, prepare: Callable[[dict[str, Any]], dict[str, Any]], module: torch.nn.Module,
             prefix: str = "val") -> dict[str, float]:
    """Mean loss and metrics per task over fixed held-out batches (a collective: all ranks call it).

    ``batches[task]`` is this rank's share of the task's held-out batches; ``forward(batch, task)``
    returns an object with ``loss`` and ``metrics``. The module is put in eval mode (no dropout)
    and restored to its previous mode afterwards.
    """
    was_training = module.training
    module.eval()
    means = RunningMeans()
    try:
        for task, task_batches in batches.items():
            for batch in task_batches:
                out = forward(prepare(batch), task)
                means.add(f"{prefix}/{task}", float(out.loss), out.metrics)
    finally:
        module.train(was_training)
    return means.reduce()
