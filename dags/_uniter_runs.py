"""What an Airflow pretraining run needs beyond wiring: its run directory, its params file, and
running one stage exactly as DVC does (``python -m pipeline <stage> [ITEM] --params FILE``).

A run lives in ``<runs>/<run_name>/``, ``<runs>`` being ``$UNITER_RUNS_DIR`` or params.yaml's
``paths.runs``: ``params.yaml`` (the repo's params with the trigger's
choices applied and every artifact path moved inside the run), ``conf.json`` (the run's DAG
params: the trigger conf over the defaults), ``data/`` (every stage output) and, at the end,
``outputs.json`` (a digest per output).
Stages are idempotent and write atomically, so a retried task simply runs its stage again.

Kept free of Airflow imports so tests can use it directly; ``.airflowignore`` keeps the
dag-processor from parsing it as a DAG file.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from collections import deque
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Callable, Mapping

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
# The DAG drives the repository it lives in: its `pipeline` package must be importable in the
# Airflow processes even where the project is not pip-installed (stages themselves run as
# `python -m pipeline` with the repository as working directory).
if str(REPO_ROOT) not in sys.path:
    sys.path.append(str(REPO_ROOT))
RUN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# a `--set` key: a dotted params path (section.key[.subkey...]), never under `paths`: a run's
# data and run directories are the run's own (runs/<run_name>/data), an override may not move them
OVERRIDE_KEY_PATTERN = r"^(?!paths(\.|$))[a-z_][a-z0-9_]*(\.[A-Za-z0-9_+]+)*$"
FIXED_SECTIONS = ("paths",)
# Where runs live is the deployment's choice (this variable, else params.yaml's paths.runs), never
# the trigger's: a conf may not move a run's files (see OVERRIDE_KEY_PATTERN)
from pipeline.params.parser import RUNS_DIR_ENV  # noqa: E402  (one name for the DAG and `report results --exps`)
if TYPE_CHECKING:
    from pipeline.common.gpu_alloc import Allocation
PARAMS_FILE = "params.yaml"
# Airflow's cap on the tasks one mapped task expands to ([core] max_map_length)
MAX_MAP_LENGTH_ENV, DEFAULT_MAX_MAP_LENGTH = "AIRFLOW__CORE__MAX_MAP_LENGTH", "1024"
OUTPUTS_FILE = "outputs.json"

log = logging.getLogger(__name__)


class RunConflict(RuntimeError):
    """A run directory already holds a run with different params (retrying would mix outputs)."""


class StageFailed(RuntimeError):
    """``python -m pipeline <stage>`` exited non-zero; the message carries its last output lines."""


def repo_params(repo_root: Path = REPO_ROOT) -> dict[str, Any]:
    """The repository's ``params.yaml`` as a plain mapping (the defaults of every run)."""
    return yaml.safe_load((repo_root / PARAMS_FILE).read_text()) or {}


def parse_repo_params(repo_root: Path = REPO_ROOT) -> Any:
    """The repository's ``params.yaml``, parsed (``pipeline.params.parser.Params``; input paths unchecked)."""
    from pipeline.params.parser import parse_params

    return parse_params(repo_params(repo_root), source=str(repo_root / PARAMS_FILE), check_paths=False)


def conf_to_overrides(conf: Mapping[str, Any]) -> list[str]:
    """Translate the DAG's trigger conf into ``--set key=value`` assignments (values as JSON, which
    YAML reads back unchanged). Keys the conf leaves out or sets to null keep params.yaml's value."""
    direct = {
        "seed": "seed",
        "model_preset": "model.preset",
        "task_mix": "pretrain.mix_ratio",
        "pretrain_data": "pretrain.datasets",
        "masking": "pretrain.masking",
        "pretrain_steps": "pretrain.steps",
        "vcr_steps": "pretrain.vcr.steps",
        "finetune_tasks": "finetune.tasks",
    }
    unknown = sorted(set(conf) - set(direct) - {"run_name", "finetune_steps", "overrides"})
    if unknown:  # a misspelt choice would be ignored and the run would use the default
        raise ValueError(f"conf key(s) {unknown} unknown; expected run_name, {', '.join(sorted(direct))}, "
                         "finetune_steps or overrides")
    out = [f"{key}={json.dumps(conf[name])}" for name, key in direct.items() if conf.get(name) is not None]
    if conf.get("finetune_steps") is not None:
        tasks = conf.get("finetune_tasks") or repo_params()["finetune"]["tasks"]
        out += [f"finetune.per_task.{t}.steps={int(conf['finetune_steps'])}" for t in tasks]
    overrides = dict(conf.get("overrides") or {})
    for key in sorted(overrides):
        if not re.match(OVERRIDE_KEY_PATTERN, key):
            fixed = key.split(".")[0] in FIXED_SECTIONS
            raise ValueError(f"overrides.{key}: " + ("a run's paths are fixed (its data lives in runs/<run_name>/data)"
                                                     if fixed else f"expected a params key matching {OVERRIDE_KEY_PATTERN}"))
        value = overrides[key]
        if key == "mini_world.out_dir" or (key == "mini_world" and isinstance(value, Mapping) and "out_dir" in value):
            # relocate() moves the mini world and the sources below it together; a moved out_dir
            # would leave the sources reading the repository's data/raw/mini
            raise ValueError(f"overrides.{key}: a run's mini world lives in runs/<run_name>/data/raw/mini")
    out += [f"{key}={json.dumps(value)}" for key, value in sorted(overrides.items())]
    return out


