"""The demo's verdicts: every pass/fail the mini world prints, with its margin, in one module.

The mini world is a test rig (docs/rig.md): it shows that the pipeline's parts are wired right,
not that UNITER's findings hold. So the verdicts are limited to what the rig is built to show, and
a margin changes only by the rule of docs/rig.md (written and committed before its runs, decided on
dev splits or pretraining held-out metrics, never on a test-split result); either change bumps
``CHECKS_VERSION``. Gains of the pretrained start are observations (results.md), not verdicts.

Each check reads the outputs of one data directory (``data/`` or a side root) and returns
:class:`Verdict` rows: ``value`` against ``margin``, ``passed`` True/False, or None where the check
does not apply (a real-data run has no planted overlaps; without a second run there is no rerun to
compare); a missing output every run writes (eval.json, results.json) fails its checks.
``python -m pipeline report checks`` prints them and exits 1 when any fails; the demo tests
(tests/e2e/test_dvc_repro.py) and the matrix (``report matrix``) call :func:`evaluate`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from pipeline.params.world import MINI_WORLD_VERSION

CHECKS_VERSION = 1
MLM_MARGIN = 0.03  # held-out MLM accuracy: with the image over the same model without it, and over no pretraining
ITM_MARGIN = 0.05  # held-out ITM accuracy over the majority-class rate of those pairs
CHANCE_MARGIN = 5.0  # a task's test score from the pretrained start over chance, in points

PRETRAIN_STAGES = ("pretrain", "pretrain_vcr")  # the stages whose exports fine-tuning may start from
MODEL_FILE = "model.safetensors"
PLANTED_FILE = Path("raw") / "mini" / "planted.json"  # the generator's ground truth, below the data dir
# what two runs of a stage may differ in: run records (wall times) and the measured throughput series
WALL_CLOCK = "tokens_per_s"
RERUN_SKIP = ("checkpoints", "cache")  # working folders (checkpoints, stage locks, scratch), not outputs
# the stage whose outputs each check reads (``evaluate(..., ran=...)``: a check whose stage did not run reads n/a)
CHECK_STAGE = {"mlm_uses_image": "pretrain", "itm_beats_majority": "pretrain", "task_beats_chance": "results",
               "decontamination": "decontaminate", "start_is_the_export": "finetune"}


@dataclass(frozen=True)
class Verdict:
    """One check on one subject: ``value`` must reach ``margin`` (``passed`` None: not applicable)."""

    check: str
    subject: str
    value: float | int | str | None
    margin: str
    passed: bool | None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _read(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def _na(check: str, subject: str, margin: str, why: str) -> list[Verdict]:
    return [Verdict(check, subject, None, margin, None, why)]


def _missing(check: str, subject: str, margin: str, what: str) -> list[Verdict]:
    """An output every run writes is missing: the check fails (the graph did not run, or not to the end)."""
    return [Verdict(check, subject, None, margin, False, f"missing {what}: run `dvc repro` first")]


# ---------------------------------------------------------------------------------------------
# pretraining: held-out metrics of data/models/<out_name>/eval.json


def mlm_uses_image(report: Mapping[str, Any] | None) -> list[Verdict]:
    """Held-out MLM accuracy with the image >= the same model without it + MLM_MARGIN, and >= the
    model before pretraining + MLM_MARGIN."""
    margin = f">= +{MLM_MARGIN:g}"
    if report is None:
        return _missing("mlm_uses_image", "pretraining", margin, "eval.json")
    with_image = report["pretrained"]["mlm"]["mlm_acc"]
    out = []
    for other, subject in (("pretrained_text_only", "MLM acc, with vs without the image"),
                           ("no_pretraining", "MLM acc, after vs before pretraining")):
        base = report[other]["mlm"]["mlm_acc"]
        diff = with_image - base
        out.append(Verdict("mlm_uses_image", subject, round(diff, 4), margin, diff >= MLM_MARGIN - 1e-12,
                           f"{with_image:.4f} vs {base:.4f}"))
    return out


def itm_beats_majority(report: Mapping[str, Any] | None) -> list[Verdict]:
    """Held-out ITM accuracy >= the majority-class rate of the held-out pairs + ITM_MARGIN."""
    margin = f">= +{ITM_MARGIN:g}"
    if report is None:
        return _missing("itm_beats_majority", "pretraining", margin, "eval.json")
    held = report["held_out"]["itm"]
    majority = max(held["matched"], held["examples"] - held["matched"]) / held["examples"]
    acc = report["pretrained"]["itm"]["itm_acc"]
    diff = acc - majority
    return [Verdict("itm_beats_majority", "ITM acc over the majority rate", round(diff, 4), margin,
                    diff >= ITM_MARGIN - 1e-12, f"{acc:.4f} vs {majority:.4f} ({held['examples']} pairs)")]


# ---------------------------------------------------------------------------------------------
# fine-tuning: data/reports/results.json and each task's model directory


def tasks_beat_chance(results: Mapping[str, Any] | None) -> list[Verdict]:
    """Every results row: the pretrained start's score >= chance + CHANCE_MARGIN points."""
    margin = f">= +{CHANCE_MARGIN:g} points"
    if results is None:
        return _missing("task_beats_chance", "fine-tuning", margin, "reports/results.json")
    out = []
    for r in results["rows"]:
        if r.get("pretrained") is None or r.get("chance") is None:
            out.append(Verdict("task_beats_chance", f"{r['task']} {r['metric']}", None, margin, False,
                               "no pretrained score or chance level"))
            continue
        diff = r["pretrained"] - r["chance"]
        out.append(Verdict("task_beats_chance", f"{r['task']} {r['metric']}", round(diff, 2), margin,
                           diff >= CHANCE_MARGIN - 1e-9, f"{r['pretrained']:.2f} vs chance {r['chance']:.2f}"))
    return out


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def start_is_the_export(data: Path, tasks: list[str]) -> list[Verdict]:
    """Each task's pretrained start is a pretraining stage's export in this data directory, byte for
    byte: the weights file that ``finetune@<task>`` recorded as its start (``_run.json``
    ``input_digests.init``, the sha256 of ``model.safetensors``) is the one the export holds now."""
    margin = "same sha256"
    if not tasks:
        return _missing("start_is_the_export", "fine-tuning", margin, "reports/results.json's tasks")
    out = []
    for task in tasks:
        model_dir = data / "models" / task
        run, config = _read(model_dir / "_run.json"), _read(model_dir / "model_config.json")
        if run is None or config is None:
            out.append(Verdict("start_is_the_export", task, None, margin, False, f"no {model_dir}/_run.json"))
            continue
        export = data / "models" / Path(config["init"]).name
        export_run = _read(export / "_run.json") or {}
        recorded = run["input_digests"].get("init")
        if export_run.get("stage") not in PRETRAIN_STAGES or not (export / MODEL_FILE).exists():
            out.append(Verdict("start_is_the_export", task, None, margin, False,
                               f"{export} is not a pretraining export"))
            continue
        now = file_sha256(export / MODEL_FILE)
        out.append(Verdict("start_is_the_export", f"{task} from {export.name}", now[:12] if recorded == now else
                           f"{(recorded or 'none')[:12]} != {now[:12]}", margin, recorded == now,
                           f"{export_run['stage']} export"))
    return out


