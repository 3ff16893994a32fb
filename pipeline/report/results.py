"""Stage ``results``: the results table of every fine-tuned task and their Meta-Sum.

Reads ``data/metrics/<task>.json`` (written by ``finetune@<task>``) for every task of
``finetune.tasks`` and, when it exists, the pretraining report ``data/models/<out_name>/eval.json``;
writes ``data/reports/results.json`` (a DVC metrics file, so ``dvc exp show`` lists it per
experiment) and ``data/reports/results.md``:

1. one row per summary metric (one per task; retrieval has two, image and text R@1, as in the
   paper), on the task's test split: the score of the pretrained start, of the non-pretrained start
   with the same budget, the gain with its paired 95% interval and how it reads (``reading``: a
   gain where the interval lies above 0, a loss where it lies below, unresolved where it holds 0;
   an observation, never a pass/fail: docs/rig.md), the chance level and, for retrieval,
   zero-shot. Choices are made
   on the dev splits, whose scores stay in ``data/metrics/<task>.json``; a task whose test labels
   are not here (VQA and VCR on real data: evaluation server) reports dev, and the row says so;
2. the Meta-Sum: the sum of those scores (UNITER's Table 2 sums VQA, IR, TR, NLVR2 and RefCOCO+;
   ours adds VCR and SNLI-VE, so compare Meta-Sums of this pipeline with each other only);
3. reference levels: model-free scores a task defines beside its main metric (RefCOCO+: the class
   oracle), with both starts' scores next to them;
4. the trained detector's held-out quality against its targets (``data/models/detector/metrics.json``,
   when ``train_detector`` made the detector): every region feature, so every score, comes from it;
5. the pretraining run's setting (masking, tasks) and held-out accuracies before and after it.

The masking ablation is reported apart, by ``pipeline.report.ablations`` (``ablations/dvc.yaml``).

``python -m pipeline report results [--exps]`` shows the same table, or several experiments side
by side (``pipeline.report.results_cli``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Mapping

from pipeline.common.runinfo import RunRecord, atomic_write_bytes, atomic_write_json
from pipeline.common.detector_files import METRICS_FILE, detector_dir
from pipeline.params.finetune import TASK_SPLITS
from pipeline.params.parser import Params

log = logging.getLogger(__name__)

RESULTS_JSON, RESULTS_MD = "results.json", "results.md"
COLUMNS = ("pretrained", "scratch", "gain", "zero_shot", "chance")
# How a fine-tuning gain reads, from its paired 95% interval: an observation of this run, not a
# verdict (the mini world is a test rig, docs/rig.md; the demo's verdicts are pipeline/report/checks.py)
READINGS = {"gain": "gain", "loss": "loss", "unresolved": "unresolved: interval holds 0", "unknown": "–"}
# What the mini world can and cannot show, said once in results.md (and in README.md)
RIG_SCOPE = ("The mini world is a test rig: it shows that the pipeline's parts are wired right (pretraining "
             "uses the image, every task beats chance, decontamination is exact, fine-tuning starts from the "
             "exported model; `python -m pipeline report checks`), not whether pretraining helps: its gains "
             "below are observations of one generated world, one machine and one draw (docs/rig.md).")
DEV_MARK = " (dev: no test labels)"  # a row scored on dev because the task's test labels are not here
# the non-pretrained start scored no better than chance: its fine-tuning did not take off, so the gain
# measures that failure as much as pretraining (docs/decisions.md#scratch-at-chance)
SCRATCH_AT_CHANCE_MARK = " (scratch at chance)"
# a dev row of a task in decontaminate.keep_dev_in_pretraining: its dev images were pretrained on
SEEN_MARK = " (dev images in pretraining)"
# held-out pretraining metrics shown in the ablation section: (task, metric, label)
PRETRAIN_METRICS = (("mlm", "mlm_acc", "MLM acc"), ("mrc_kl", "mrc_acc", "MRC-kl acc"), ("itm", "itm_acc", "ITM acc"),
                    ("mrfr", "loss", "MRFR loss"))


def load_task_metrics(metrics_dir: Path, tasks: list[str]) -> dict[str, dict[str, Any]]:
    """{task: data/metrics/<task>.json}; a missing file names the stage that writes it."""
    out = {}
    for task in tasks:
        path = metrics_dir / f"{task}.json"
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: run `python -m pipeline finetune {task}` first")
        out[task] = json.loads(path.read_text())
    return out


def summarize(records: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Rows (one per summary metric, in task order) and the Meta-Sum of each column that every row has."""
    rows = []
    for task, record in records.items():
        for key, entry in record["summary"].items():
            row = {"task": task, "metric": key, "label": entry["label"], "steps": record.get("steps"),
                   "scratch_steps": record.get("scratch_steps"),  # the scratch start's own budget, if it has one
                   "split": split_kind(task, key), **{c: entry.get(c) for c in COLUMNS}}
            row["gain_interval"] = entry.get("gain_interval")  # pipeline.training.paired.paired_gain
            row["scratch_at_chance"] = (row["scratch"] is not None and row["chance"] is not None
                                        and row["scratch"] <= row["chance"])
            row["reading"] = reading(row)
            rows.append(row)
    meta_sum: dict[str, Any] = {"terms": len(rows)}
    for column in ("pretrained", "scratch", "chance"):
        values = [r[column] for r in rows]
        meta_sum[column] = round(sum(values), 4) if rows and all(v is not None for v in values) else None
    if meta_sum["pretrained"] is not None and meta_sum["scratch"] is not None:
        meta_sum["gain"] = round(meta_sum["pretrained"] - meta_sum["scratch"], 4)
        meta_sum["gain_interval"] = meta_sum_interval(rows, meta_sum["gain"])
        meta_sum["reading"] = reading({**meta_sum, "gain_interval": meta_sum["gain_interval"]})
    return {"rows": rows, "meta_sum": meta_sum, "references": reference_rows(records, rows)}


