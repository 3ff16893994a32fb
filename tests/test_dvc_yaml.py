"""dvc.yaml against the code it runs: every stage exists, its params keys exist, and its code deps
cover every project module the stage really imports (so editing code reruns the right stages).

Fast: DVC only parses dvc.yaml; nothing is reproduced here (tests/e2e does that).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest
import yaml

from pipeline.params.extract import IMAGE_SOURCES
from pipeline.params.finetune import TASKS
from pipeline.params.ingest import DATASETS
from pipeline.stages import STAGES

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "model")
# Plumbing every stage imports that does not change the bytes a stage writes: the params parser
# (its values are deps key by key), the stage registry and CLI, run records (only `_run.json`) and
# the ownership marker (it says which stage wrote a directory, never what the stage computed),
# progress display (bars or log lines) and how a process ends once its outputs are closed
# (os._exit instead of the interpreter's teardown).
PLUMBING = {
    "pipeline/__init__.py", "pipeline/__main__.py", "pipeline/params/parser.py", "pipeline/stages.py",
    "pipeline/common/runinfo.py", "pipeline/common/ownership.py", "pipeline/common/progress.py",
    "pipeline/common/exiting.py", "model/__init__.py",
    # malloc's settings in spawned children: where memory comes from, never a bit of an output
    "pipeline/common/malloc.py",
    # where a Hugging Face id's files lie in the local hub cache: the id is a params dep, the lookup
    # computes nothing (like the params parser that reads it)
    "pipeline/common/hf_cache.py",
    # how an anticipated error is reported (one line, its exit status): never a bit of an output
    "pipeline/common/failures.py",
}
PLUMBING_DIRS = ("pipeline/params/",)


def docstring_only(path: str) -> bool:
    """A package ``__init__.py`` that only says what its folder owns computes nothing: not a dep."""
    import ast

    body = ast.parse((ROOT / path).read_text()).body
    return path.endswith("/__init__.py") and len(body) == 1 and isinstance(body[0], ast.Expr) \
        and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)


@cache
def dvc_stages() -> dict[str, dict]:
    """{stage address: {cmd, deps (paths), params (keys), outs}} as DVC itself resolves dvc.yaml."""
    from dvc.repo import Repo

    out = {}
    with Repo(str(ROOT)) as repo:
        for stage in repo.index.stages:
            deps, params = [], []
            for dep in stage.deps:
                if hasattr(dep, "params") and dep.params is not None and dep.def_path.endswith(".yaml"):
                    params += list(dep.params)
                else:
                    deps.append(dep.def_path)
            out[stage.name] = {"cmd": stage.cmd, "deps": deps, "params": params,
                                     "outs": [o.def_path for o in stage.outs]}
    return out


# stages that only redraw their input files: no params change what they write
PARAMLESS_STAGES = {"plots"}


def expected_stage_names() -> set[str]:
    return (
        {"mini_world", "decontaminate", "train_detector", "build_dbs", "pretrain", "pretrain_masking", "pretrain_vcr",
         "plots", "results", "ablations"}
        | {f"ingest@{d}" for d in DATASETS}
        | {f"extract@{s}" for s in IMAGE_SOURCES}
        | {f"finetune@{t}" for t in TASKS}
    )


def module_file(name: str) -> Path | None:
    """The project file of a dotted module name, or None when it is not a project module."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path) -> set[str]:
    """Dotted names imported anywhere in ``path`` (lazy imports inside functions included)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name == "__init__.py":
        package = package.rsplit(".", 1)[0] + "._"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level)[0]
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            names.add(mod)
            # `from pkg import submodule` imports the submodule too
            names.update(f"{mod}.{alias.name}" for alias in node.names)
    return names


def project_closure(roots: list[str]) -> set[str]:
    """Repo-relative paths of every project module reachable from ``roots`` by imports."""
    seen: set[Path] = set()
    todo = [f for f in (module_file(r) for r in roots) if f is not None]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path):
            parts = name.split(".")
            # importing a.b.c runs a/__init__ and a/b/__init__ as well
            for i in range(1, len(parts) + 1):
                f = module_file(".".join(parts[:i]))
                if f is not None and f not in seen:
                    todo.append(f)
    return {str(p.relative_to(ROOT)) for p in seen}


def stage_roots(address: str) -> list[str]:
    name, _, item = address.partition("@")
    roots = [STAGES[name].entry.split(":")[0]]
    if name == "ingest":
        roots.append(f"pipeline.ingest.sources.{item}")  # pipeline.ingest.sources.load_reader imports it by name
    return roots


def test_every_stage_of_the_design_is_declared_with_its_cli_command():
    stages = dvc_stages()
    assert set(stages) == expected_stage_names()
    for address, stage in stages.items():
        name, _, item = address.partition("@")
        assert stage["cmd"] == f"python -m pipeline {name}" + (f" {item}" if item else ""), address


def test_params_are_listed_key_by_key_and_exist_in_params_yaml():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    for address, stage in dvc_stages().items():
        assert stage["params"] or address in PARAMLESS_STAGES, f"{address} lists no params"
        for key in stage["params"]:
            node = raw
            for part in key.split("."):
                assert isinstance(node, dict) and part in node, f"{address}: params key {key} is not in params.yaml"
                node = node[part]
            # a whole top-level section would rerun the stage for keys it never reads
            assert "." in key or not isinstance(node, dict), f"{address}: list {key}'s keys, not the section"


# params.yaml keys no stage lists, and why: where things go, or how fast they run, not what they hold.
NOT_DEPS = {
    "world": "chooses sources; the sources paths themselves are deps",
    "paths.data": "location (Airflow runs move it); DVC outputs are data/",
    "paths.runs": "Airflow run directories",
    "mini_world.out_dir": "location; interpolated into the outs and deps",
    "extract.sources": "which extract@ITEM stages exist is fixed in dvc.yaml",
    "extract.device": "execution: same model, another device",
    "extract.workers": "execution: processes sharing the shards",
    "extract.parts": "execution: tasks sharing the shards, merged into the same bytes",
    "decontaminate.workers": "execution: processes hashing images",
    "sources.download.command": "download@cc|sbu (world: real) is not a DVC stage: its images are ingest's deps",
    "sources.download.processes": "download@cc|sbu (world: real) is not a DVC stage: its images are ingest's deps",
    "sources.download.threads": "download@cc|sbu (world: real) is not a DVC stage: its images are ingest's deps",
    "sources.download.timeout_s": "download@cc|sbu (world: real) is not a DVC stage: its images are ingest's deps",
    "sources.download.retries": "download@cc|sbu (world: real) is not a DVC stage: its images are ingest's deps",
    "sources.download.samples_per_shard": "download@cc|sbu (world: real) is not a DVC stage: its images are ingest's deps",
    "pretrain.hostfile": "execution: where the ranks run",
    "pretrain.master_port": "execution",
    "pretrain.num_workers": "execution: DataLoader processes",
    "pretrain.device": "execution",
    "pretrain.keep_checkpoints": "execution: resume points, removed when the stage ends",
    "pretrain.out_name": "location; interpolated into the outs and deps",
    "finetune.keep_checkpoints": "execution: resume points, removed when the stage ends",
    "finetune.device": "execution",
}


def leaf_keys(node, prefix=""):
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from leaf_keys(value, dotted + ".")
        else:
            yield dotted


def test_every_params_key_is_a_dep_of_some_stage_or_known_not_to_change_outputs():
    listed = {key for stage in dvc_stages().values() for key in stage["params"]}
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    orphans = [k for k in leaf_keys(raw)
               if k not in NOT_DEPS and not any(k == p or k.startswith(p + ".") for p in listed)]
    assert not orphans, f"params.yaml keys that no dvc.yaml stage lists: {orphans}"


def test_outputs_do_not_overlap_and_live_under_data():
    outs = [(o, a) for a, s in dvc_stages().items() for o in s["outs"]]
    for out, address in outs:
        assert out.startswith("data/"), f"{address} writes outside data/: {out}"
    paths = sorted(o for o, _ in outs)
    for a, b in zip(paths, paths[1:]):
        assert not b.startswith(a.rstrip("/") + "/") and a != b, f"overlapping outputs {a} and {b}"


@pytest.mark.parametrize("address", sorted(expected_stage_names()))
def test_code_deps_cover_the_modules_the_stage_imports(address):
    roots = stage_roots(address)
    if module_file(roots[0]) is None:
        pytest.skip(f"{roots[0]} is not written yet")
    stage = dvc_stages()[address]
    code_deps = [d for d in stage["deps"] if d.split("/")[0] in PACKAGES]
    for dep in code_deps:
        assert (ROOT / dep).exists(), f"{address} depends on {dep}, which does not exist"
    needed = {f for f in project_closure(roots)
              if f not in PLUMBING and not f.startswith(PLUMBING_DIRS) and not docstring_only(f)}

    def covers(dep: str, f: str) -> bool:
        return f == dep or f.startswith(dep.rstrip("/") + "/")

    missing = sorted(f for f in needed if not any(covers(d, f) for d in code_deps))
    assert not missing, f"{address} imports {missing} but dvc.yaml does not list them as deps"
    unused = sorted(d for d in code_deps if not any(covers(d, f) for f in needed))
    assert not unused, f"{address} lists code deps {unused} that it never imports (needless reruns)"


def test_plots_declare_every_training_curve_as_the_generator_writes_them():
    """dvc.yaml's `plots:` is pipeline.report.dvc_plots' block: every plot titled with both axes
    labelled, each fine-tuning task's metrics with both starts, train and val, on one plot."""
    from pipeline.report.dvc_plots import ablation_plots, plots

    declared = yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]
    assert declared == plots(), "regenerate with `python -m pipeline.report.dvc_plots`"
    by_name = {name: spec for entry in declared for name, spec in entry.items()}
    assert all({"title", "x_label", "y_label", "x", "y"} <= set(spec) for spec in by_name.values())
    for task in TASKS:
        files = by_name[f"{task}: loss"]["y"]
        assert {f.split("/")[3] for f in files} == {"pretrained", "scratch"}, files
        accuracy = next(spec for name, spec in by_name.items() if name.startswith(f"{task}: ") and
                        name.endswith(("accuracy", "vqa_score")))
        assert len(accuracy["y"]) == 4  # two starts x (train, val)
    assert {name.split(":")[0] for name in by_name} == {"pretrain", "pretrain_vcr", *TASKS}
    ablations = yaml.safe_load((ROOT / "ablations/dvc.yaml").read_text())["plots"]
    assert ablations == ablation_plots(), "regenerate with `python -m pipeline.report.dvc_plots --ablations`"


def test_dvc_resolves_the_plots(tmp_path):
    """DVC itself reads the block: ids, interpolated paths, properties (no files needed)."""
    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        defs = {name: spec for dvcfile in repo.index._plots.values() for entry in dvcfile for name, spec in entry.items()}
    assert "pretrain: mlm/mlm_acc" in defs and "vqa: vqa/vqa_score" in defs
    assert "data/metrics/pretrain/plots/metrics/val/mlm/mlm_acc.tsv" in defs["pretrain: mlm/mlm_acc"]["y"]
    ablation = "../data/metrics/pretrain_masking_ablation/plots/metrics/val/mlm/mlm_acc.tsv"
    assert ablation in defs["pretrain_masking: mlm/mlm_acc"]["y"]