# ---------------------------------------------------------------------------------------------
# decontamination: the planted overlaps and controls of the mini world


def decontamination_exact(data: Path) -> list[Verdict]:
    """Every overlap the generator planted is removed with its planted reason, and no control is removed
    (``raw/mini/planted.json`` against ``reports/cleaning/<dataset>.json``)."""
    planted = _read(data / PLANTED_FILE)
    if planted is None:
        return _na("decontamination", "planted overlaps", "all removed, no control", f"no {data / PLANTED_FILE}")
    removed: dict[tuple[str, str], str] = {}
    for dataset in sorted({o["dataset"] for o in planted["overlaps"]} | {c["dataset"] for c in planted["controls"]}):
        report = _read(data / "reports" / "cleaning" / f"{dataset}.json") or {"removed": []}
        removed.update({(dataset, str(e["image_id"])): e["reason"] for e in report["removed"]})
    missed = [o for o in planted["overlaps"] if removed.get((o["dataset"], str(o["image_id"]))) != o["reason"]]
    hit_controls = [c for c in planted["controls"] if (c["dataset"], str(c["image_id"])) in removed]
    n = len(planted["overlaps"])
    return [
        Verdict("decontamination", "planted overlaps removed", f"{n - len(missed)}/{n}", "all", not missed,
                ", ".join(f"{o['dataset']}/{o['image_id']}" for o in missed[:5])),
        Verdict("decontamination", "controls removed", len(hit_controls), "0", not hit_controls,
                ", ".join(f"{c['dataset']}/{c['image_id']}" for c in hit_controls[:5])),
    ]