def meta_sum_interval(rows: list[dict[str, Any]], gain: float, z: float = 1.959964) -> dict[str, Any] | None:
    """A normal 95% interval of the Meta-Sum's gain from the rows' bootstrap standard errors: tasks are
    scored on separate test splits, so their variances add; the rows of one task (retrieval's IR and
    TR rank one gallery) may be correlated, so their errors add as if fully so (wider, never narrower).
    None unless every row has an interval."""
    if not rows or any("se" not in (r.get("gain_interval") or {}) for r in rows):
        return None
    per_task: dict[str, float] = {}
    for r in rows:
        per_task[r["task"]] = per_task.get(r["task"], 0.0) + float(r["gain_interval"]["se"])
    se = sum(v * v for v in per_task.values()) ** 0.5
    return {"gain": round(gain, 2), "low": round(gain - z * se, 2), "high": round(gain + z * se, 2),
            "se": round(se, 2), "level": 0.95, "method": "normal, from the rows' bootstrap SEs"}


def reading(row: Mapping[str, Any]) -> str:
    """How a row's gain reads (a key of ``READINGS``): ``"gain"`` when its interval lies above 0,
    ``"loss"`` when it lies below 0, ``"unresolved"`` when it holds 0, ``"unknown"`` without a scratch
    score or an interval. An observation: nothing is asserted, so no row needs an exemption."""
    interval = row.get("gain_interval")
    if row["scratch"] is None or row["pretrained"] is None or not interval:
        return "unknown"
    if interval["low"] > 0:
        return "gain"
    return "loss" if interval["high"] < 0 else "unresolved"


def split_kind(task: str, metric: str) -> str:
    """``"test"`` or ``"dev"``: which of the task's splits (``TASK_SPLITS``) a ``"split/metric"`` key scores."""
    dev = TASK_SPLITS[task].dev if task in TASK_SPLITS else ()
    return "dev" if metric.partition("/")[0] in dev else "test"


