"""dvc.yaml's top-level ``plots:``: every training curve, one plot per metric, for `dvc plots show`,
`dvc plots diff` and the plots of `dvc exp show` / Studio.

A plot overlays the series that belong together: train and held-out (val) of one metric, and for
a fine-tuning task both starts (pretrained, scratch), each file a line (DVC tells them apart by
their paths). Every plot has a title and both axis labels. The series are the dvclive files the
trainings write (pipeline/training/metrics.py); a series a run did not write (the scratch start
with ``finetune.compare_scratch: false``, a pretraining task that is off) is reported by DVC as not
found and the plot is drawn from the others.

    python -m pipeline.report.dvc_plots [--ablations]   # prints dvc.yaml's (ablations/dvc.yaml's) block;
                                                         # tests/test_dvc_yaml.py checks the files hold them
"""

from __future__ import annotations

from typing import Any

import yaml

from pipeline.params.finetune import TASKS
from pipeline.report.plots import STARTS, y_label

# pretraining: the series each task's batches log (model/pretraining.py: "loss" plus its metrics),
# and those of every step; the VCR stage draws no ITM (pipeline/params/pretrain.py VCR_TASKS)
PRETRAIN_SERIES = {
    "mlm": ("loss", "mlm_loss", "mlm_acc"),
    "mrfr": ("loss", "mrfr_loss"),
    "mrc": ("loss", "mrc_loss", "mrc_acc"),
    "mrc_kl": ("loss", "mrc_kl_loss", "mrc_acc"),
    "itm": ("loss", "itm_loss", "itm_acc", "wra_loss", "ot_dist", "ot_pos", "ot_neg"),
}
STEP_SERIES = ("loss", "lr", "tokens_per_s")  # train/<name>: the step's loss, learning rate, throughput
# fine-tuning: each task's training streams (pipeline/finetune/tasks: ``streams``) and what a
# stream's batches log (model/tasks/ heads, via FinetuneModule: "loss" plus the head's metrics)
FINETUNE_SERIES = {
    "vqa": {"vqa": ("loss", "vqa_score")},
    "vcr": {"qa": ("loss", "accuracy"), "qar": ("loss", "accuracy")},
    "nlvr2": {"nlvr2": ("loss", "accuracy")},
    "snli_ve": {"snli_ve": ("loss", "accuracy")},
    "retrieval_flickr": {"t2i": ("loss", "accuracy"), "i2t": ("loss", "accuracy")},
    "refcoco_plus": {"refcoco_plus": ("loss", "accuracy")},
}
PRETRAIN_RUNS = {"pretrain": ("${pretrain.out_name}", tuple(PRETRAIN_SERIES)),
                 "pretrain_vcr": ("${pretrain.out_name}_vcr", ("mlm", "mrfr", "mrc", "mrc_kl"))}
X_LABEL = "optimizer step"


ABLATION_RUNS = {"pretrain_masking": ("${pretrain.out_name}_masking_ablation", tuple(PRETRAIN_SERIES))}


def _tsv(run: str, split: str, metric: str, root: str = "") -> str:
    return f"{root}data/metrics/{run}/plots/metrics/{split}/{metric}.tsv"


def _plot(name: str, title: str, metric: str, files: list[str]) -> dict[str, Any]:
    field = metric.rsplit("/", 1)[-1]  # dvclive's TSV column: the series' last name
    return {name: {"x": "step", "y": {f: field for f in files}, "title": title, "x_label": X_LABEL,
                   "y_label": y_label(metric)}}


def _pretraining(runs: dict[str, tuple[str, tuple[str, ...]]], root: str = "") -> list[dict[str, Any]]:
    out = []
    for stage, (run, tasks) in runs.items():
        for name in STEP_SERIES:
            out.append(_plot(f"{stage}: {name}", f"{stage}: {name} (train)", name, [_tsv(run, "train", name, root)]))
        for task in tasks:
            for name in PRETRAIN_SERIES[task]:
                metric = f"{task}/{name}"
                out.append(_plot(f"{stage}: {metric}", f"{stage}: {metric} (train, val)", metric,
                                 [_tsv(run, split, metric, root) for split in ("train", "val")]))
    return out


def ablation_plots() -> list[dict[str, Any]]:
    """The ``plots:`` list of ablations/dvc.yaml (paths relative to its folder)."""
    return _pretraining(ABLATION_RUNS, root="../")


def plots() -> list[dict[str, Any]]:
    """The ``plots:`` list of dvc.yaml, pretraining's stages first, then each task in TASKS order."""
    out = _pretraining(PRETRAIN_RUNS)
    for task in TASKS:
        runs = [f"{task}/{start}" for start in STARTS]
        for name in STEP_SERIES:
            out.append(_plot(f"{task}: {name}", f"{task}: {name} (train; pretrained vs scratch)", name,
                             [_tsv(run, "train", name) for run in runs]))
        for stream, names in FINETUNE_SERIES[task].items():
            for name in names:
                metric = f"{stream}/{name}"
                out.append(_plot(f"{task}: {metric}", f"{task}: {metric} (train, val; pretrained vs scratch)",
                                 metric, [_tsv(run, split, metric) for run in runs for split in ("train", "val")]))
    return out


def main(argv: list[str] | None = None) -> int:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    block = ablation_plots() if argv == ["--ablations"] else plots()
    print(yaml.safe_dump({"plots": block}, sort_keys=False, width=200), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