# ---------------------------------------------------------------------------------------------
# a rerun on the same machine


def _without_wall_clock(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_wall_clock(v) for k, v in node.items() if k != WALL_CLOCK}
    return node


def content_digest(path: Path) -> str:
    """sha256 over (relative path, bytes) of every file below ``path``, skipping ``_run*`` files
    (wall times) and the wall-clock throughput series; a single file is hashed as it is."""
    if path.is_file():
        return file_sha256(path)
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file()):
        if p.name.startswith("_run") or WALL_CLOCK in p.name:
            continue
        data = p.read_bytes()
        if p.name == "metrics.json" and (p.parent / "plots").is_dir():  # a dvclive summary
            data = json.dumps(_without_wall_clock(json.loads(data)), sort_keys=True).encode()
        h.update(str(p.relative_to(path)).encode() + b"\0" + hashlib.sha256(data).hexdigest().encode())
    return h.hexdigest()


def output_digests(data: Path) -> dict[str, str]:
    """{second-level entry (``models/pretrain``, ``reports/results.json``, ...): content digest} of a
    data directory, working directories left out."""
    out = {}
    for top in sorted(p for p in data.iterdir() if p.name not in RERUN_SKIP and not p.name.startswith(".")):
        for entry in sorted(top.iterdir()) if top.is_dir() else [top]:
            if not entry.name.startswith((".", "_run")):
                out[str(entry.relative_to(data))] = content_digest(entry)
    return out


def rerun_identical(data: Path, rerun: Path | None) -> list[Verdict]:
    """A second run of the same graph on the same machine (``rerun``: its data directory) wrote the
    same bytes in every output."""
    if rerun is None:
        return _na("rerun_identical", "outputs", "0 differ", "no rerun given (--rerun DIR)")
    a, b = output_digests(data), output_digests(rerun)
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return [Verdict("rerun_identical", "outputs", len(differ), "0 differ", not differ,
                    f"{len(a)} compared" + (": " + ", ".join(differ[:5]) if differ else ""))]


# ---------------------------------------------------------------------------------------------


def evaluate(data: Path | str, *, out_name: str = "pretrain", rerun: Path | str | None = None,
             ran: set[str] | None = None) -> list[Verdict]:
    """Every verdict on the outputs below ``data`` (``out_name``: pretraining's ``pretrain.out_name``).

    ``ran``: the stages a partial run ran (the matrix's ``--until``); a check whose stage
    (:data:`CHECK_STAGE`) is not among them reads n/a instead of failing on a missing output."""
    data = Path(data)
    report = _read(data / "models" / out_name / "eval.json")
    results = _read(data / "reports" / "results.json")
    tasks = list(results["tasks"]) if results else []
    checks: list[Callable[[], list[Verdict]]] = [
        lambda: mlm_uses_image(report), lambda: itm_beats_majority(report), lambda: tasks_beat_chance(results),
        lambda: decontamination_exact(data), lambda: start_is_the_export(data, tasks),
        lambda: rerun_identical(data, Path(rerun) if rerun is not None else None)]
    verdicts = [v for check in checks for v in check()]
    if ran is None:
        return verdicts
    return [v if v.check not in CHECK_STAGE or CHECK_STAGE[v.check] in ran
            else Verdict(v.check, v.subject, None, v.margin, None, f"not run here ({CHECK_STAGE[v.check]})")
            for v in verdicts]