def _rebase(path: str, old_root: str, new_root: str) -> str | None:
    """``path`` moved from below ``old_root`` to below ``new_root``; None when it is not below it."""
    p, old = PurePosixPath(path), PurePosixPath(old_root)
    if p == old or old in p.parents:
        return str(PurePosixPath(new_root) / p.relative_to(old))
    return None


def relocate(raw: dict[str, Any], run_data: str) -> dict[str, Any]:
    """Point every artifact path of ``raw`` inside ``run_data``: ``paths.data``,
    ``mini_world.out_dir`` (the run generates its own mini world) and each ``sources`` path below
    it. Real-world sources stay where they are. Returns ``raw`` (changed in place)."""
    old_data = str(raw["paths"]["data"])
    raw["paths"]["data"] = run_data
    old_mini = str(raw["mini_world"]["out_dir"])
    new_mini = _rebase(old_mini, old_data, run_data) or str(PurePosixPath(run_data) / "raw" / "mini")
    raw["mini_world"]["out_dir"] = new_mini
    for source in raw.get("sources", {}).values():
        for key, value in source.items():
            if isinstance(value, str) and (moved := _rebase(value, old_mini, new_mini)) is not None:
                source[key] = moved
    return raw


def run_name_for(conf: Mapping[str, Any], run_id: str) -> str:
    """The trigger's ``run_name``, or one derived from the Airflow run id (``manual__2026-...``)."""
    name = conf.get("run_name") or re.sub(r"[^A-Za-z0-9_.-]+", "-", run_id).strip("-.")[:64]
    if not re.match(RUN_NAME_PATTERN, name):
        raise ValueError(f"run name {name!r} does not match {RUN_NAME_PATTERN}")
    return name


def prepare_run(conf: Mapping[str, Any], run_id: str, repo_root: Path = REPO_ROOT) -> dict[str, Any]:
    """Create (or, on a retry, re-check) the run directory and its params file.

    Returns ``{run_name, run_dir, params, data, world, detector, datasets, image_sources, tasks}`` with paths
    relative to ``repo_root`` (stages run there). Raises ``pipeline.params.parser.ParamsError`` for a conf
    the strict params schema refuses, and :class:`RunConflict` when ``run_name`` already ran with
    other params.
    """
    from pipeline.params.parser import apply_override, parse_params

    raw = repo_params(repo_root)
    for assignment in conf_to_overrides(conf):
        apply_override(raw, assignment)
    name = run_name_for(conf, run_id)
    raw["paths"]["runs"] = os.environ.get(RUNS_DIR_ENV) or str(raw["paths"]["runs"])
    run_dir = PurePosixPath(str(raw["paths"]["runs"])) / name
    relocate(raw, str(run_dir / "data"))
    params = parse_params(raw, source=f"{run_dir}/{PARAMS_FILE} (from the trigger conf)")
    _check_deepspeed_outputs(raw["pretrain"].get("deepspeed") or {}, run_dir)
    mapped = len(params.extract.sources) * params.extract.parts if params.extract.parts > 1 else 0
    limit = int(os.environ.get(MAX_MAP_LENGTH_ENV, DEFAULT_MAX_MAP_LENGTH))
    if mapped > limit:  # Airflow would fail the mapping step after ingest had run
        raise ValueError(f"extract.parts: {params.extract.parts} parts x {len(params.extract.sources)} image sources "
                         f"= {mapped} mapped extract tasks, over Airflow's max_map_length {limit}; use at most "
                         f"{limit // len(params.extract.sources)} parts")
    text = yaml.safe_dump(raw, sort_keys=False)
    params_file = repo_root / run_dir / PARAMS_FILE
    if params_file.exists() and params_file.read_text() != text:
        raise RunConflict(f"{params_file} already holds a run with other params; choose another run_name")
    params_file.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(params_file, text)
    _write_atomic(params_file.with_name("conf.json"), json.dumps(dict(conf), indent=2, sort_keys=True) + "\n")
    return {
        "run_name": name,
        "run_dir": str(run_dir),
        "params": str(run_dir / PARAMS_FILE),
        "data": str(params.paths.data),
        "world": params.world,
        "detector": params.extract.detector,
        "datasets": list(params.ingest.datasets),
        "image_sources": list(params.extract.sources),
        "tasks": list(params.finetune.tasks),
        "gpus": gpus_per_stage(params),
    }


# DeepSpeed config keys that name a file or directory DeepSpeed writes (monitors, profiler)
_DEEPSPEED_OUTPUT_KEYS = ("output_path", "output_file")


