"""Stage ``ablations``: the masking ablation's table, from a pipeline outside the default graph.

The default ``dvc repro`` trains the first pretraining stage once. ``dvc repro ablations/dvc.yaml``
trains it a second time with the other masking (stage ``pretrain_masking``: same seed, data order
and held-out batches) and then runs this stage, which reads both held-out reports,
``data/models/<out_name>/eval.json`` and ``data/models/<out_name>_masking_ablation/eval.json``,
and writes ``data/reports/ablations.json`` (a DVC metrics file) and ``data/reports/ablations.md``:
per held-out pretraining metric (MLM, MRC-kl and ITM accuracy, MRFR loss) its value under each
masking.

It lives apart so that the demo's twenty minutes are not spent on a second pretraining run that no
fine-tuning task reads (docs/decisions.md#ablations-outside-graph).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pipeline.common.runinfo import RunRecord, atomic_write_bytes, atomic_write_json
from pipeline.params.parser import Params
from pipeline.params.pretrain import output_name
from pipeline.report.results import PRETRAIN_METRICS, _fmt

log = logging.getLogger(__name__)

ABLATIONS_JSON, ABLATIONS_MD = "ablations.json", "ablations.md"
# held-out tasks whose accuracy is over examples eval.json counts (ITM: one pair, one prediction); MLM and
# MRC-kl score masked tokens and regions, which it does not count, so their differences get no interval
UNIT_IS_EXAMPLE = ("itm",)


def masking_ablation(main: Path, ablation: Path) -> dict[str, Any]:
    """``{"steps", "maskings": [2 names], "metrics": {label: {masking: value}}}`` of the first stage
    (``main``: its eval.json) and its other-masking twin (``ablation``).

    Raises FileNotFoundError naming the stage to run when a report is missing, and ValueError when
    the two runs are not comparable (same masking, or other held-out batches or steps).
    """
    for path, stage in ((main, "pretrain"), (ablation, "pretrain_masking")):
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: run `python -m pipeline {stage}` first "
                                    "(or `dvc repro ablations/dvc.yaml`)")
    reports = [json.loads(main.read_text()), json.loads(ablation.read_text())]
    maskings = [r.get("masking") for r in reports]
    if maskings[0] == maskings[1]:
        raise ValueError(f"{main} and {ablation}: both trained with {maskings[0]} masking; "
                         "rerun `dvc repro ablations/dvc.yaml`")
    if reports[0].get("held_out") != reports[1].get("held_out") or reports[0].get("steps") != reports[1].get("steps"):
        raise ValueError(f"{ablation}: held-out batches or steps differ from {main}; "
                         "rerun `dvc repro ablations/dvc.yaml`")
    metrics = {label: {m: r.get("pretrained", {}).get(task, {}).get(metric) for m, r in zip(maskings, reports)}
               for task, metric, label in PRETRAIN_METRICS}
    held_out = reports[0].get("held_out") or {}
    differences = {label: difference(metrics[label], held_out.get(task, {}).get("examples") if task in UNIT_IS_EXAMPLE
                                     else None) for task, _, label in PRETRAIN_METRICS}
    return {"steps": reports[0].get("steps"), "maskings": sorted(maskings), "metrics": metrics,
            "differences": differences}


def difference(by_masking: dict[str, float | None], n: int | None, z: float = 1.959964) -> dict[str, Any] | None:
    """``joint - conditional`` of one held-out metric, an observation, with a 95% interval where the metric
    is an accuracy over ``n`` held-out units: a normal interval for two proportions, as if the two runs
    had scored separate units (they score the same ones, so this is wider than a paired interval, never
    narrower). None when a value is missing."""
    a, b = by_masking.get("conditional"), by_masking.get("joint")
    if a is None or b is None:
        return None
    out: dict[str, Any] = {"diff": round(b - a, 4), "low": None, "high": None, "units": n}
    if n:
        se = (a * (1 - a) / n + b * (1 - b) / n) ** 0.5
        out.update(low=round(b - a - z * se, 4), high=round(b - a + z * se, 4))
    return out


def _reads(d: dict[str, Any] | None) -> str:
    if not d or d["low"] is None:
        return "– (no interval: the held-out units are not counted)"
    if d["low"] > 0:
        return "joint higher"
    return "joint lower" if d["high"] < 0 else "unresolved: interval holds 0"


def render_markdown(ablation: dict[str, Any]) -> str:
    """ablations.md: the masking table and how it was measured."""
    names = ablation["maskings"]
    lines = ["# Ablations", "", "## Masking", "",
             f"The first pretraining stage trained twice, {_fmt(ablation['steps'])} steps each, with the same seed, "
             "data order and held-out batches; only how training batches are masked differs (*conditional*: one "
             "modality per batch, as UNITER; *joint*: words and regions masked together). Whatever it shows is "
             "reported: neither the world nor the seeds were tuned for either.", "",
             "| held-out metric | " + " | ".join(names) + " | joint − conditional | 95% interval | reads as |",
             "|---|" + "---:|" * len(names) + "---:|---|---|"]
    for label, by_masking in ablation["metrics"].items():
        d = (ablation.get("differences") or {}).get(label)
        interval = f"[{d['low']:+.4f}, {d['high']:+.4f}] ({d['units']} pairs)" if d and d["low"] is not None else "–"
        lines.append(f"| {label} | " + " | ".join(_fmt(by_masking.get(n)) for n in names)
                     + f" | {_fmt(d['diff'], True) if d else '–'} | {interval} | {_reads(d)} |")
    lines += ["", "An observation of one pretraining seed on one machine, not a verdict (docs/rig.md); "
              "`python -m pipeline report matrix --ablation` shows its spread over seeds, precisions and threads."]
    return "\n".join(lines) + "\n"


def run(params: Params) -> dict[str, Any]:
    """Write ``data/reports/ablations.{json,md}``; returns ``{"masking": ...}``."""
    data, name = Path(params.paths.data), params.pretrain.out_name
    main = data / "models" / output_name("pretrain", name) / "eval.json"
    twin = data / "models" / output_name("pretrain_masking", name) / "eval.json"
    results = {"masking": masking_ablation(main, twin)}
    out = data / "reports"
    atomic_write_json(out / ABLATIONS_JSON, results)
    atomic_write_bytes(out / ABLATIONS_MD, render_markdown(results["masking"]).encode("utf-8"))
    record = RunRecord("ablations", params.section_digest("pretrain"))
    record.inputs.update({"pretrain": main, "pretrain_masking": twin})
    record.counts = {"metrics": len(results["masking"]["metrics"])}
    record.write(out, name="_run.ablations.json")
    log.info("ablations: masking %s -> %s", " vs ".join(results["masking"]["maskings"]), out / ABLATIONS_MD)
    return results