def failed(verdicts: list[Verdict]) -> list[Verdict]:
    return [v for v in verdicts if v.passed is False]


def rig_stamp() -> dict[str, int]:
    """The rig's version: the generator's and the checks'."""
    return {"mini_world_version": MINI_WORLD_VERSION, "checks_version": CHECKS_VERSION}


def verdict_mark(passed: bool | None) -> str:
    return {True: "pass", False: "FAIL", None: "n/a"}[passed]


def checks_markdown(verdicts: list[Verdict], data: Path | str) -> str:
    stamp = rig_stamp()
    lines = [f"Checks on `{data}` (mini world v{stamp['mini_world_version']}, checks v{stamp['checks_version']}): "
             f"{sum(v.passed is True for v in verdicts)} pass, {len(failed(verdicts))} fail, "
             f"{sum(v.passed is None for v in verdicts)} not applicable.", "",
             "| check | subject | value | margin | verdict | detail |", "|---|---|---:|---|---|---|"]
    lines += [f"| {v.check} | {v.subject} | {'–' if v.value is None else v.value} | {v.margin} "
              f"| {verdict_mark(v.passed)} | {v.detail} |" for v in verdicts]
    return "\n".join(lines) + "\n"


def show_checks(args: Any, console: Any) -> int:
    """``report checks``: print every verdict; 1 when one fails, 0 otherwise."""
    from rich import box
    from rich.table import Table

    data = Path(args.dir)
    if not data.is_dir():
        console.print(f"[red]error:[/red] {data} is not a directory: run `dvc repro` first, or pass --dir")
        return 1
    verdicts = evaluate(data, out_name=args.out_name, rerun=args.rerun)
    stamp = rig_stamp()
    table = Table(title=f"Demo checks on {data} (mini world v{stamp['mini_world_version']}, "
                        f"checks v{stamp['checks_version']})", box=box.SIMPLE_HEAD)
    for column in ("check", "subject", "value", "margin", "verdict", "detail"):
        table.add_column(column, justify="right" if column == "value" else "left", overflow="fold",
                         no_wrap=column in ("check", "verdict"))
    for v in verdicts:
        table.add_row(v.check, v.subject, "–" if v.value is None else str(v.value), v.margin,
                      verdict_mark(v.passed), v.detail)
    console.print(table)
    if args.json:
        from pipeline.common.runinfo import atomic_write_json

        atomic_write_json(args.json, {**stamp, "data": str(data), "verdicts": [v.to_json() for v in verdicts]})
    bad = failed(verdicts)
    console.print(f"{len(bad)} of {sum(v.passed is not None for v in verdicts)} checks fail" if bad else
                  f"all {sum(v.passed is not None for v in verdicts)} applicable checks pass")
    return 1 if bad else 0


def add_checks_parser(sub: Any) -> None:
    p = sub.add_parser("checks", help="the demo's verdicts on a data directory (exit 1 if one fails)",
                       description="Evaluate every verdict of pipeline/report/checks.py on the outputs below "
                                   "--dir: value, margin, pass/fail. Exit status 1 when any fails.")
    p.add_argument("--dir", default="data", help="data directory (default: data)")
    p.add_argument("--out-name", default="pretrain", help="pretrain.out_name of the run (default: pretrain)")
    p.add_argument("--rerun", metavar="DIR", help="the data directory of a second run of the same graph on this "
                                                  "machine: every output must be byte-identical")
    p.add_argument("--json", metavar="PATH", help="also write the verdicts as JSON")
    p.set_defaults(func=show_checks)