def reference_rows(records: Mapping[str, Mapping[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (summary row, task reference level that scores its metric), beside both starts."""
    out = []
    for r in rows:
        for name, ref in (records[r["task"]].get("references") or {}).items():
            if r["metric"] in ref:
                out.append({"task": r["task"], "metric": r["metric"], "reference": name, "label": ref.get("label"),
                            "value": ref[r["metric"]], "pretrained": r["pretrained"], "scratch": r["scratch"]})
    return out


def pretraining_report(path: Path) -> dict[str, Any] | None:
    """The pretraining setting and its held-out metrics before/after (None when ``path`` is absent)."""
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    held_out = {}
    for task, metric, label in PRETRAIN_METRICS:
        before = report.get("no_pretraining", {}).get(task, {}).get(metric)
        after = report.get("pretrained", {}).get(task, {}).get(metric)
        if before is not None or after is not None:
            held_out[label] = {"before": before, "after": after}
    setting = {k: report.get(k) for k in ("steps", "masking", "wra", "datasets", "mix_ratio", "first_phase")}
    return {"setting": setting, "held_out": held_out}


def detector_report(path: Path) -> dict[str, Any] | None:
    """``train_detector``'s held-out quality and targets from its ``metrics.json`` (None when
    ``path`` is absent: a detector from a weights file, e.g. BUTD's on real data, was not trained here)."""
    if not path.exists():
        return None
    metrics = json.loads(path.read_text())
    quality = metrics["quality"]
    return {"images": quality["images"], "objects": quality["objects"], "recall": quality["recall"],
            "shape_acc": quality["shape_acc"], "targets": metrics["targets"], "targets_met": metrics["targets_met"]}


def _detector_lines(det: Mapping[str, Any]) -> list[str]:
    targets = det["targets"]
    verdict = ("met" if det["targets_met"] else
               "**below target**: every region feature, so every score above, comes from this detector")
    return ["", "## Region features", "",
            f"The detector trained by `train_detector` scores, on its {det['images']} held-out images "
            f"({det['objects']} objects), recall {det['recall']:.3f} at IoU 0.5 and shape accuracy "
            f"{det['shape_acc']:.3f} (targets {targets['recall']} and {targets['shape_acc']}: {verdict})."]


def _tasks(mix: Mapping[str, float] | None) -> str:
    """``{"mlm": 2.0, "mrc": 0.0, "itm": 1.0}`` -> ``"itm 1, mlm 2"`` (tasks that are on, by name)."""
    return ", ".join(f"{k} {v:g}" for k, v in sorted((mix or {}).items()) if v)


def _first_phase(first: Mapping[str, Any] | None) -> str:
    if not first:
        return ""
    dropout = f", dropout {first['dropout']:g}" if first.get("dropout") is not None else ""
    return f" (steps 1-{first['steps']}: {_tasks(first['mix_ratio'])}{dropout})"


def _interval(interval: Mapping[str, Any] | None) -> str:
    """``[low, high] (items / groups)`` of a ``paired_gain`` record, "–" without one."""
    if not interval:
        return "–"
    return f"[{interval['low']:+.2f}, {interval['high']:+.2f}] ({interval['items']} / {interval['groups']})"


def _meta_interval(interval: Mapping[str, Any] | None) -> str:
    return f"[{interval['low']:+.2f}, {interval['high']:+.2f}] (normal, from the rows' SEs)" if interval else "–"


def _fmt(value: Any, signed: bool = False) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:+.2f}" if signed else f"{value:.2f}"
    return str(value)


def render_markdown(results: Mapping[str, Any]) -> str:
    """results.md: the task table with its Meta-Sum row, then the pretraining section."""
    lines = ["# Results", "",
             "Scores in percent on each task's test split (the metric key names it). Choices (budgets, learning "
             "rates) were made on the dev splits, whose scores are in `data/metrics/<task>.json`; a test split is "
             "only reported. *pretrained*: fine-tuned from the "
             "pretrained model; *scratch*: the same fine-tuning (data order and head initialization; the same "
             "steps, or its own budget chosen on dev where *steps* shows two: pretrained / scratch) "
             "from a non-pretrained start; *zero-shot*: the pretrained model before any fine-tuning; *chance*: "
             "a trivial predictor (majority answer, uniform choice or random ranking).", "", RIG_SCOPE, "",
             "| task | metric | steps | pretrained | scratch | gain | 95% interval (items / groups) | reads as "
             "| zero-shot | chance |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in results["rows"]:
        mark = SCRATCH_AT_CHANCE_MARK if r.get("scratch_at_chance") else ""
        mark += DEV_MARK if r.get("split") == "dev" else ""
        mark += SEEN_MARK if r.get("split") == "dev" and r["task"] in results.get("dev_in_pretraining", ()) else ""
        steps = _fmt(r["steps"]) + (f" / {r['scratch_steps']}" if r.get("scratch_steps") else "")
        lines.append(f"| {r['task']} | {r['label']} (`{r['metric']}`){mark} | {steps} "
                     f"| {_fmt(r['pretrained'])} | {_fmt(r['scratch'])} | {_fmt(r['gain'], True)} "
                     f"| {_interval(r.get('gain_interval'))} | {READINGS[r['reading']]} | {_fmt(r['zero_shot'])} "
                     f"| {_fmt(r['chance'])} |")
    m = results["meta_sum"]
    meta_interval = m.get("gain_interval")
    lines.append(f"| **Meta-Sum** | sum of the {m['terms']} scores above | | **{_fmt(m['pretrained'])}** "
                 f"| {_fmt(m['scratch'])} | {_fmt(m.get('gain'), True)} "
                 f"| {_meta_interval(meta_interval)} | {READINGS[m.get('reading', 'unknown')]} "
                 f"| | {_fmt(m['chance'])} |")
    lines += ["", "The Meta-Sum adds every row (retrieval contributes image and text R@1, as in UNITER's Table 2, "
              "which sums VQA, IR, TR, NLVR2 and RefCOCO+; VCR and SNLI-VE are added here), so it compares runs "
              "of this pipeline with each other, not with the paper's numbers."]
    intervals = [r["gain_interval"] for r in results["rows"] if r.get("gain_interval")]
    if intervals:
        level = f"{100 * intervals[0]['level']:g}%"
        lines += ["", f"*{level} interval*: of the gain, from both starts' scores of the same test items "
                  f"(`data/models/<task>/item_scores.json`) by a paired bootstrap ({intervals[0]['resamples']:,} "
                  "resamples, seeded) that resamples *groups*, the images an item is about (an NLVR2 pair is one "
                  "group), because the items of one image are not independent. An interval that holds 0 means "
                  "the split does not resolve the gain; its half-width is the smallest difference the split can "
                  "tell from noise. *Reads as*: a gain where the interval lies above 0, a loss where it lies "
                  "below 0; an observation of this run (one pretrained model, one fine-tuning seed), not a verdict. "
                  "`python -m pipeline report matrix` shows how it moves over pretraining seeds, precisions and "
                  "threads."]
    dev_tasks = sorted({r["task"] for r in results["rows"] if r.get("split") == "dev"})
    if dev_tasks:
        lines += ["", f"*{DEV_MARK.strip(' ()')}*: {', '.join(dev_tasks)} scored on the dev split, the split "
                  "choices are made on, because the test labels are not here (real VQA and VCR test labels are held "
                  "by an evaluation server; the mini world writes stand-ins, `sources.vqa.annotations_test` and "
                  "`sources.vcr.test_labels`)." + (" VQA's test predictions, for the server, are in "
                  "`data/models/vqa/vqa_predictions_test.json`." if "vqa" in dev_tasks else "")
                  + " Read these rows as optimistic, and do not compare them with test rows."]
    seen = sorted({r["task"] for r in results["rows"]
                   if r.get("split") == "dev" and r["task"] in results.get("dev_in_pretraining", ())})
    if seen:
        lines += ["", f"*{SEEN_MARK.strip(' ()')}*: {', '.join(seen)} scored on a dev split whose images stayed in "
                  "the pretraining data (`decontaminate.keep_dev_in_pretraining`, UNITER's data for VQA): the "
                  "pretrained start has seen these images with their captions, so its score and gain there are "
                  "inflated by an amount this table cannot tell."]
    if any(r.get("scratch_at_chance") for r in results["rows"]):
        lines += ["", f"*{SCRATCH_AT_CHANCE_MARK.strip(' ()').capitalize()}*: the non-pretrained start scored no "
                  "better than chance, so its fine-tuning did not take off within the row's steps; the gain says "
                  "that the pretrained start learned the task, not by how much pretraining helps. `make seeds "
                  "TASK=<task>` shows whether that start takes off in other draws."]
    refs = results.get("references")
    if refs:
        lines += ["", "## Reference levels", "",
                  "Model-free scores on the same examples, beside both starts: what a shortcut alone scores "
                  "(RefCOCO+: naming the target's detector class). Where one is near 100, the task asks for little "
                  "beyond the shortcut and neither start has room to show a gain.", "",
                  "| task | metric | reference | score | pretrained | scratch |", "|---|---|---|---:|---:|---:|"]
        for r in refs:
            lines.append(f"| {r['task']} | `{r['metric']}` | {r['label'] or r['reference']} | {_fmt(r['value'])} "
                         f"| {_fmt(r['pretrained'])} | {_fmt(r['scratch'])} |")
    if results.get("detector"):
        lines += _detector_lines(results["detector"])
    pre = results.get("pretraining")
    if pre:
        s = pre["setting"]
        mix = _tasks(s.get("mix_ratio"))
        lines += ["", "## Pretraining", "",
                  f"{_fmt(s.get('steps'))} steps, {s.get('masking')} masking, WRA {'on' if s.get('wra') else 'off'}, "
                  f"datasets {s.get('datasets')}, tasks: {mix or '–'}{_first_phase(s.get('first_phase'))}.", "",
                  "| held-out metric | before pretraining | after |", "|---|---:|---:|"]
        for label, v in pre["held_out"].items():
            lines.append(f"| {label} | {_fmt(v['before'])} | {_fmt(v['after'])} |")
    if pre:
        lines += ["", "The masking ablation (the first stage again with the other masking) is a pipeline of its own, "
                  "outside the default graph: `dvc repro ablations/dvc.yaml` writes `data/reports/ablations.md`. "
                  "Other ablations (task subsets, WRA, in- vs out-of-domain data) are separate DVC experiments "
                  "(`dvc exp run -S pretrain.wra=false`); `python -m pipeline report results --exps` puts them "
                  "side by side."]
    return "\n".join(lines) + "\n"


def run(params: Params) -> dict[str, Any]:
    """Write ``data/reports/results.{json,md}``; returns the results dict."""
    data = Path(params.paths.data)
    tasks = list(params.finetune.tasks)
    records = load_task_metrics(data / "metrics", tasks)
    models, name = data / "models", params.pretrain.out_name
    detector_metrics = detector_dir(data) / METRICS_FILE
    results = {"tasks": tasks, **summarize(records),
               "dev_in_pretraining": sorted(set(params.decontaminate.keep_dev_in_pretraining) & set(tasks)),
               "detector": detector_report(detector_metrics),
               "pretraining": pretraining_report(models / name / "eval.json")}
    out = data / "reports"
    atomic_write_json(out / RESULTS_JSON, results)
    atomic_write_bytes(out / RESULTS_MD, render_markdown(results).encode("utf-8"))
    record = RunRecord("results", params.section_digest("finetune", "decontaminate"))
    for task in tasks:
        record.inputs[task] = data / "metrics" / f"{task}.json"
    if results["detector"] is not None:
        record.inputs["detector"] = detector_metrics
    record.counts = {"tasks": len(tasks), "rows": len(results["rows"])}
    record.write(out, name="_run.results.json")
    m = results["meta_sum"]
    log.info("results: %d rows, Meta-Sum %s (scratch %s) -> %s", len(results["rows"]), _fmt(m["pretrained"]),
             _fmt(m["scratch"]), out / RESULTS_MD)
    return results