def _check_deepspeed_outputs(section: Any, run_dir: PurePosixPath, prefix: str = "pretrain.deepspeed") -> None:
    """Raise ValueError for a DeepSpeed output path (``csv_monitor.output_path``, ...) outside the
    run's directory: a run writes only below ``runs/<run_name>/``."""
    if not isinstance(section, Mapping):
        return
    for key, value in section.items():
        dotted = f"{prefix}.{key}"
        if isinstance(value, Mapping):
            _check_deepspeed_outputs(value, run_dir, dotted)
        elif key in _DEEPSPEED_OUTPUT_KEYS and value not in (None, ""):
            path = PurePosixPath(str(value))
            if ".." in path.parts or not path.is_relative_to(run_dir):
                raise ValueError(f"overrides.{dotted}: {value!r} is outside the run; a run writes only below "
                                 f"{run_dir}/ (e.g. {run_dir}/data/metrics/deepspeed)")


def gpus_per_stage(params: Any) -> dict[str, int]:
    """The GPUs each GPU stage of a run uses on its host (what the task allocates): extraction one
    per ``extract.workers`` process, pretraining ``pretrain.world_size`` ranks, the rest one."""
    ranks = int(params.pretrain.world_size)
    return {"train_detector": 1, "extract": int(params.extract.workers), "pretrain": ranks,
            "pretrain_masking": ranks, "pretrain_vcr": ranks, "finetune": 1}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def stage_command(stage: str, item: str | None, params_file: str) -> list[str]:
    """The exact command DVC's dvc.yaml runs for ``stage[@item]``, with the run's params file."""
    return [sys.executable, "-m", "pipeline", stage, *([item] if item else []), "--params", params_file]


def run_stage(stage: str, item: str | None, params_file: str, *, repo_root: Path = REPO_ROOT,
              emit: Callable[[str], None] | None = None, tail_lines: int = 40,
              gpus: "Allocation | None" = None) -> None:
    """Run one stage as a child process in ``repo_root``, streaming its output to ``emit`` (the task
    log). A child process keeps torch/DeepSpeed/detectron2 state out of the Airflow worker.
    ``gpus``: the devices the task holds (``pipeline.common.gpu_alloc``): the stage sees only those, and
    inherits their locks so they stay taken while it lives.
    Raises :class:`StageFailed` with the last ``tail_lines`` lines when it exits non-zero."""
    emit = emit or log.info
    cmd = stage_command(stage, item, params_file)
    emit("$ " + " ".join(cmd))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DVC_NO_ANALYTICS": "1"}
    env.setdefault("PYTHONHASHSEED", "0")
    if gpus is not None:
        env = gpus.env(env)
    tail: deque[str] = deque(maxlen=tail_lines)
    with subprocess.Popen(cmd, cwd=repo_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="backslashreplace", pass_fds=gpus.fds if gpus else ()) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            emit(line)
    if proc.returncode != 0:
        where = f"{stage}@{item}" if item else stage
        raise StageFailed(f"stage {where} exited with {proc.returncode}; last lines:\n" + "\n".join(tail))


def cleaning_summary(data_dir: str, *, repo_root: Path = REPO_ROOT) -> str:
    """The cleaning table of a data dir, as ``python -m pipeline report cleaning --dir`` prints it,
    followed by where the per-dataset JSON/Markdown/HTML reports are."""
    cmd = [sys.executable, "-m", "pipeline", "report", "cleaning", "--dir", data_dir]
    env = {**os.environ, "COLUMNS": "160", "NO_COLOR": "1", "TERM": "dumb"}
    done = subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True)
    report_dir = (repo_root / data_dir / "reports" / "cleaning").resolve()
    pages = sorted(p.name for p in report_dir.glob("*.html"))
    return "\n".join([
        done.stdout.rstrip() or done.stderr.rstrip(),
        f"cleaning reports: {report_dir} ({', '.join(pages) or 'no HTML pages'})",
        f"summary metrics: {report_dir / 'summary.json'}",
    ])


def output_dirs(data_dir: Path) -> list[Path]:
    """The stage outputs below a data dir: files and directories two levels down
    (``manifests/coco.parquet``, ``features/coco``, ``db/img``, ``models/pretrain``, ...)."""
    outs = []
    for top in sorted(p for p in data_dir.iterdir() if p.is_dir() and p.name not in {"cache"}):
        outs += sorted(p for p in top.iterdir() if not p.name.startswith((".", "_run")) and "._run" not in p.name)
    return outs


def record_outputs(run: Mapping[str, Any], *, repo_root: Path = REPO_ROOT) -> dict[str, Any]:
    """Write ``outputs.json`` into the run dir: the run's params digest and a content digest per
    stage output (``_run.json`` files, which hold wall times, excluded). Returns the record."""
    from pipeline.params.parser import load_params
    from pipeline.common.runinfo import atomic_write_json, tree_digest

    data_dir = repo_root / run["data"]
    record = {
        "run_name": run["run_name"],
        "params": run["params"],
        "params_digest": load_params(repo_root / run["params"], check_paths=False).digest(),
        "outputs": {str(p.relative_to(repo_root / run["run_dir"])): tree_digest(p) for p in output_dirs(data_dir)},
    }
    atomic_write_json(repo_root / run["run_dir"] / OUTPUTS_FILE, record)
    return record
